"""The compiled replies are bound only when loaded before pyfuse3 (`shufflefs.replies`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shufflefs import replies

pytestmark = pytest.mark.skipif(replies.compiled is None, reason="compiled replies not built")


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_the_daemon_package_loads_them_before_pyfuse3():
    assert run("import shufflefs.fs.fuse_ops, shufflefs.replies as r; print(r.bound)") == "True"


def test_loaded_after_pyfuse3_they_stay_out_of_the_way():
    code = ("import pyfuse3, shufflefs.replies as r; from shufflefs.serve.replies import Replies; "
            "print(r.bound, Replies(True, 0).describe()['state'])")
    assert run(code) == "False unbound"


def test_reply_threads_are_started_once_and_stopped():
    code = ("import shufflefs.replies as r; r.compiled.start(2); s = r.compiled.stats()['threads']; "
            "r.compiled.stop(); print(s, r.compiled.stats()['threads'])")
    assert run(code) == "2 0"
