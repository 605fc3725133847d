"""Level: mounted (real FUSE mounts, real readers).

Index builds in worker processes: same indexes, same errors, and a dead worker is survivable."""

from __future__ import annotations

import collections
import io
import logging
import multiprocessing
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import crc32c
import numpy as np
import pytest

from conftest import process_gone, wait_for
from faulty_formats import AppendingFormat, GatedFormat, SigbusFormat, TruncatingFormat
from shufflefs.errors import FormatError, StaleSourceError
from shufflefs.formats import FORMATS, CsvFormat, FixedFormat, LinesFormat, NpyFormat, TFRecordFormat
from shufflefs.formats import load_or_build_index, make_format, scan_file
from shufflefs.index.table import IndexCache, RecordIndex, cache_key
from shufflefs.formats.build import DIED, STOPPED, IndexBuilder

WAIT = 30.0


@pytest.fixture
def builder():
    b = IndexBuilder(workers=2)
    try:
        yield b
    finally:
        b.shutdown()


def same(a: RecordIndex, b: RecordIndex) -> bool:
    return (a.size, a.bounds.tolist(), a.add_newline, a.stamp) == (b.size, b.bounds.tolist(), b.add_newline, b.stamp)


def tf_frame(payload: bytes) -> bytes:
    def masked(b: bytes) -> int:
        c = crc32c.crc32c(b)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    n = struct.pack("<Q", len(payload))
    return n + struct.pack("<I", masked(n)) + payload + struct.pack("<I", masked(payload))


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


SOURCES = {
    "a.jsonl": (b'{"a": 1}\n{"b": 22}\n{"c": 333}', LinesFormat()),
    "t.csv": (b'h1,h2\n1,"two\nlines"\n2,z\n', CsvFormat()),
    "f.bin": (b"HDR" + bytes(range(12)), FixedFormat(record_size=4, header_bytes=3)),
    "x.npy": (npy(np.arange(10, dtype=np.int32).reshape(5, 2)), NpyFormat()),
    "r.tfrecord": (b"".join(tf_frame(b"p" * n) for n in (0, 3, 70)), TFRecordFormat()),
    "empty.jsonl": (b"", LinesFormat()),
}


def in_background(fn, *args) -> tuple[threading.Thread, list]:
    """Run ``fn(*args)`` on a started thread; its result (or exception) lands in the list."""
    result: list = []

    def run() -> None:
        try:
            result.append(fn(*args))
        except BaseException as e:  # checked by the caller
            result.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, result


# --------------------------------------------------------------------------- what crosses the process boundary


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_every_format_pickles(name: str) -> None:
    fmt = make_format(name, {"record_size": 8} if name == "fixed" else {})
    back = pickle.loads(pickle.dumps(fmt))
    assert type(back) is type(fmt) and back.params() == fmt.params()


@pytest.mark.parametrize("cls, offset", [(FormatError, 17), (StaleSourceError, None)])
def test_errors_pickle_with_their_fields(cls, offset) -> None:
    e = cls("/data/x.bin", offset, "something is wrong")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is cls
    assert (back.path, back.offset, back.message, back.errno, str(back)) == (e.path, offset, e.message, e.errno, str(e))


# --------------------------------------------------------------------------- builds


def test_builds_equal_in_process_builds_and_share_the_cache(builder, tmp_path, monkeypatch) -> None:
    for rel, (data, fmt) in SOURCES.items():
        (tmp_path / rel).write_bytes(data)
    for rel, (_, fmt) in SOURCES.items():
        p = tmp_path / rel
        got = builder.build(p, fmt, tmp_path / "cache")
        assert same(got, load_or_build_index(p, fmt, IndexCache(tmp_path / "ref"))), rel
        assert IndexCache(tmp_path / "cache").load(cache_key(p, got.stamp, fmt.name, fmt.params()), got.stamp)

    def no_scans(path, fmt):
        raise AssertionError(f"{path} was scanned again although its index is cached")

    monkeypatch.setattr(builder, "scan", no_scans)
    for rel, (_, fmt) in SOURCES.items():
        p = tmp_path / rel
        assert same(builder.build(p, fmt, tmp_path / "cache"), scan_file(p, fmt)), rel


def test_errors_arrive_as_raised(builder, tmp_path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"0123456")
    frames = tf_frame(b"abc") + tf_frame(b"defg")
    q = tmp_path / "bad.tfrecord"
    q.write_bytes(frames[:-2])
    for path, fmt, offset in [(p, FixedFormat(record_size=4), 4), (q, TFRecordFormat(), len(tf_frame(b"abc")))]:
        with pytest.raises(FormatError) as local:
            scan_file(path, fmt)
        with pytest.raises(FormatError) as remote:
            builder.build(path, fmt, tmp_path / "cache")
        e, r = remote.value, local.value
        assert type(e) is FormatError and (e.path, e.offset) == (str(path), offset)
        assert (e.message, str(e), e.errno) == (r.message, str(r), r.errno)

    s = tmp_path / "growing.jsonl"
    s.write_bytes(b"a\n")
    with pytest.raises(StaleSourceError) as stale:
        builder.build(s, AppendingFormat(), tmp_path / "cache")
    assert (stale.value.path, stale.value.offset) == (str(s), None)
    assert stale.value.message == "file changed while it was being indexed"

    with pytest.raises(FileNotFoundError):
        builder.build(tmp_path / "missing.jsonl", LinesFormat(), tmp_path / "cache")


def test_a_worker_killed_by_sigbus_is_a_stale_source_and_the_next_build_works(builder, tmp_path) -> None:
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"1\n22\n333\n")
    with pytest.raises(StaleSourceError) as e:
        builder.build(p, SigbusFormat(), tmp_path / "cache")
    assert (e.value.path, e.value.offset, e.value.message) == (str(p), None, DIED)
    assert same(builder.build(p, LinesFormat(), tmp_path / "cache"), scan_file(p, LinesFormat()))


def test_a_file_truncated_under_the_scan_kills_only_the_worker(builder, tmp_path) -> None:
    p = tmp_path / "big.jsonl"
    p.write_bytes(b"".join(b"%07d\n" % i for i in range(8192)))  # 64 KiB: 16 pages
    with pytest.raises(StaleSourceError) as e:
        builder.build(p, TruncatingFormat(), tmp_path / "cache")
    assert e.value.message == DIED
    assert p.stat().st_size == 16 << 10  # halved twice: scanned once more after the first death
    got = builder.build(p, LinesFormat(), tmp_path / "cache")
    assert got.n == 2048 and same(got, scan_file(p, LinesFormat()))


def test_a_crash_fails_only_the_file_that_caused_it(builder, tmp_path) -> None:
    good, bad = tmp_path / "good.jsonl", tmp_path / "bad.jsonl"
    good.write_bytes(b"x\nyy\n")
    bad.write_bytes(b"z\n")
    started, release = tmp_path / "started", tmp_path / "release"
    t, result = in_background(builder.build, good, GatedFormat(str(started), str(release)), tmp_path / "cache")
    try:
        wait_for(lambda: started.exists() and started.read_text().endswith("\n"), "the first scan to start")
        with pytest.raises(StaleSourceError):
            builder.build(bad, SigbusFormat(), tmp_path / "cache")
    finally:
        release.touch()
        t.join(WAIT)
    assert len(result) == 1 and isinstance(result[0], RecordIndex), result
    assert result[0].bounds.tolist() == [0, 2, 5]
    assert len(started.read_text().split()) == 1  # scanned once: its worker never died


def test_shutdown_stops_a_running_scan_and_a_later_build_starts_afresh(tmp_path) -> None:
    b = IndexBuilder(workers=1)
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"1\n2\n")
    started = tmp_path / "started"
    t, result = in_background(b.build, p, GatedFormat(str(started), str(tmp_path / "never")), tmp_path / "cache")
    try:
        wait_for(lambda: started.exists() and started.read_text().endswith("\n"), "the scan to start")  # its pid written
        b.shutdown()
        t.join(WAIT)
        assert len(result) == 1 and isinstance(result[0], StaleSourceError) and result[0].message == STOPPED
        worker = int(started.read_text())
        wait_for(lambda: process_gone(worker), f"worker {worker} to end")
        assert same(b.build(p, LinesFormat(), tmp_path / "cache"), scan_file(p, LinesFormat()))
    finally:
        b.shutdown()
        t.join(WAIT)


def _managers() -> list[threading.Thread]:
    from concurrent.futures.process import _ExecutorManagerThread
    return [t for t in threading.enumerate() if isinstance(t, _ExecutorManagerThread)]


@pytest.mark.parametrize("interrupted", [False, True])
def test_a_waiting_shutdown_leaves_no_pool_thread_for_the_exit_hook(tmp_path, interrupted: bool) -> None:
    """A pool's manager thread still alive at exit races CPython's exit hook, which writes into
    the pipe the thread is closing ("Exception ignored ... Bad file descriptor" on the daemon's
    stderr): the daemon's stop at exit joins every pool's, also those of pools an interrupt
    stopped without waiting."""
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"1\n2\n")
    before = set(_managers())
    b = IndexBuilder(workers=2)
    try:
        b.build(p, LinesFormat(), tmp_path / "cache")
        assert set(_managers()) - before  # the pool's thread runs
        if interrupted:
            b.shutdown(wait=False)  # as `interrupt_default` on a signal
    finally:
        b.shutdown()
    assert not set(_managers()) - before


class _NoProcesses:
    """A multiprocessing context in which no process can be started."""

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("spawn")

    def __getattr__(self, name: str):
        return getattr(self._ctx, name)

    def Process(self, *args, **kwargs):
        raise OSError(11, "Resource temporarily unavailable")


def test_without_worker_processes_the_scan_runs_in_process(tmp_path, caplog) -> None:
    b = IndexBuilder()
    b.context = _NoProcesses()
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"1\n2\n")
    try:
        with caplog.at_level(logging.ERROR, logger="shufflefs"):
            got = b.build(p, LinesFormat(), tmp_path / "cache")
    finally:
        b.shutdown()
    assert same(got, scan_file(p, LinesFormat()))
    assert "cannot start an indexing process" in caplog.text


def test_plain_fork_is_refused() -> None:
    with pytest.raises(ValueError, match="fork"):
        IndexBuilder(start_method="fork")


# --------------------------------------------------------------------------- through the mount


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except FileNotFoundError:
        return ""


def _workers(daemon: int) -> list[int]:
    servers = [c for c in _children(daemon) if "multiprocessing.forkserver" in _cmdline(c)]
    return [w for s in servers for w in _children(s)]


def test_the_daemon_survives_a_dead_indexing_process(mount) -> None:
    def jsonl(n: int, tag: str) -> bytes:
        return b"".join(b'{"%s": %d}\n' % (tag.encode(), i) for i in range(n))

    files = {"a.jsonl": jsonl(500, "a"), "b.jsonl": jsonl(700, "b"), "c.jsonl": jsonl(300, "c")}
    m = mount(files, "--block-size", "4KiB", "--buffer", "16KiB", "--seed", "3")

    def check(rel: str) -> None:
        got = (m.path(rel)).read_bytes()
        assert collections.Counter(got.splitlines()) == collections.Counter(files[rel].splitlines())
        assert got != files[rel]  # shuffled

    check("a.jsonl")
    workers = _workers(m.pid)
    assert workers, "the index was not built in an indexing process"
    for w in workers:
        os.kill(w, signal.SIGBUS)
    wait_for(lambda: all(process_gone(w) for w in workers), "the indexing processes to die")

    check("b.jsonl")  # indexed by a fresh worker
    check("c.jsonl")
    assert m.proc.poll() is None
    stats = m.stats()
    assert stats["errors"] == 0, stats["last_errors"]
    assert stats["files_opened"] >= 3
    assert set(_workers(m.pid)).isdisjoint(workers)

    descendants = _children(m.pid)
    descendants += [w for d in descendants for w in _children(d)]
    m.stop()
    assert m.returncode == 0, m.stderr()
    wait_for(lambda: all(process_gone(d) for d in descendants), "the daemon's processes to end")


def test_workers_end_with_a_killed_daemon(tmp_path) -> None:
    started = tmp_path / "started"
    code = (
        "import sys; sys.path[:0] = sys.argv[1:3]\n"
        "from faulty_formats import GatedFormat\n"
        "from shufflefs.formats.build import IndexBuilder\n"
        "IndexBuilder().build(sys.argv[3], GatedFormat(sys.argv[4], sys.argv[5]), sys.argv[6])\n"
    )
    (tmp_path / "a.jsonl").write_bytes(b"1\n")
    tests = Path(__file__).resolve().parents[1]
    args = [str(tests), str(tests.parent), str(tmp_path / "a.jsonl"), str(started), str(tmp_path / "never"),
            str(tmp_path / "cache")]
    proc = subprocess.Popen([sys.executable, "-c", code, *args])
    worker = server = None
    try:
        wait_for(lambda: started.exists() and started.read_text().endswith("\n"), "the scan to start")
        worker = int(started.read_text())
        with open(f"/proc/{worker}/stat") as f:
            server = int(f.read().rsplit(")", 1)[1].split()[1])
        assert "multiprocessing.forkserver" in _cmdline(server)
        proc.kill()  # no shutdown: the daemon's processes must still end
        proc.wait(WAIT)
        wait_for(lambda: process_gone(worker) and process_gone(server), "the orphaned indexing processes to end")
    finally:
        proc.kill()
        proc.wait(WAIT)
        for pid in (worker, server):
            if pid is not None and not process_gone(pid):
                os.kill(pid, signal.SIGKILL)
