"""Level: mounted (real FUSE mounts, read by a second user).

A mount made by root with ``--allow-other`` is read by another user (``nobody``, through a child
process that drops to that uid): the kernel checks every access against the source's modes, so
the other user reads, and learns the errors and attributes of, only what they could read in the
source; epochs and resume states are set by the mount's owner and root only, unless
``--epoch-setters any``; a state given as ``@PATH`` is never read on another user's behalf."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import Mounter, write_tree
from shufflefs.cli.mount import user_allow_other
from shufflefs.cli.stat import format_stats

NOBODY, NOGROUP = 65534, 65534
LINES = b"".join(b'{"id": %05d, "pad": "%s"}\n' % (i, b"x" * (i % 17)) for i in range(2000))
BAD_CSV = b'a,b\n1,"never closed\n2,3\n'
ARGS = ["--block-size", "4KiB", "--buffer", "16KiB", "--seed", "5", "--allow-other"]
EPOCH, RESUME, ERROR, STATS = ("user.shufflefs." + n for n in ("epoch", "resume", "error", "stats"))

CHILD = r"""
import json, os, sys
out = []
for op, *a in json.loads(sys.argv[1]):
    try:
        if op == "read":
            with open(a[0], "rb") as f:
                v = f.read().decode("utf-8", "replace")
        elif op == "listdir":
            v = sorted(os.listdir(a[0]))
        elif op == "getxattr":
            v = os.getxattr(a[0], a[1]).decode("utf-8", "replace")
        elif op == "setxattr":
            v = os.setxattr(a[0], a[1], a[2].encode())
        out.append({"ok": v})
    except OSError as e:
        out.append({"errno": e.errno})
print(json.dumps(out))
"""


def _drop() -> None:
    os.setgroups([])
    os.setgid(NOGROUP)
    os.setuid(NOBODY)


def _interpreter() -> str | None:
    """A Python the other user may run (this one may live in root's home)."""
    for exe in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            r = subprocess.run([exe, "-c", "pass"], preexec_fn=_drop, capture_output=True, timeout=30)
        except OSError:  # not there, or not theirs to run
            continue
        if r.returncode == 0:
            return exe
    return None


@pytest.fixture(scope="module")
def as_nobody():
    if os.geteuid() != 0:
        pytest.skip("needs root to mount for, and act as, another user")
    exe = _interpreter()
    if exe is None:
        pytest.skip("no Python the user nobody may run")

    def run(*ops: tuple) -> list:
        """Each op as ``nobody``: its value, or its errno (``{"errno": n}``)."""
        r = subprocess.run([exe, "-c", CHILD, json.dumps(ops)], preexec_fn=_drop, capture_output=True, text=True,
                           timeout=60, cwd="/", stdin=subprocess.DEVNULL)
        assert r.returncode == 0, r.stderr
        return [x.get("ok") if "ok" in x else x for x in json.loads(r.stdout)]

    return run


@pytest.fixture
def shared():
    """Mounts under a directory every user may enter (pytest's own is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="shufflefs-shared-", dir="/tmp"))
    os.chmod(base, 0o755)
    m = Mounter(base)
    try:
        yield m
    finally:
        try:
            m.stop_all()
        finally:
            shutil.rmtree(base, ignore_errors=True)


def _source(root: Path) -> Path:
    """A source with a public file, a private damaged one and a private directory; its root is
    writable by all, so that only the daemon's rule stands between another user and the epoch."""
    src = write_tree(root, {"pub.jsonl": LINES, "private.csv": BAD_CSV, "hidden/x.jsonl": LINES})
    os.chmod(src / "private.csv", 0o600)
    os.chmod(src / "hidden", 0o700)
    os.chmod(src, 0o777)
    return src


def _errno(x) -> int | None:
    return x.get("errno") if isinstance(x, dict) else None


def test_another_user_reads_what_the_source_lets_them_and_sets_nothing(shared, as_nobody):
    """Holds: SEMANTICS.md#users-allow-other, SEMANTICS.md#users-setters, SEMANTICS.md#users-errors,
    SEMANTICS.md#users-stats, SEMANTICS.md#errors-eperm"""
    plain = shared(None, *ARGS[:-1], src=_source(shared.base / "src0"))
    assert _errno(as_nobody(("listdir", str(plain.mnt)))[0]) == errno.EACCES  # without --allow-other: no entry
    m = shared(None, *ARGS, src=plain.src)
    mnt = str(m.mnt)
    pub, private = str(m.path("pub.jsonl")), str(m.path("private.csv"))
    with pytest.raises(OSError) as e:
        m.path("private.csv").read_bytes()
    assert e.value.errno == errno.EIO
    mine = m.path("pub.jsonl").read_bytes()
    assert "private.csv" in os.getxattr(m.path("private.csv"), ERROR).decode()

    got = as_nobody(("listdir", mnt), ("read", pub), ("read", private), ("getxattr", private, ERROR),
                    ("listdir", str(m.path("hidden"))), ("getxattr", mnt, STATS))
    assert got[0] == ["hidden", "private.csv", "pub.jsonl"]
    assert got[1].encode() == mine != LINES  # the same view as root's
    assert [_errno(x) for x in got[2:5]] == [errno.EACCES] * 3
    stats = json.loads(got[5])
    assert "private.csv" not in got[5] and "last_errors" not in stats and stats["errors"] >= 1
    assert "owner" in stats["details"] and "private.csv" not in format_stats(stats)
    assert "private.csv" in m.xattr("stats")  # the owner sees the names

    os.setxattr(m.path(), RESUME, json.dumps({"epoch": 0, "views": {"pub.jsonl": [
        {"world_size": 1, "parts": 1, "consumed": [[10]]}]}}).encode())
    refused = as_nobody(("setxattr", mnt, EPOCH, "5"), ("setxattr", mnt, RESUME, '{"epoch": 5, "views": {}}'),
                        ("getxattr", mnt, RESUME), ("setxattr", pub, EPOCH, "5"), ("getxattr", pub, EPOCH))
    assert [_errno(x) for x in refused[:3]] == [errno.EPERM, errno.EPERM, errno.EACCES], refused
    assert _errno(refused[3]) in (errno.EACCES, errno.EPERM)  # pub.jsonl is not theirs to write: the kernel
    assert refused[4] == "0" and m.xattr("epoch") == "0" and json.loads(m.xattr("resume"))["epoch"] == 0
    assert "uid 65534 may not set it" in m.stderr()
    m.set_epoch(2)  # root may
    assert as_nobody(("getxattr", pub, EPOCH)) == ["2"]


def _pools_source(root: Path) -> tuple[Path, Path]:
    """Pools and mixtures over public files (``pub``), over files one of which is root's alone
    (``priv``: 0600), and over a file in a directory that is root's alone (``deep``, and a pool
    declared over two directories, ``spread``); its config."""
    lines = LINES.splitlines(keepends=True)
    files = {f"{d}/part-{i:05d}.jsonl": b"".join(lines[i * 600: (i + 1) * 600]) for d in ("pub", "priv") for i in range(3)}
    src = write_tree(root / "src", {**files, "hidden/x.jsonl": b"".join(lines[1800:]),
                                    "spread/a/s.jsonl": b"".join(lines[:900]), "spread/b/t.jsonl": b"".join(lines[900:])})
    for p in [src, *src.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chmod(src / "priv" / "part-00001.jsonl", 0o600)
    os.chmod(src / "hidden", 0o700)
    os.chmod(src / "spread" / "b", 0o700)
    cfg = root / "mix.toml"
    cfg.write_text('[[pool]]\nglob = "spread/*/*.jsonl"\n' + "".join(f'[[mix]]\nname = "{name}"\n' + "".join(f'[[mix.source]]\nglob = "{g}"\nweight = 1\n' for g in globs)
                           for name, globs in (("open", ["pub/*.jsonl"]), ("shut", ["priv/*.jsonl"]),
                                               ("deep", ["pub/*.jsonl", "hidden/*.jsonl"]))))
    return src, cfg


def test_a_shard_is_readable_only_by_who_may_read_every_member(shared, as_nobody):
    """A pool's shard holds every member's records: another user reads it only if they may
    read every member (their modes, and the directories on the way to each), and its mode says so.

    Holds: SEMANTICS.md#users-allow-other"""
    src, cfg = _pools_source(shared.base / "pools")
    m = shared(None, *ARGS, "--config", str(cfg), src=src)
    pub = [str(m.path(f"pub/part-{i:05d}.jsonl")) for i in range(3)]
    priv = [str(m.path(f"priv/part-{i:05d}.jsonl")) for i in range(3)]
    mixes = {name: [str(m.path(f".mix/{name}/{n}")) for n in sorted(os.listdir(m.path(f".mix/{name}")))]
             for name in ("open", "shut", "deep")}
    mine = {p: Path(p).read_bytes() for p in pub + priv + mixes["open"]}
    assert all(len(Path(p).read_bytes()) > 0 for p in mixes["shut"] + mixes["deep"])  # root reads them all

    got = as_nobody(*[("read", p) for p in pub + mixes["open"]], ("listdir", str(m.path(".mix/open"))))
    assert [x.encode() for x in got[:-1]] == [mine[p] for p in pub + mixes["open"]]
    assert got[-1] == [os.path.basename(p) for p in mixes["open"]]
    for p in pub + mixes["open"]:
        assert os.stat(p).st_mode & 0o444 == 0o444, oct(os.stat(p).st_mode)

    shut = priv + mixes["shut"] + mixes["deep"] + [str(m.path("spread/a/s.jsonl"))]
    got = as_nobody(*[("read", p) for p in shut], ("listdir", str(m.path(".mix/shut"))),
                    ("listdir", str(m.path(".mix/deep"))), ("listdir", str(m.path("priv"))))
    assert [_errno(x) for x in got[:-1]] == [errno.EACCES] * (len(shut) + 2), got
    assert got[-1] == [os.path.basename(p) for p in priv]  # the names, as the source's directory shows them
    for p in shut:  # the mode says so: no read for others, nor for the group (root's)
        assert os.stat(p).st_mode & 0o044 == 0, (p, oct(os.stat(p).st_mode))
    assert os.stat(priv[1]).st_mode & 0o777 == 0o600 and os.stat(priv[0]).st_mode & 0o777 == 0o600
    assert mine[priv[0]] and Path(priv[0]).read_bytes() == mine[priv[0]]  # root still reads it

    os.chmod(src / "pub" / "part-00002.jsonl", 0o600)  # the next open of a shard sees it
    got = as_nobody(*[("read", p) for p in pub + mixes["open"]])
    assert [_errno(x) for x in got] == [errno.EACCES] * len(got), got
    assert os.stat(pub[0]).st_mode & 0o777 == 0o600


def test_epoch_setters_any_lets_others_set_epochs_but_no_file_is_read_for_them(shared, as_nobody, tmp_path):
    """Holds: SEMANTICS.md#users-setters, SEMANTICS.md#users-state-files"""
    m = shared(None, *ARGS, "--epoch-setters", "any", src=_source(shared.base / "src"))
    mnt = str(m.mnt)
    state = {"epoch": 4, "views": {"pub.jsonl": [{"world_size": 1, "parts": 1, "consumed": [[10]]}]}}
    secret = tmp_path / "state.json"  # under pytest's directory: root's alone
    secret.write_text(json.dumps(state))
    public = shared.base / "state.json"
    public.write_text(json.dumps(state))
    public.chmod(0o644)
    got = as_nobody(("setxattr", mnt, EPOCH, "4"), ("setxattr", mnt, RESUME, "@" + str(secret)),
                    ("setxattr", mnt, RESUME, "@" + str(public)), ("setxattr", mnt, RESUME, json.dumps(state)),
                    ("getxattr", mnt, RESUME))
    assert got[0] is None and m.xattr("epoch") == "4"
    assert [_errno(x) for x in got[1:3]] == [errno.EACCES, errno.EACCES], got
    assert got[3] is None and json.loads(got[4]) == json.loads(m.xattr("resume")) == state
    assert len(m.path("pub.jsonl").read_bytes().splitlines()) == 2000 - 10
    assert "uid 65534 is neither the mount's owner nor root" in m.stderr()


def test_user_allow_other_is_read_from_fuse_conf(tmp_path):
    """A user other than root may mount with --allow-other only where fuse.conf allows it."""
    conf = tmp_path / "fuse.conf"
    for text, allowed in [("", False), ("# user_allow_other\n", False), ("mount_max = 1000\nuser_allow_other\n", True),
                          ("  user_allow_other  # shared node\n", True)]:
        conf.write_text(text)
        assert user_allow_other(str(conf)) is allowed, text
    assert user_allow_other(str(tmp_path / "missing")) is False
