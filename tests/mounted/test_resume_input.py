"""Level: mounted (real FUSE mounts, the real command).

How a resume state reaches a mount: a state kept inside the mount, sent by the command (its
bytes) or named by ``@PATH`` (refused, never read through the mount, which keeps answering);
the mount named by a relative path; a state naming files the mount does not have; a state that
does not fit a view, whose reason stays readable; the epoch the command takes."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, bounded
from shufflefs.fs import control

N = 400
LINES = b"".join(b'{"id": %05d, "pad": "%s"}\n' % (i, b"x" * (i % 13)) for i in range(N))
ARGS = ["--block-size", "4KiB", "--buffer", "16KiB", "--seed", "3"]
EPOCH = 3
RESUME = "user.shufflefs.resume"


def layout(consumed: int) -> dict:
    return {"world_size": 1, "parts": 1, "consumed": [[consumed]]}


SMALL = {"epoch": EPOCH, "views": {"a.jsonl": [layout(100)]}}
LARGE = {"epoch": EPOCH, "views": {"a.jsonl": [layout(0)] * 1499 + [layout(100)]}}
"""A chain of stops on one layout, too large for one attribute value however it is written."""


def shufflefs(*args, cwd: str | os.PathLike = REPO, mnt: Path | None = None) -> subprocess.CompletedProcess:
    """The command; one that does not return within 60 s is a hang: the mount's connection is
    ended first (a caller stuck on the mount cannot even be killed before), then the command,
    and the test fails."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    child = subprocess.Popen([sys.executable, "-m", "shufflefs", *map(str, args)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd=cwd, env=env)
    try:
        out, err = child.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        if mnt is not None:
            control.abort(str(mnt))
        child.kill()
        child.communicate(timeout=30)
        pytest.fail(f"shufflefs {args} did not return within 60 s")
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


def answers(m) -> None:
    """The mount still answers: a listing and a read of a view in a child with a deadline."""
    r = bounded("import os, sys; print(sorted(os.listdir(sys.argv[1])))", str(m.mnt), mnt=m.mnt, timeout=30)
    assert r.returncode == 0 and "a.jsonl" in r.stdout, r.stderr


def count(m, rel: str = "a.jsonl") -> int:
    return len(m.path(rel).read_bytes().splitlines())


def test_a_state_inside_the_mount_is_sent_as_bytes_and_an_at_path_into_it_is_refused(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-own-mount, SEMANTICS.md#never-opened-own-mount"""
    m = mount({"a.jsonl": LINES, "states/small.json": json.dumps(SMALL), "states/large.json": json.dumps(LARGE)},
              *ARGS)
    assert len(json.dumps(LARGE)) > 60_000
    for name in ("small.json", "large.json"):  # the command reads the state and hands over its bytes
        m.set_epoch(0)
        r = shufflefs("epoch", m.path(), EPOCH, "--resume", m.path(f"states/{name}"), mnt=m.mnt)
        answers(m)  # first: a mount that stopped answering is ended, not left behind
        assert r.returncode == 0, r.stderr
        assert count(m) == N - 100
    assert not [p for p in os.listdir(control.run_dir()) if p.startswith("resume-")]  # the copy is gone

    # @PATH into the mount: by its name, and through a link to its directory (then by device)
    os.listdir(m.path("states"))  # the kernel keeps the names (a new lookup under MNT would wait for the setxattr)
    link = tmp_path / "link"
    link.symlink_to(m.path("states"))
    m.set_epoch(0)
    for path in (m.path("states/large.json"), link / "large.json"):
        code = ("import errno, os, sys\ntry:\n    os.setxattr(sys.argv[1], sys.argv[2], sys.argv[3].encode())\n"
                "except OSError as e:\n    print(errno.errorcode[e.errno])")
        r = bounded(code, str(m.path()), RESUME, "@" + str(path), mnt=m.mnt, timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "EINVAL", (path, r.stdout, r.stderr)
        answers(m)
    assert count(m) == N
    log = m.stderr()
    assert "it is inside this mount" in log and "it leads into this mount" in log, log[-3000:]


def test_a_relative_mount_path_is_the_mount(mount):
    """Holds: SEMANTICS.md#resume-own-mount"""
    m = mount({"a.jsonl": LINES}, *ARGS)
    state = m.mnt.parent / "state.json"
    state.write_text(json.dumps(SMALL))
    for spelled in ("mnt", "./mnt/", f"../{m.mnt.parent.name}/mnt"):
        m.set_epoch(0)
        r = shufflefs("epoch", spelled, EPOCH, "--resume", "state.json", cwd=m.mnt.parent, mnt=m.mnt)
        assert r.returncode == 0, (spelled, r.stderr)
        assert count(m) == N - 100


def test_a_state_naming_a_file_the_mount_lacks_is_refused(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-errors"""
    m = mount({"a.jsonl": LINES, "notes.txt": b"x\n", "d/b.jsonl": LINES}, *ARGS)
    typo = {"epoch": EPOCH, "views": {"a.jsonl": [layout(100)], "d/c.jsonl": [layout(5)]}}
    f = tmp_path / "typo.json"
    f.write_text(json.dumps(typo))
    r = shufflefs("epoch", m.path(), EPOCH, "--resume", f)
    assert r.returncode == 2 and "'d/c.jsonl', not a file of" in r.stderr, r.stderr
    with pytest.raises(OSError) as e:
        os.setxattr(m.path(), RESUME, json.dumps(typo).encode())
    assert e.value.errno == errno.EINVAL
    assert "it names 'd/c.jsonl', not a file of this mount" in m.stderr()
    with pytest.raises(OSError) as e:
        os.getxattr(m.path(), RESUME)
    assert e.value.errno == errno.ENODATA  # nothing was set
    assert count(m) == N


def test_a_state_that_does_not_fit_a_view_leaves_its_reason_readable(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-errors, SEMANTICS.md#errors-reason"""
    m = mount({"a.jsonl": LINES, "b.jsonl": LINES}, *ARGS)
    over = {"epoch": EPOCH, "views": {"a.jsonl": [layout(N + 1)], "b.jsonl": [layout(7)]}}
    os.setxattr(m.path(), RESUME, json.dumps(over).encode())
    reason = os.getxattr(m.path("a.jsonl"), "user.shufflefs.error").decode()
    assert " EINVAL " in reason and "a.jsonl" in reason and "resume state does not fit" in reason, reason
    r = subprocess.run(["getfattr", "--only-values", "-n", "user.shufflefs.error", str(m.path("a.jsonl"))],
                       capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == reason, r
    with pytest.raises(OSError) as e:
        m.path("a.jsonl").read_bytes()
    assert e.value.errno == errno.EINVAL
    assert count(m, "b.jsonl") == N - 7  # the other view resumes


def test_stat_shows_a_resumed_path_that_is_no_utf8(mount, tmp_path):
    """Holds: SEMANTICS.md#resume-clear"""
    m = mount({"a.jsonl": LINES}, *ARGS)
    name = os.fsdecode(b"\xff.jsonl")  # a file name that is no UTF-8: a lone surrogate in a state's JSON
    (m.src / name).write_bytes(LINES)
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"epoch": EPOCH, "views": {name: [layout(3)]}}))
    r = shufflefs("epoch", m.path(), EPOCH, "--resume", state)
    assert r.returncode == 0, r.stderr
    assert count(m, name) == N - 3
    r = shufflefs("stat", m.path())
    assert r.returncode == 0 and "1 view(s) (\\udcff.jsonl)" in r.stdout, (r.stdout, r.stderr)
    r = shufflefs("stat", m.path(), "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["resume"]["views"] == [name]


def test_the_epoch_command_takes_what_the_attribute_takes(mount, capsys):
    """Holds: SEMANTICS.md#epochs-values"""
    from shufflefs.cli import main

    m = mount({"a.jsonl": LINES}, *ARGS)

    def refused(*args: str) -> str:
        with pytest.raises(SystemExit) as e:
            main(["epoch", str(m.path()), *args])
        assert e.value.code == 2, args
        return capsys.readouterr().err

    for value in ["01", " 7", "7 ", "+7", "-1", "1e3", "2147483648", "\u0663"]:
        assert "not an epoch" in refused(value), value
        assert "not an epoch" in refused(value, "--resume", "/nonexistent"), value
    assert m.xattr("epoch") == "0"
    assert main(["epoch", str(m.path()), "7"]) == 0 and m.xattr("epoch") == "7"
