"""Mounting shufflefs for tests through real FUSE: source trees, a daemon per mount, and an
unmount that always happens (even when the test fails or the daemon hangs)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hypothesis import settings

# Property tests have no per-example deadline: a pass/fail test never depends on how busy the
# machine is (an example of the mixture draws took 244 ms on a loaded 2-core machine).
settings.register_profile("shufflefs", deadline=None)
settings.load_profile("shufflefs")

REPO = Path(__file__).resolve().parents[1]
MOUNT_TIMEOUT = 20.0
EXIT_TIMEOUT = 10.0


@dataclass(frozen=True)
class Link:
    """A symlink in a source tree written by `write_tree`."""

    target: str


def write_tree(root: Path, files: dict[str, bytes | str | Link | None]) -> Path:
    """Create ``root`` with ``files`` (relpath -> content; None makes an empty directory)."""
    root.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is None:
            path.mkdir(exist_ok=True)
        elif isinstance(content, Link):
            os.symlink(content.target, path)
        elif isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
    return root


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def shufflefs_mounts() -> list[str]:
    """Mountpoints of every fuse.shufflefs mount on the machine (from /proc/mounts)."""
    with open("/proc/mounts") as f:
        return [_unescape(p[1]) for p in (line.split() for line in f) if len(p) > 2 and p[2] == "fuse.shufflefs"]


def is_mounted(path: Path | str) -> bool:
    return os.path.abspath(path) in shufflefs_mounts()


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie counts: it no longer runs)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def children_of(pid: int, running: bytes = b"") -> list[int]:
    """The processes ``pid``'s threads started and have not been reaped, whose command line
    holds ``running`` (other tests may have left others)."""
    kids: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(x) for x in f.read().split()]
        except OSError:
            pass
    out = []
    for kid in kids:
        try:
            with open(f"/proc/{kid}/cmdline", "rb") as f:
                if running in f.read():
                    out.append(kid)
        except OSError:
            pass
    return out


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll ``check`` until it holds; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def bounded(code: str, *args: str, mnt: Path, timeout: float = 90.0) -> subprocess.CompletedProcess:
    """``code`` in a child Python; a child still running after ``timeout`` is a hang: the mount's
    FUSE connection is ended (every call waiting on it returns), the child killed, and the test
    fails, so that a regression cannot stall the run."""
    from shufflefs.fs import control

    child = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        control.abort(str(mnt))
        child.kill()
        child.communicate(timeout=30)
        pytest.fail(f"{code!r} {args} did not return within {timeout:g} s (the FUSE connection was aborted)")
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


class Mount:
    """One running ``shufflefs mount -f`` daemon."""

    def __init__(self, src: Path, mnt: Path, cache: Path, args: list[str], log: Path,
                 preexec: Callable[[], None] | None = None) -> None:
        self.src, self.mnt, self.cache, self.args, self.log = src, mnt, cache, args, log
        self.preexec = preexec  # run in the daemon's process before it starts (limits, ...)
        self.proc: subprocess.Popen | None = None
        self.returncode: int | None = None

    def start(self) -> "Mount":
        cmd = [sys.executable, "-m", "shufflefs", "mount", "-f", str(self.src), str(self.mnt),
               "--cache-dir", str(self.cache), *self.args]
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                                         cwd=str(self.cache.parent), preexec_fn=self.preexec)
        deadline = time.monotonic() + MOUNT_TIMEOUT
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None:
                pytest.fail(f"shufflefs exited with {self.proc.returncode} before mounting:\n{self.stderr()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"shufflefs did not mount within {MOUNT_TIMEOUT} s:\n{self.stderr()}")
            time.sleep(0.02)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stderr(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def path(self, rel: str = "") -> Path:
        return self.mnt / rel if rel else self.mnt

    def xattr(self, name: str, rel: str = "") -> str:
        return os.getxattr(self.path(rel), "user.shufflefs." + name).decode()

    def set_epoch(self, epoch: int | str, rel: str = "") -> None:
        os.setxattr(self.path(rel), "user.shufflefs.epoch", str(epoch).encode())

    def stats(self) -> dict:
        return json.loads(self.xattr("stats"))

    def wait(self, timeout: float = EXIT_TIMEOUT) -> int:
        assert self.proc is not None
        self.returncode = self.proc.wait(timeout)
        return self.returncode

    def stop(self) -> None:
        """Unmount and reap the daemon, escalating until nothing is left behind."""
        if self.proc is None:
            return
        if self.proc.poll() is None and is_mounted(self.mnt):
            r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, timeout=EXIT_TIMEOUT)
            if r.returncode != 0:  # busy: the daemon detaches the mount lazily on SIGTERM
                self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.returncode = self.proc.wait(EXIT_TIMEOUT)
        if is_mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], capture_output=True, timeout=EXIT_TIMEOUT)


class Mounter:
    """Starts mounts under one base directory and stops all of them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.mounts: list[Mount] = []

    def __call__(self, files: dict | None = None, *args: str, src: Path | None = None, name: str = "m",
                 preexec: Callable[[], None] | None = None) -> Mount:
        """Write ``files`` to a fresh source tree (or use ``src``) and mount it with ``args``
        (``preexec`` runs in the daemon's process before it starts)."""
        root = self.base / f"{name}{len(self.mounts)}"
        root.mkdir(parents=True)
        if src is None:
            src = write_tree(root / "src", files or {})
        mnt = root / "mnt"
        mnt.mkdir()
        m = Mount(src, mnt, root / "cache", list(args), root / "daemon.log", preexec)
        self.mounts.append(m)
        return m.start()

    def stop_all(self) -> None:
        errors = []
        for m in reversed(self.mounts):
            try:
                m.stop()
            except Exception as e:  # keep unmounting the others
                errors.append(e)
        if errors:
            raise errors[0]


QUICK = ("pure", "catalog")
"""The folders ``--quick`` runs: no FUSE mount, a couple of minutes."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quick", action="store_true",
                     help="run only the tests that mount nothing (tests/pure, tests/catalog): a couple of "
                          "minutes, for day-to-day work; CI runs the full suite")
    parser.addoption("--stress", action="store_true",
                     help="run the long versions of the fuzz, change, fault and load suites "
                          "(also SHUFFLEFS_STRESS=1)")


def stress_enabled(config: pytest.Config) -> bool:
    """Whether the long versions of the standing suites run (``--stress`` or ``SHUFFLEFS_STRESS``)."""
    return bool(config.getoption("--stress")) or os.environ.get("SHUFFLEFS_STRESS", "") not in ("", "0")


@pytest.fixture(scope="session")
def stress(request: pytest.FixtureRequest) -> bool:
    """True when the long versions run: tests scale their rounds, readers and examples by it."""
    return stress_enabled(request.config)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[Callable[..., Mount]]:
    """Factory: ``mount(files, *cli_args)`` -> a mounted `Mount`, unmounted at teardown."""
    m = Mounter(tmp_path)
    try:
        yield m
    finally:
        m.stop_all()


@pytest.fixture(scope="module")
def module_mount(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Mount]]:
    """Like `mount`, shared by the tests of a module (for read-only tests)."""
    m = Mounter(tmp_path_factory.mktemp("mounts"))
    try:
        yield m
    finally:
        m.stop_all()


@pytest.fixture(scope="session", autouse=True)
def private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Temporary files of daemons the tests kill on purpose (e.g. multiprocessing's forkserver
    socket directory) land in pytest's own temporary tree, which pytest removes."""
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmp_path_factory.mktemp("tmp"))
    tempfile.tempdir = None
    yield
    if old is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None


@pytest.fixture(scope="session", autouse=True)
def no_mount_left_behind(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After the session no shufflefs mount of ours may remain (others' mounts are not ours),
    nor a pid file of a daemon that is gone (tests kill daemons on purpose)."""
    from shufflefs.fs import control

    base = str(tmp_path_factory.getbasetemp())
    yield
    left = [p for p in shufflefs_mounts() if p.startswith(base + os.sep)]
    for p in left:
        subprocess.run(["fusermount3", "-u", "-z", p], capture_output=True)
    control.sweep_pid_files()
    assert not left, f"shufflefs mounts left behind: {left}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mounted tests need FUSE; skip them (with the reason) where it is missing.  ``--quick``
    keeps only the tests of `QUICK` folders."""
    if config.getoption("--quick"):
        quick = tuple(str(Path(__file__).parent / d) + os.sep for d in QUICK)
        keep = [i for i in items if str(i.path).startswith(quick)]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
    reason = None
    if not os.path.exists("/dev/fuse"):
        reason = "/dev/fuse is missing"
    elif shutil.which("fusermount3") is None:
        reason = "fusermount3 is not installed"
    if reason:
        for item in items:
            if "mount" in item.fixturenames or "module_mount" in item.fixturenames:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed mounted test shows its daemons' logs, so a failure seen once can be explained."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for fixture in ("mount", "module_mount"):
        mounter = getattr(item, "funcargs", {}).get(fixture)
        for m in getattr(mounter, "mounts", []):
            report.sections.append((f"daemon log {m.mnt}", m.stderr()[-20000:] or "(empty)"))
