"""Level: mounted (real FUSE mounts, real readers).

A member of a pool changed while mounted, and the shards opened again at once: every shard of
the pool, and of a mixture over the same files, shows the new version (the changed record there,
the old one gone) with no error, in both serving modes.  Each shard's views were opened and read
before the change, so the kernel holds their names and pages and the daemon their idle views and
windows: a new open must still not be served from them.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import Callable

import pytest

from shufflefs.pools.lookup import STAMP_TTL

MEMBERS = 3
RECORDS = 300
NAMES = [f"pool/part-{i:05d}-of-{MEMBERS:05d}.jsonl" for i in range(MEMBERS)]
CHANGED = NAMES[-1]
"""The member changed: the last, so the shards before it are opened before its own name is
looked up again (a lookup of the changed file itself sees its new attributes)."""
ARGS = ["--seed", "3", "--block-size", "1KiB", "--buffer", "4KiB"]
MIX = '[[mix]]\nname = "blend"\nshards = 1\n[[mix.source]]\nglob = "pool/*.jsonl"\nweight = 1\n'
"""One mixture shard: with the pool's three, every view stays idle (`serve.views.IDLE_VIEWS`), its
windows in memory and its pages in the kernel's cache."""


def member(i: int) -> bytes:
    return b"".join(b'{"m": %d, "j": %d, "v": "old"}\n' % (i, j) for j in range(RECORDS))


def in_place(path: Path, old: bytes, new: bytes) -> None:
    """The one record rewritten in place (same size), the mtime set back: only the ctime tells."""
    st = os.stat(path)
    at = path.read_bytes().index(old)
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def by_rename(path: Path, old: bytes, new: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(path.read_bytes().replace(old, new))
    os.replace(tmp, path)


def appended(path: Path, old: bytes, new: bytes) -> None:
    with open(path, "ab") as f:
        f.write(new)


CHANGES: dict[str, Callable[[Path, bytes, bytes], None]] = {"in-place": in_place, "rename": by_rename,
                                                            "append": appended}


def shards(mnt: Path) -> list[Path]:
    """Every shard of the pool and of the mixture over it, in name order."""
    return [mnt / n for n in NAMES] + [mnt / ".mix" / "blend" / n for n in sorted(os.listdir(mnt / ".mix" / "blend"))]


def read_all(paths: list[Path]) -> tuple[list[bytes], list[str]]:
    """Each shard's bytes (b"" where it failed), and the errors."""
    out, errors = [], []
    for p in paths:
        try:
            with open(p, "rb") as f:
                out.append(f.read())
        except OSError as e:
            out.append(b"")
            errors.append(f"{p.name}: {e}")
    return out, errors


@pytest.mark.parametrize("serving", ["page-cache", "direct-io"])
@pytest.mark.parametrize("change", CHANGES)
def test_shards_opened_right_after_a_member_changed_show_the_new_version(mount, tmp_path, serving, change):
    """Holds: SEMANTICS.md#changes-new-open, SEMANTICS.md#changes-pool"""
    cfg = tmp_path / "mix.toml"
    cfg.write_text(MIX)
    args = [*ARGS, "--config", str(cfg)] + (["--direct-io"] if serving == "direct-io" else [])
    m = mount({n: member(i) for i, n in enumerate(NAMES)}, *args)
    paths = shards(m.mnt)
    for _ in range(2):  # names, pages, idle views and windows of the old version everywhere
        before, errors = read_all(paths)
        assert not errors
    # a record of the changed member that the first shard shows: opened before the member's name
    old = next(line for line in before[0].splitlines(keepends=True) if line.startswith(b'{"m": %d,' % (MEMBERS - 1)))
    new = old.replace(b"old", b"new") if change != "append" else b'{"m": %d, "j": 999, "v": "new"}\n' % (MEMBERS - 1)
    time.sleep(STAMP_TTL + 0.1)  # then every lookup reads the members' versions again, and
    for p in paths:  # the daemon may answer the next ones from what it read now
        os.stat(p)
    CHANGES[change](m.src / CHANGED, old, new)
    after, errors = read_all(paths)  # at once: no sleep
    assert not errors, errors
    for what, got in (("pool", after[:MEMBERS]), ("mixture", after[MEMBERS:])):
        records = collections.Counter(b"".join(got).splitlines(keepends=True))
        assert records[new] == 1, f"{what}: the new record is missing after {change} ({serving})"
        assert records[old] == (change == "append"), f"{what}: the old record is served ({serving})"
        assert sum(records.values()) == MEMBERS * RECORDS + (change == "append"), what
    fresh = mount(None, *args, src=m.src)  # the new version as a mount that never saw the old one
    assert after == read_all(shards(fresh.mnt))[0]
