"""Run every recipe of a documentation page in order, in one directory, and tear its mounts down."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, shufflefs_mounts
from tests.docs.recipes import Block, blocks, run


def run_page(page: Path, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300.0) -> list[str]:
    """What each block that runs printed, in order; every mount under ``cwd`` is unmounted after,
    whether the blocks passed or not. ``env`` adds variables for the page's blocks."""
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in (env or {}).items():
                mp.setenv(k, v)
            return [run(b, cwd, timeout) for b in blocks(page) if b.runs]
    finally:
        for mnt in shufflefs_mounts():
            if mnt.startswith(str(cwd) + os.sep):
                subprocess.run(["fusermount3", "-u", "-z", mnt], capture_output=True, timeout=30)


def unmarked(page: Path) -> list[Block]:
    """Blocks of a shell or Python language that neither run nor say why not: none may exist,
    and a command block without a language is one too."""
    return [b for b in blocks(page) if b.lang == "" or (b.lang in ("sh", "bash", "python") and not b.runs and not b.skip)]


def link_examples(cwd: Path) -> None:
    """The recipes run from a checkout: ``examples/`` is where the README says it is."""
    (cwd / "examples").symlink_to(REPO / "examples")
