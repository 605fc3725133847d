"""Level: mounted (real FUSE mounts, the daemon started under a low limit of open files).

Every open view holds its source file, so a daemon started from a shell whose soft limit is low
(``ulimit -n 64``) ran out of descriptors after a few dozen open files: lookups then failed with
an internal error (EIO) and opens with ESTALE.  The daemon raises its soft limit to the hard one;
where the hard limit itself runs out, readers get EMFILE (or ENFILE), the log says why, and the
mount serves again once files are closed."""

from __future__ import annotations

import concurrent.futures as cf
import errno
import os
import resource
import threading

FILES, LINES = 100, 60


def tree() -> dict[str, bytes]:
    files = {f"d/f{i:03d}.jsonl": lines_of(i) for i in range(FILES)}
    files.update({f"e/g{i:03d}.jsonl": lines_of(1000 + i) for i in range(FILES)})
    return files


def lines_of(i: int) -> bytes:
    return b"".join(b'{"file": %d, "line": %d}\n' % (i, j) for j in range(LINES))


def limited(soft: int, hard: int):
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return preexec


def limits_of(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as f:
        row = next(line for line in f if line.startswith("Max open files"))
    soft, hard = row.split()[3:5]
    return int(soft), int(hard)


def open_many(paths: list, held: list, lock: threading.Lock) -> dict[int, list[str]]:
    """Open and read every path from 16 threads at once, keeping the files open; the errnos met."""
    errors: dict[int, list[str]] = {}

    def one(path) -> None:
        try:
            f = open(path, "rb")
        except OSError as e:
            with lock:
                errors.setdefault(e.errno, []).append(f"open {path}")
            return
        with lock:
            held.append(f)
        try:
            data = f.read()
            if sorted(data.splitlines()) != sorted(lines_of(_number(path)).splitlines()):
                with lock:
                    errors.setdefault(-1, []).append(f"wrong bytes in {path}")
        except OSError as e:
            with lock:
                errors.setdefault(e.errno, []).append(f"read {path}")

    with cf.ThreadPoolExecutor(16) as ex:
        list(ex.map(one, paths))
    return errors


def _number(path) -> int:
    name = os.path.basename(path)
    return int(name[1:4]) + (1000 if name.startswith("g") else 0)


def test_the_daemon_raises_its_soft_limit_and_serves_hundreds_of_open_files(mount):
    """Holds: SEMANTICS.md#errors-emfile"""
    m = mount(tree(), "-v", preexec=limited(64, 4096))
    assert limits_of(m.pid) == (4096, 4096)
    assert "soft limit raised from 64 to the hard limit" in m.stderr()
    held: list = []
    try:
        paths = [m.path(f"d/f{i:03d}.jsonl") for i in range(FILES)] + [m.path(f"e/g{i:03d}.jsonl") for i in range(FILES)]
        errors = open_many(paths, held, threading.Lock())
        assert errors == {} and len(held) == 2 * FILES, {k: v[:3] for k, v in errors.items()}
    finally:
        for f in held:
            f.close()


def test_out_of_descriptors_readers_get_emfile_with_a_log_line_and_the_mount_recovers(mount):
    """Holds: SEMANTICS.md#errors-emfile"""
    m = mount(tree(), preexec=limited(64, 64))
    assert limits_of(m.pid) == (64, 64)
    held: list = []
    lock = threading.Lock()
    try:
        errors = open_many([m.path(f"d/f{i:03d}.jsonl") for i in range(FILES)], held, lock)
        # names never looked up, while the views above still hold their sources
        more = open_many([m.path(f"e/g{i:03d}.jsonl") for i in range(FILES)], held, lock)
        for code, what in more.items():
            errors.setdefault(code, []).extend(what)
        shown = {errno.errorcode.get(k, k): v[:3] for k, v in errors.items()}
        assert errors, f"{len(held)} files open at once under a limit of 64"
        assert set(errors) <= {errno.EMFILE, errno.ENFILE}, shown
    finally:
        for f in held:
            f.close()
    log = m.stderr()
    assert "out of file descriptors" in log and "internal error" not in log, log[-3000:]
    assert "ulimit -n" in log
    # closed again: every file serves its records
    for i in range(0, FILES, 7):
        for rel, n in ((f"d/f{i:03d}.jsonl", i), (f"e/g{i:03d}.jsonl", 1000 + i)):
            with open(m.path(rel), "rb") as f:
                assert sorted(f.read().splitlines()) == sorted(lines_of(n).splitlines())
