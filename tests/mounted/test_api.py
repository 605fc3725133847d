"""Level: mounted (real FUSE mounts through the Python API).

`shufflefs.mount`: the handle mounts, sets epochs and resume states, reads the stats and unmounts
(on leaving a ``with`` block, also one that raised, and at interpreter exit); bad options raise
the command line's messages before anything is mounted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from conftest import REPO, is_mounted, process_gone, shufflefs_mounts, wait_for, write_tree

import shufflefs
from shufflefs.fs import control

N = 2000
OPTS: dict[str, Any] = {"block_size": "4KiB", "buffer": 16 << 10, "seed": 3}
TIMEOUT = 90


def lines(n: int = N) -> str:
    return "".join(json.dumps({"id": i, "pad": "x" * (i % 13)}) + "\n" for i in range(n))


def ids(data: bytes) -> list[int]:
    return [json.loads(line)["id"] for line in data.splitlines()]


def _leftovers(mnt: Path, pid: int | None) -> None:
    """Whatever a failing test left: unmounted and ended (never a pass criterion)."""
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True, timeout=30)
    if pid is not None and not process_gone(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[tuple[Path, Path, Path]]:
    """(source, mount point, cache dir); nothing mounted on the mount point survives the test."""
    src = write_tree(tmp_path / "src", {"a.jsonl": lines(), "d/b.jsonl": lines(300)})
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    yield src, mnt, tmp_path / "cache"
    _leftovers(mnt, None)


@pytest.fixture
def mounted(tree: tuple[Path, Path, Path]) -> Iterator[Callable[..., shufflefs.Mount]]:
    """``mounted(**options)``: `shufflefs.mount` of the test tree; unmounted in the end whatever happens."""
    src, mnt, cache = tree
    handles: list[shufflefs.Mount] = []

    def make(**options: Any) -> shufflefs.Mount:
        m = shufflefs.mount(src, mnt, cache_dir=cache, **{**OPTS, **options})
        handles.append(m)
        return m

    try:
        yield make
    finally:
        for m in handles:
            try:
                m.unmount(lazy=True)
            finally:
                _leftovers(mnt, m.pid)


def test_the_context_manager_mounts_and_unmounts_and_the_daemon_exits(tree):
    """Holds: SEMANTICS.md#umount-api"""
    src, mnt, cache = tree
    with shufflefs.mount(src, mnt, cache_dir=cache, **OPTS) as m:
        assert m.mountpoint == mnt and m.mounted and is_mounted(mnt)
        assert control.daemon_pid(str(mnt)) == m.pid
        assert os.getppid() != m.pid and os.getsid(m.pid) == m.pid  # its own session, as the CLI's
        got = ids((mnt / "a.jsonl").read_bytes())
        assert sorted(got) == list(range(N)) and got != list(range(N))
    assert not is_mounted(mnt) and not m.mounted
    wait_for(lambda: process_gone(m.pid), "the daemon to exit", 5)
    m.unmount()  # idempotent
    assert list(mnt.iterdir()) == []


def test_the_same_daemon_and_settings_as_the_command_line(mounted, tree, tmp_path):
    """Holds: SEMANTICS.md#umount-api"""
    src, _, cache = tree
    m = mounted(strategy="corgipile", rank=1, world_size=2, epoch=4)
    api = m.stat()
    mnt2 = tmp_path / "cli"
    mnt2.mkdir()
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(src), str(mnt2), "--cache-dir", str(cache),
                        "--block-size", "4KiB", "--buffer", "16KiB", "--seed", "3", "--strategy", "corgipile",
                        "--rank", "1", "--world-size", "2", "--epoch", "4"], capture_output=True, text=True,
                       timeout=TIMEOUT, cwd=REPO)
    try:
        assert r.returncode == 0, r.stderr
        cli = json.loads(os.getxattr(mnt2, "user.shufflefs.stats"))
        assert (m.mountpoint / "a.jsonl").read_bytes() == (mnt2 / "a.jsonl").read_bytes()
    finally:
        subprocess.run([sys.executable, "-m", "shufflefs", "umount", str(mnt2)], capture_output=True, timeout=TIMEOUT,
                       cwd=REPO)
        _leftovers(mnt2, None)
    for key in ("strategy", "seed", "block_size", "buffer", "rank", "world", "epoch"):
        assert api[key] == cli[key], key
    assert (api["strategy"], api["rank"], api["world"], api["epoch"], m.epoch) == ("corgipile", 1, 2, 4, 4)
    assert api["pid"] == m.pid


def test_set_epoch_changes_the_order(mounted):
    m = mounted()
    first = (m.mountpoint / "a.jsonl").read_bytes()
    assert m.epoch == 0
    m.set_epoch(7)
    assert m.epoch == 7 and os.getxattr(m.mountpoint / "a.jsonl", "user.shufflefs.epoch") == b"7"
    seventh = (m.mountpoint / "a.jsonl").read_bytes()
    assert seventh != first and sorted(ids(seventh)) == list(range(N))
    m.epoch = 0
    assert (m.mountpoint / "a.jsonl").read_bytes() == first
    for bad in (-1, 2**31, 1.0, "3", True):
        with pytest.raises(ValueError, match="not an epoch"):
            m.set_epoch(bad)
    assert m.epoch == 0
    assert m.stat()["epoch"] == 0


def test_resume_takes_a_dict_json_or_a_file(mounted, tmp_path):
    m = mounted()
    m.set_epoch(2)
    whole = (m.mountpoint / "a.jsonl").read_bytes().splitlines(keepends=True)
    state = {"epoch": 2, "views": {"a.jsonl": [{"world_size": 1, "parts": 1, "consumed": [[100]]}]}}
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    for given in (state, json.dumps(state), json.dumps(state).encode(), path, str(path)):
        m.set_epoch(0)
        assert m.resume(given) == 2
        assert (m.mountpoint / "a.jsonl").read_bytes() == b"".join(whole[100:]), type(given)
        assert m.stat()["resume"]["epoch"] == 2
    assert m.resume(state, epoch=2) == 2
    with pytest.raises(ValueError, match="a state of epoch 2, not 3"):
        m.resume(state, epoch=3)
    with pytest.raises(ValueError, match="not a file of"):
        m.resume({"epoch": 2, "views": {"missing.jsonl": [{"world_size": 1, "parts": 1, "consumed": [[1]]}]}})
    with pytest.raises(ValueError, match="cannot read the resume state"):
        m.resume(tmp_path / "nothing.json")
    with pytest.raises(TypeError):
        m.resume(12)  # type: ignore[arg-type]


def _cli_error(src: Path, mnt: Path, *args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(src), str(mnt), *args], capture_output=True,
                       text=True, timeout=TIMEOUT, cwd=REPO)
    assert r.returncode == 2, r.stderr
    return r.stderr.splitlines()[0].removeprefix("shufflefs mount: error: ")


@pytest.mark.parametrize("options, args", [
    ({"seed": -1}, ["--seed=-1"]),
    ({"block_size": "12XB"}, ["--block-size", "12XB"]),
    ({"buffer": "0.001%"}, ["--buffer", "0.001%"]),
    ({"strategy": "nope"}, ["--strategy", "nope"]),
    ({"rank": 2, "world_size": 2}, ["--rank", "2", "--world-size", "2"]),
    ({"stage_dir": "/tmp/x"}, ["--stage-dir", "/tmp/x"]),
    ({"verify": "all"}, ["--verify", "all"]),
])
def test_bad_options_raise_the_command_lines_message_before_any_mount(tree, options, args):
    """Holds: SEMANTICS.md#umount-api"""
    src, mnt, cache = tree
    with pytest.raises(ValueError) as e:
        shufflefs.mount(src, mnt, cache_dir=cache, **options)
    assert str(e.value) == _cli_error(src, mnt, "--cache-dir", str(cache), *args)
    assert not is_mounted(mnt)


def test_unknown_keywords_and_flags_that_are_no_bools_raise_before_any_mount(tree):
    """Holds: SEMANTICS.md#umount-api"""
    src, mnt, cache = tree
    with pytest.raises(TypeError, match="unexpected keyword argument 'sed'"):
        shufflefs.mount(src, mnt, sed=3)
    for key in ("foreground", "ready_fd", "help"):
        with pytest.raises(TypeError):
            shufflefs.mount(src, mnt, **{key: True})
    with pytest.raises(ValueError, match="argument --direct-io: must be true or false: 'yes'"):
        shufflefs.mount(src, mnt, direct_io="yes")
    (mnt / "file").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        shufflefs.mount(src, mnt, cache_dir=cache)
    with pytest.raises(ValueError):
        shufflefs.mount(src / "missing", mnt, cache_dir=cache)
    assert not [m for m in shufflefs_mounts() if m.startswith(str(mnt.parent))]  # other tests' mounts may come and go


def test_an_exception_in_the_block_leaves_no_mount_and_no_daemon(tree):
    """Holds: SEMANTICS.md#umount-api"""
    src, mnt, cache = tree
    pid = None
    with pytest.raises(RuntimeError, match="training failed"):
        with shufflefs.mount(src, mnt, cache_dir=cache, **OPTS) as m:
            pid = m.pid
            f = open(mnt / "a.jsonl", "rb")  # still open when the block raises: a busy mount
            f.readline()
            raise RuntimeError("training failed")
    try:
        assert not is_mounted(mnt)
        f.close()  # the lazily detached daemon exits once the last file is closed
        wait_for(lambda: process_gone(pid), "the daemon to exit", 10)
    finally:
        f.close()
        _leftovers(mnt, pid)


SCRIPT = textwrap.dedent("""
    import os, sys, shufflefs
    m = shufflefs.mount(sys.argv[1], sys.argv[2], cache_dir=sys.argv[3], block_size="4KiB")
    print(m.pid, flush=True)
    open(os.path.join(sys.argv[2], "a.jsonl"), "rb").read()
    if sys.argv[4] == "raise":
        raise SystemExit("the script failed")
    if sys.argv[4] == "kill":
        os.kill(os.getpid(), 9)
""")


def _script(tree: tuple[Path, Path, Path], how: str) -> tuple[subprocess.CompletedProcess, int]:
    src, mnt, cache = tree
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(src), str(mnt), str(cache), how], capture_output=True,
                       text=True, timeout=TIMEOUT, env=env)
    return r, int(r.stdout.split()[0])


@pytest.mark.parametrize("how", ["end", "raise"])
def test_a_script_that_ends_without_unmounting_unmounts_at_exit(tree, how):
    """Holds: SEMANTICS.md#umount-api"""
    r, pid = _script(tree, how)
    try:
        assert r.returncode == (0 if how == "end" else 1), r.stderr
        assert not is_mounted(tree[1])
        wait_for(lambda: process_gone(pid), "the daemon to exit", 10)
    finally:
        _leftovers(tree[1], pid)


def test_a_killed_script_leaves_no_mount_behind(tree):
    """SIGKILL runs no exit handler: the daemon sees its script gone and unmounts as on SIGTERM.

    Holds: SEMANTICS.md#umount-api"""
    r, pid = _script(tree, "kill")
    mnt = tree[1]
    try:
        assert r.returncode == -signal.SIGKILL
        wait_for(lambda: not is_mounted(mnt), "the mount to go", 20)
        wait_for(lambda: process_gone(pid), "the daemon to exit", 10)
        assert control.daemon_pid(str(mnt)) is None  # its pid file removed: a clean exit
        assert list(mnt.iterdir()) == []
    finally:
        _leftovers(mnt, pid)


def test_a_daemon_started_for_a_process_that_is_gone_ends(tree):
    """``--owner-pid`` of a process that has already exited: the daemon does not stay mounted."""
    src, mnt, cache = tree
    gone = subprocess.Popen(["true"])
    gone.wait()
    r = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(src), str(mnt), "--cache-dir", str(cache),
                        f"--owner-pid={gone.pid}"], capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    try:
        wait_for(lambda: not is_mounted(mnt), "the mount to go", 20)
    finally:
        _leftovers(mnt, control.daemon_pid(str(mnt)))


def test_the_function_survives_importing_the_daemon_package():
    import shufflefs.fs.daemon  # noqa: F401

    assert callable(shufflefs.mount) and shufflefs.mount.__module__ == "shufflefs"
    from shufflefs import Mount, MountError, mount

    assert mount is shufflefs.mount and Mount.__name__ == "Mount" and issubclass(MountError, RuntimeError)


def test_keywords_become_the_commands_arguments(tmp_path):
    from shufflefs.api import mount_argv

    argv = mount_argv("src", tmp_path / "mnt", {"block_size": 65536, "buffer": "10%", "direct_io": True,
                                                "no_pool": False, "verbose": 2, "format": ["*.bin=fixed:record_size=8"],
                                                "pool": "shards/*.tfrecord", "cache_dir": tmp_path / "c", "seed": None})
    assert argv == ["mount", os.path.abspath("src"), str(tmp_path / "mnt"), "--block-size=65536", "--buffer=10%",
                    "--direct-io", "--verbose", "--verbose", "--format=*.bin=fixed:record_size=8",
                    "--pool=shards/*.tfrecord", f"--cache-dir={tmp_path / 'c'}"]
    assert mount_argv("s3://bucket/prefix", "m", {})[1] == "s3://bucket/prefix"  # a URL is no path
