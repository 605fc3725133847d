"""The fenced code blocks of a Markdown page, as recipes a test runs in order.

A block is ```` ```sh ````/```` ```bash ```` (run by bash, stopping at the first failing command)
or ```` ```python ```` (run by this interpreter); any other language is text.  An HTML comment
right after a block, ``<!-- output: TEXT -->``, is a line its output must contain; one right
before it, ``<!-- not run: REASON -->``, leaves it out, saying why (what the test machine lacks).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

RUN = {"sh": "bash", "bash": "bash", "python": "python"}
_FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```[ \t]*$", re.M | re.S)
_BEFORE = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*$", re.S)
_AFTER = re.compile(r"^\s*<!--\s*output:\s*(.+?)\s*-->")


@dataclass
class Block:
    lang: str
    code: str
    line: int
    outputs: list[str] = field(default_factory=list)
    skip: str | None = None

    @property
    def runs(self) -> bool:
        return self.lang in RUN and self.skip is None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` with its directives."""
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        b = Block(m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1)
        skip = _BEFORE.search(text[: m.start()].rstrip("\n").rsplit("\n\n", 1)[-1])
        b.skip = skip.group(1) if skip else None
        rest = text[m.end():]
        while True:
            after = _AFTER.match(rest)
            if not after:
                break
            b.outputs.append(after.group(1))
            rest = rest[after.end():]
        out.append(b)
    return out


def run(block: Block, cwd: Path, timeout: float = 300.0) -> str:
    """Run one block in ``cwd`` with this interpreter's scripts first on PATH; its output, or an
    AssertionError naming the block's line with what it printed."""
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
    cmd = ["bash", "-euo", "pipefail", "-c", block.code] if RUN[block.lang] == "bash" else [sys.executable, "-c", block.code]
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    printed = done.stdout + done.stderr
    if done.returncode != 0:
        raise AssertionError(f"the block at line {block.line} exited with {done.returncode}:\n{block.code}\n{printed}")
    for want in block.outputs:
        if want not in printed:
            raise AssertionError(f"the block at line {block.line} did not print {want!r}:\n{printed}")
    return printed
