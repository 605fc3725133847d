"""Level: mounted (real FUSE mounts, real readers).

The ``shufflefs`` command and the mount(8) helper, through real processes and real FUSE mounts.

Every mount made here is unmounted in a fixture or a ``finally`` (lazily if need be), and only
daemons these tests started are ever signalled, by PID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shufflefs import cli
from shufflefs.index.table import default_cache_dir
from shufflefs.strategies import STRATEGIES, STRATEGY_HELP

ROOT = Path(__file__).resolve().parents[2]
HELPER = ROOT / "mount" / "mount.fuse.shufflefs"
DEADLINE = 60.0
"""Seconds before a process that should have finished is declared hung (never a pass criterion)."""

N_LINES = 600


def _fuse_usable() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3"
    try:
        import shufflefs.fs.daemon  # noqa: F401
    except ImportError as e:
        return f"daemon not importable: {e}"
    return None


_NO_FUSE = _fuse_usable()
needs_fuse = pytest.mark.skipif(_NO_FUSE is not None, reason=str(_NO_FUSE))


# --------------------------------------------------------------------------- helpers


def shufflefs(*args: str | os.PathLike, env: dict | None = None, timeout: float = DEADLINE) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "shufflefs", *map(str, args)], stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT,
    )


def alive(pid: int) -> bool:
    return cli._alive(pid)


def wait_until(predicate, what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def cleanup_mount(mnt: Path, pid: int | None) -> None:
    """Best effort: unmount (lazily if busy), then stop our daemon by PID if it still runs."""
    if os.path.ismount(mnt):
        if subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    if pid is not None and alive(pid):
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not alive(pid), f"daemon {pid} to exit", 10)
        except AssertionError:
            os.kill(pid, signal.SIGKILL)


def daemon_pid(mnt: Path) -> int:
    return int(os.getxattr(mnt, "user.shufflefs.pid").decode())


def make_dataset(src: Path) -> None:
    src.mkdir()
    lines = [json.dumps({"id": i, "label": i * 4 // N_LINES, "pad": "x" * (i % 50)}) for i in range(N_LINES)]
    (src / "data.jsonl").write_text("\n".join(lines) + "\n")
    sub = src / "sub"
    sub.mkdir()
    (sub / "table.csv").write_text("a,b\n" + "".join(f"{i},{i * i}\n" for i in range(300)))


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, Path, Path]:
    src, mnt, cache = tmp_path / "src", tmp_path / "mnt", tmp_path / "cache"
    make_dataset(src)
    mnt.mkdir()
    return src, mnt, cache


class Mounted:
    def __init__(self, src: Path, mnt: Path, pid: int) -> None:
        self.src, self.mnt, self.pid = src, mnt, pid


@pytest.fixture
def mounted(dataset):
    """A background mount made by ``shufflefs mount`` with small blocks, always cleaned up."""
    src, mnt, cache = dataset
    pid = None
    try:
        r = shufflefs("mount", src, mnt, "--block-size", "4KiB", "--buffer", "25%", "--seed", "3",
                      "--cache-dir", cache, "-v")
        assert r.returncode == 0, r.stderr
        m = re.search(r"daemon pid (\d+)", r.stdout)
        assert m, r.stdout
        pid = int(m.group(1))
        yield Mounted(src, mnt, pid)
    finally:
        if pid is None and os.path.ismount(mnt):
            pid = daemon_pid(mnt)
        cleanup_mount(mnt, pid)


def start_foreground(src: Path, mnt: Path, cache: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "shufflefs", "mount", "-f", str(src), str(mnt), "--cache-dir", str(cache)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    try:
        wait_until(lambda: os.path.ismount(mnt) or proc.poll() is not None, "the mount")
    except BaseException:
        stop_foreground(proc, mnt)
        raise
    assert os.path.ismount(mnt), proc.communicate()[0]
    return proc


def stop_foreground(proc: subprocess.Popen, mnt: Path) -> None:
    if proc.poll() is None:
        cleanup_mount(mnt, None)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    cleanup_mount(mnt, None)


# --------------------------------------------------------------------------- parsing (no mount)


def test_help_lists_every_strategy():
    for args in (["--help"], ["mount", "--help"]):
        r = shufflefs(*args)
        assert r.returncode == 0
        for name in STRATEGIES:
            assert re.search(rf"^\s+{re.escape(name)}\s+{re.escape(STRATEGY_HELP[name])}$", r.stdout, re.M), (name, r.stdout)


def _parse_mount(argv: list[str]):
    parser, subs = cli.build_parser()
    args = parser.parse_args(["mount", *argv])
    return cli.mount_config(args, subs["mount"])


def test_config_file_and_overrides(dataset, tmp_path):
    src, mnt, _ = dataset
    cfg = tmp_path / "conf.toml"
    cfg.write_text(
        'strategy = "full"\nblock-size = "1MiB"\nbuffer = "10%"\nseed = 3\ncache_dir = "cache2"\n'
        "record_size = 16\n"
        '[[format]]\nglob = "*.rec"\nformat = "fixed"\nparams = { record_size = 32, header_bytes = 8 }\n'
    )
    config, opts = _parse_mount([str(src), str(mnt), "--config", str(cfg), "--seed", "9", "--format", "*.dat=lines"])
    assert config.spec.strategy == "full"
    assert config.spec.block_size == 1 << 20
    assert config.spec.buffer == pytest.approx(0.1)
    assert config.spec.seed == 9  # the command line wins
    assert [(r.glob, r.format, r.params) for r in config.rules] == [
        ("*.dat", "lines", {}), ("*.rec", "fixed", {"record_size": 32, "header_bytes": 8})]
    assert config.format_defaults == {"record_size": 16}
    assert config.cache_dir == tmp_path / "cache2"  # relative to the config file
    assert config.source == src.resolve() and config.mountpoint == mnt.resolve()


def test_defaults(dataset):
    src, mnt, _ = dataset
    config, _ = _parse_mount([str(src), str(mnt)])
    assert (config.spec.strategy, config.spec.block_size, config.spec.buffer, config.spec.seed) == (
        "stratified", None, 64 << 20, 0)  # None: the block size is chosen per file
    assert config.epoch == 0 and config.rules == []
    assert config.cache_dir == default_cache_dir()  # resolved up front, so it can be checked


BAD_OPTIONS = [
    (["--block-size", "4XB"], "not a size"),
    (["--block-size", "0"], "positive"),
    (["--buffer", "0%"], "percentage"),
    (["--buffer", "150%"], "percentage"),
    (["--strategy", "nope"], "invalid choice"),
    (["--seed", "-1"], ">= 0"),
    (["--epoch", "x"], "not an integer"),
    (["--format", "*.x=nosuchformat"], "unknown format"),
    (["--format", "*.rec=fixed"], "record_size"),
    (["--format", "noequals"], "GLOB=FORMAT"),
    (["--rank", "1"], "smaller than --world"),
]


@pytest.mark.parametrize("extra,message", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_option_is_a_usage_error(dataset, extra, message):
    src, mnt, _ = dataset
    r = shufflefs("mount", src, mnt, *extra)
    try:
        assert r.returncode == 2, r.stderr
        assert "shufflefs mount: error:" in r.stderr and message in r.stderr, r.stderr
        assert not os.path.ismount(mnt)
    finally:
        cleanup_mount(mnt, None)


def test_bad_paths_are_usage_errors(dataset, tmp_path):
    src, mnt, _ = dataset
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (src / "inner").mkdir()
    cases = [
        (tmp_path / "missing", mnt, "does not exist"),
        (src / "data.jsonl", mnt, "not a directory"),
        (src, tmp_path / "nomnt", "does not exist"),
        (src, tmp_path / "full", "not empty"),
        (src, src / "inner", "inside the source"),
        (src, src, "same directory"),
    ]
    for s, m, message in cases:
        r = shufflefs("mount", s, m)
        assert r.returncode == 2 and message in r.stderr, (s, m, r.stderr)
    assert not os.path.ismount(mnt)


def test_bad_config_file(dataset, tmp_path):
    src, mnt, _ = dataset
    cfg = tmp_path / "bad.toml"
    cfg.write_text('strategy = "full"\nblocksize = "1MiB"\n')
    r = shufflefs("mount", src, mnt, "--config", cfg)
    assert r.returncode == 2 and "unknown key 'blocksize'" in r.stderr, r.stderr
    cfg.write_text('block_size = "huge"\n')
    r = shufflefs("mount", src, mnt, "--config", cfg)
    assert r.returncode == 2 and "block_size" in r.stderr and "not a size" in r.stderr, r.stderr
    r = shufflefs("mount", src, mnt, "--config", tmp_path / "missing.toml")
    assert r.returncode == 2 and "cannot read config file" in r.stderr, r.stderr


def test_epoch_and_stat_refuse_other_filesystems(tmp_path):
    f = tmp_path / "plain.txt"
    f.write_text("x")
    for args in (["epoch", f], ["epoch", f, "3"], ["stat", tmp_path], ["umount", tmp_path]):
        r = shufflefs(*args)
        assert r.returncode == 1, (args, r.stderr)
        assert "not a shufflefs mount" in r.stderr or "not mounted" in r.stderr, r.stderr


def test_mount_helper_translates_options(tmp_path):
    r = subprocess.run(
        ["sh", str(HELPER), "/data", "/mnt/x", "-f", "-o",
         "rw,noauto,_netdev,x-systemd.automount,strategy=full,block_size=16KiB,buffer=10%,seed=5,"
         "format=*.rec=fixed:record_size=128+header_bytes=16,verbose"],
        capture_output=True, text=True, env={**os.environ, "SHUFFLEFS": "/bin/true"},
    )
    assert r.returncode == 0, r.stderr
    assert ("/bin/true mount --strategy full --block-size 16KiB --buffer 10% --seed 5 "
            "--format *.rec=fixed:record_size=128,header_bytes=16 -v -- /data /mnt/x") in r.stderr
    r = subprocess.run(["sh", str(HELPER), "/data", "/mnt/x", "-f", "-o",
                        "allow_other,default_permissions,epoch_setters=any"],
                       capture_output=True, text=True, env={**os.environ, "SHUFFLEFS": "/bin/true"})
    assert r.returncode == 0, r.stderr
    assert "/bin/true mount --allow-other --epoch-setters any -- /data /mnt/x" in r.stderr
    r = subprocess.run(["sh", str(HELPER), "/data", "/mnt/x", "-o", "allow_root"],
                       capture_output=True, text=True, env={**os.environ, "SHUFFLEFS": "/bin/true"})
    assert r.returncode == 1 and "unknown option 'allow_root'" in r.stderr


# --------------------------------------------------------------------------- index (no mount)


def _summary(r: subprocess.CompletedProcess) -> dict[str, int]:
    line = r.stdout.strip().splitlines()[-1]
    return {k: int(v) for v, k in re.findall(r"(\d+) (built|cached|failed|files|records)", line)}


def test_index_builds_reuses_and_rebuilds(dataset):
    src, _, cache = dataset
    r = shufflefs("index", src, "--cache-dir", cache)
    assert r.returncode == 0, r.stderr
    assert _summary(r) == {"files": 2, "records": N_LINES + 300, "built": 2, "cached": 0, "failed": 0}
    assert r.stderr == ""  # no progress bar when stderr is not a terminal

    r = shufflefs("index", src, "--cache-dir", cache)
    assert _summary(r) == {"files": 2, "records": N_LINES + 300, "built": 0, "cached": 2, "failed": 0}

    data = src / "data.jsonl"
    st = data.stat()
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    r = shufflefs("index", src, "--cache-dir", cache)
    assert _summary(r)["built"] == 1 and _summary(r)["cached"] == 1


def test_index_reports_format_errors(dataset):
    src, _, cache = dataset
    (src / "broken.npy").write_bytes(b"this is not an npy file")
    r = shufflefs("index", src, "--cache-dir", cache)
    assert r.returncode == 1
    assert "broken.npy" in r.stderr and "magic" in r.stderr, r.stderr
    assert _summary(r)["failed"] == 1 and _summary(r)["built"] == 2


# --------------------------------------------------------------------------- mounted


def sorted_lines(data: bytes) -> list[bytes]:
    return sorted(data.splitlines(keepends=True))


@needs_fuse
def test_background_mount_is_ready_on_return(mounted):
    # No waiting: the mount must be usable as soon as `shufflefs mount` has returned.
    view = (mounted.mnt / "data.jsonl").read_bytes()
    source = (mounted.src / "data.jsonl").read_bytes()
    assert view != source
    assert sorted_lines(view) == sorted_lines(source)
    assert daemon_pid(mounted.mnt) == mounted.pid
    assert alive(mounted.pid)


@needs_fuse
def test_epoch_on_root_and_on_a_file(mounted):
    """Holds: SEMANTICS.md#epochs-next, SEMANTICS.md#epochs-values, SEMANTICS.md#views-order"""
    mnt = mounted.mnt
    f = mnt / "data.jsonl"
    other = mnt / "sub" / "table.csv"

    def epoch(path, *args):
        r = shufflefs("epoch", path, *args)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert epoch(mnt) == "0"
    first = f.read_bytes()
    assert epoch(mnt, "5") == ""
    assert epoch(mnt) == "5" and epoch(f) == "5" and epoch(other) == "5"
    fifth = f.read_bytes()
    assert fifth != first and sorted_lines(fifth) == sorted_lines(first)
    assert epoch(mnt, "next") == "6"
    assert epoch(other) == "6"

    assert epoch(f, "2") == ""
    assert epoch(f) == "2" and epoch(other) == "6"
    assert epoch(f, "next") == "3"
    assert epoch(f, "5") == ""
    assert f.read_bytes() == fifth  # an epoch's order is a pure function of (seed, epoch)

    for bad in ("-1", "x", "1.5"):
        r = shufflefs("epoch", f, bad)
        assert r.returncode == 2 and "epoch" in r.stderr, r.stderr
    assert epoch(f) == "5"
    r = shufflefs("epoch", mnt / "nonexistent")
    assert r.returncode == 1 and "no such file" in r.stderr


@needs_fuse
def test_stat(mounted):
    (mounted.mnt / "data.jsonl").read_bytes()
    r = shufflefs("stat", mounted.mnt, "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["pid"] == mounted.pid
    assert stats["strategy"] == "stratified"  # the default
    assert stats["bytes_served"] >= (mounted.src / "data.jsonl").stat().st_size
    r = shufflefs("stat", mounted.mnt)
    assert r.returncode == 0, r.stderr
    assert "stratified" in r.stdout and str(mounted.pid) in r.stdout
    assert re.search(r"^epoch\s+0$", r.stdout, re.M), r.stdout


@needs_fuse
def test_umount_stops_the_daemon(mounted):
    """Holds: SEMANTICS.md#umount-clean"""
    r = shufflefs("umount", mounted.mnt)
    assert r.returncode == 0, r.stderr
    assert not os.path.ismount(mounted.mnt)
    assert not alive(mounted.pid)
    r = shufflefs("umount", mounted.mnt)
    assert r.returncode == 1 and "not mounted" in r.stderr


@needs_fuse
def test_umount_of_a_busy_mount_fails_clearly(mounted):
    """Holds: SEMANTICS.md#umount-busy"""
    with open(mounted.mnt / "data.jsonl", "rb") as f:
        f.read(10)
        r = shufflefs("umount", mounted.mnt)
        assert r.returncode == 1
        assert "busy" in r.stderr and "--lazy" in r.stderr, r.stderr
        assert os.path.ismount(mounted.mnt) and alive(mounted.pid)
    r = shufflefs("umount", mounted.mnt)
    assert r.returncode == 0, r.stderr
    assert not alive(mounted.pid)


@needs_fuse
def test_lazy_umount_detaches_a_busy_mount(mounted):
    """Holds: SEMANTICS.md#umount-busy"""
    f = open(mounted.mnt / "data.jsonl", "rb")
    try:
        r = shufflefs("umount", "--lazy", mounted.mnt)
        assert r.returncode == 0, r.stderr
        assert not os.path.ismount(mounted.mnt)
        assert f.read(1) == b"{"  # the open file is still served
    finally:
        f.close()
    wait_until(lambda: not alive(mounted.pid), "the daemon to exit after the last close")


@needs_fuse
def test_log_file(dataset, tmp_path):
    src, mnt, cache = dataset
    log = tmp_path / "daemon.log"
    try:
        r = shufflefs("mount", src, mnt, "--cache-dir", cache, "--log-file", log, "-v")
        assert r.returncode == 0, r.stderr
        assert f"mounted {src}" in log.read_text()
        r = shufflefs("umount", mnt)
        assert r.returncode == 0, r.stderr
        assert "unmounted" in log.read_text()
    finally:
        cleanup_mount(mnt, None)


@needs_fuse
def test_daemon_failure_is_reported(dataset, tmp_path):
    """If the daemon dies before mounting, `shufflefs mount` shows its error and fails."""
    src, mnt, cache = dataset
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pyfuse3.py").write_text("raise ImportError('pyfuse3 deliberately broken for a test')\n")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    try:
        r = shufflefs("mount", src, mnt, "--cache-dir", cache, env=env)
        assert r.returncode != 0
        assert "deliberately broken" in r.stderr and "failed to mount" in r.stderr, r.stderr
        assert not os.path.ismount(mnt)
    finally:
        cleanup_mount(mnt, None)


@needs_fuse
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_foreground_daemon_unmounts_on_signal(dataset, sig):
    """Holds: SEMANTICS.md#umount-signals"""
    src, mnt, cache = dataset
    proc = start_foreground(src, mnt, cache)
    try:
        assert sorted_lines((mnt / "data.jsonl").read_bytes()) == sorted_lines((src / "data.jsonl").read_bytes())
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 0, out
        assert not os.path.ismount(mnt)
    finally:
        stop_foreground(proc, mnt)


@needs_fuse
def test_fusermount_unmount_makes_the_daemon_exit_0(dataset):
    """Holds: SEMANTICS.md#umount-clean"""
    src, mnt, cache = dataset
    proc = start_foreground(src, mnt, cache)
    try:
        # a foreground daemon has no readiness pipe: just mounted, its own stat of the mount point
        # (setting the readahead) may still be in flight, and the unmount then fails with EBUSY
        deadline = time.monotonic() + 5
        while subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, timeout=DEADLINE).returncode:
            assert time.monotonic() < deadline, "fusermount3 -u kept failing"
            time.sleep(0.1)
        out, _ = proc.communicate(timeout=DEADLINE)
        assert proc.returncode == 0, out
    finally:
        stop_foreground(proc, mnt)


def _shufflefs_wrapper(tmp_path: Path) -> Path:
    """The mount helper needs one executable: run this interpreter's shufflefs."""
    w = tmp_path / "shufflefs-cmd"
    w.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m shufflefs "$@"\n')
    w.chmod(0o755)
    return w


@needs_fuse
def test_mount_helper_mounts(dataset, tmp_path):
    src, mnt, cache = dataset
    env = {**os.environ, "SHUFFLEFS": str(_shufflefs_wrapper(tmp_path)), "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run(
            [str(HELPER), str(src), str(mnt), "-o",
             f"rw,noauto,_netdev,user,strategy=full,seed=5,block_size=16KiB,cache_dir={cache}"],
            capture_output=True, text=True, env=env, timeout=DEADLINE,
        )
        assert r.returncode == 0, r.stderr
        stats = json.loads(os.getxattr(mnt, "user.shufflefs.stats"))
        assert stats["strategy"] == "full"
        assert sorted_lines((mnt / "data.jsonl").read_bytes()) == sorted_lines((src / "data.jsonl").read_bytes())
        r = shufflefs("umount", mnt)
        assert r.returncode == 0, r.stderr
    finally:
        cleanup_mount(mnt, None)


SYSTEM_HELPER = next((p for p in ("/sbin/mount.fuse.shufflefs", "/usr/sbin/mount.fuse.shufflefs") if os.path.exists(p)), None)


@needs_fuse
@pytest.mark.skipif(SYSTEM_HELPER is None or os.geteuid() != 0, reason="mount.fuse.shufflefs not installed, or not root")
def test_mount_t_fuse_shufflefs(dataset, tmp_path):
    src, mnt, cache = dataset
    env = {**os.environ, "SHUFFLEFS": str(_shufflefs_wrapper(tmp_path)), "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run(
            ["mount", "-t", "fuse.shufflefs", str(src), str(mnt), "-o", f"strategy=block,seed=2,cache_dir={cache}"],
            capture_output=True, text=True, env=env, timeout=DEADLINE,
        )
        assert r.returncode == 0, r.stderr
        assert json.loads(os.getxattr(mnt, "user.shufflefs.stats"))["strategy"] == "block"
        r = subprocess.run(["umount", str(mnt)], capture_output=True, text=True, timeout=DEADLINE)
        assert r.returncode == 0, r.stderr
    finally:
        cleanup_mount(mnt, None)


@needs_fuse
def test_demo(tmp_path):
    r = shufflefs("demo", "--dir", tmp_path / "demo")
    assert r.returncode == 0, r.stderr
    assert "epoch 0:" in r.stdout and "epoch 1:" in r.stdout
    mix = dict(re.findall(r"^\s+(source|epoch \d)\s+(.*)$", r.stdout, re.M))
    assert mix["source"] == "cat=100  dog=0  bird=0  fish=0"
    labels_in_view = [int(n) for n in re.findall(r"=(\d+)", mix["epoch 0"])]
    assert sum(labels_in_view) == 100 and sum(n > 0 for n in labels_in_view) >= 2, mix
    assert not (tmp_path / "demo" / "src").exists()  # removed without --keep
    assert not os.path.ismount(tmp_path / "demo" / "mnt")
