"""``shufflefs mount``: validate everything, then serve in the foreground or start a background daemon."""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from ..config import (
    MountConfig,
    cache_unwritable,
    check_own_dir,
    check_paths,
)
from ..index.table import default_cache_dir
from ..sources import misspelled_url, scheme_of
from ..strategies.base import OBJECT_BLOCK_MIN, OBJECT_BUFFER_BLOCKS, ShuffleSpec, object_block_size
from .common import EXIT_FAIL, EXIT_OK, PROG, _inside
from .options import MOUNT_KEYS, STORE_KEYS, Resolved, _cli_name, resolve_options

def _check_writable_dir(path: Path, what: str, parser: argparse.ArgumentParser) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(f"{what} {str(path)!r}: {e.strerror}")
    if not os.access(path, os.W_OK | os.X_OK):
        parser.error(f"{what} {str(path)!r} is not writable")


def _cache_dir(given: Path | None, source: Path, parser: argparse.ArgumentParser) -> Path:
    """The cache directory to use (given, or the user's default), checked to lie outside the
    source tree (which is never written), to be the user's own (`check_own_dir`) and writable
    (``shufflefs index`` and ``inspect`` exist to write it)."""
    cache_dir = Path(given) if given is not None else default_cache_dir()
    real, src = os.path.realpath(cache_dir), os.path.realpath(source)
    which = "cache directory" if given is not None else "default cache directory"
    if real == src or _inside(real, src):
        fix = "choose a --cache-dir outside it" if given is not None else "give a --cache-dir outside it"
        parser.error(f"{which} {str(cache_dir)!r} is inside the source {str(source)!r}, which is never "
                     f"written: {fix}")
    problem = check_own_dir(cache_dir, which, "--cache-dir")
    if problem:
        parser.error(problem)
    _check_writable_dir(cache_dir, "cache directory", parser)
    return cache_dir


def _check_strategy(spec: ShuffleSpec, parser: argparse.ArgumentParser) -> None:
    from ..strategies import check_spec

    try:
        check_spec(spec)
    except ValueError as e:
        parser.error(f"strategy {spec.strategy!r}: {e}")


def _stage_dir(given: Path | None, spec: ShuffleSpec, src: Path | str, mnt: Path,
               parser: argparse.ArgumentParser) -> Path | None:
    """``--stage-dir``, checked: pls only, outside the source and the mount, writable."""
    if given is None:
        return None
    if spec.strategy != "pls":
        parser.error(f"--stage-dir keeps a rank's pls partition: it needs --strategy pls, not {spec.strategy!r}")
    from ..windows.view import _build_window

    if _build_window is None:
        parser.error("--stage-dir needs the compiled gather module (shufflefs/_gather.c); reinstall shufflefs")
    real = Path(os.path.realpath(given))
    for inside, what in ((src, "the source, which is never written"), (mnt, "the mount point")):
        if isinstance(inside, Path) and (real == inside or _inside(str(real), str(inside))):
            parser.error(f"stage directory {str(given)!r} is inside {what}")
    _check_writable_dir(real, "stage directory", parser)
    return real


def mount_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[MountConfig, Resolved]:
    """Validate every mount option; exits with a usage error (2) on the first problem."""
    problem = misspelled_url(args.source)
    if problem:
        parser.error(problem)
    opts = resolve_options(args, MOUNT_KEYS, parser)
    v = opts.values
    remote = bool(scheme_of(args.source))
    src = args.source if remote else Path(os.path.realpath(args.source))
    mnt = Path(os.path.realpath(args.mountpoint))
    if scheme_of(args.source) == "s3":
        from ..sources.s3 import parse_url

        try:
            parse_url(args.source)
        except ValueError as e:
            parser.error(str(e))
    store_options = {kw: v[key] for key, kw in STORE_KEYS.items() if v[key] is not None} if remote else {}
    if not remote:
        given = [_cli_name(key) for key in STORE_KEYS if getattr(args, key, None) is not None]
        if given:
            parser.error(f"{', '.join(given)}: only for object-store sources (s3://BUCKET/PREFIX)")
        if v["index_dir"] is not None:
            if not os.path.isdir(v["index_dir"]):
                parser.error(f"--index-dir {str(v['index_dir'])!r} is not a directory")
            store_options = {"index_dir": os.path.realpath(v["index_dir"])}
    elif v["index_dir"] is not None:
        parser.error("--index-dir is for local sources; an s3:// source's published indexes are in the "
                     "bucket (--index-url)")
    block_floor = None
    if remote and v["block_size"] is None:  # one GET per block: sized by the buffer (`object_block_size`)
        if isinstance(v["buffer"], int):
            v["block_size"] = object_block_size(v["buffer"])
        else:  # a share of each file: automatic per file, as on disk, but a GET of a MiB at least
            block_floor = OBJECT_BLOCK_MIN
    if v["rank"] >= v["world_size"]:
        parser.error(f"--rank {v['rank']} must be smaller than --world-size {v['world_size']}")
    if v["direct_io"] and v["page_cache"]:
        parser.error("--direct-io and --page-cache: one or the other (neither: chosen per view)")
    spec = ShuffleSpec(
        strategy=v["strategy"], seed=v["seed"], block_size=v["block_size"], buffer=v["buffer"],
        page_size=v["page_size"], even=v["even"], exchange=v["exchange"], pls_local=v["pls_local"],
        balance=bool(v["balance"] or v["balance_field"]), balance_field=v["balance_field"],
        random_level=v["random_level"], block_floor=block_floor,
    )
    _check_strategy(spec, parser)
    cache_dir = Path(v["cache_dir"]) if v["cache_dir"] is not None else default_cache_dir()
    spec, floor_note = _block_floor(spec, src, cache_dir, v["world_size"]) if not remote else (spec, None)
    if remote and block_floor is not None:
        floor_note = (f"automatic blocks are at least {block_floor >> 20} MiB on object storage (a ranged GET each; "
                      f"a --buffer in bytes takes 1/{OBJECT_BUFFER_BLOCKS} of it)")
    problem = check_paths(MountConfig(args.source if remote else Path(args.source), Path(args.mountpoint),
                                      cache_dir=cache_dir if v["cache_dir"] is not None else None, stage_dir=v["stage_dir"]))
    if problem:
        parser.error(problem)
    unwritable = cache_unwritable(cache_dir)  # not an error: the daemon keeps new indexes itself
    if v["log_file"] is not None:
        log = v["log_file"]
        if _inside(str(log), str(mnt)) or (not remote and _inside(str(log), str(src))):
            parser.error(f"log file {str(log)!r} must be outside the source and the mount point")
        try:
            with open(log, "a"):
                pass
        except OSError as e:
            parser.error(f"log file {str(log)!r}: {e.strerror}")
    stage_dir = _stage_dir(v["stage_dir"], spec, src, mnt, parser)
    config = MountConfig(
        source=src, mountpoint=mnt, spec=spec, epoch=v["epoch"], rank=v["rank"], world=v["world_size"],
        rules=opts.rules, format_defaults=opts.format_defaults, cache_dir=cache_dir,
        pool=not v["no_pool"], pool_globs=opts.pools, mixes=opts.mixes, stage_dir=stage_dir, verify=v["verify"],
        source_cache=v["source_cache"], decoded_copies=v["decoded_copies"], passthrough=v["passthrough"],
        stage_wait=v["stage_wait"],
        store_options=store_options, direct_io=v["direct_io"],
        page_cache=bool(v["page_cache"]), block_floor_note=floor_note,
        compiled_replies=not v["python_replies"], reply_threads=v["reply_threads"],
        allow_other=bool(v["allow_other"]), epoch_setters=v["epoch_setters"],
        cache_warning=None if unwritable is None else (f"cache directory {cache_dir} cannot be written "
                                                       f"({unwritable}): indexes built by this mount are "
                                                       "kept only until it ends"),
    )
    if v["no_pool"] and opts.pools:
        parser.error("--pool declares a set but --no-pool turns pooling off")
    if config.allow_other and os.geteuid() != 0 and not user_allow_other():
        parser.error(f"--allow-other: only root may mount for other users unless {FUSE_CONF} has a line "
                     "'user_allow_other'")
    return config, opts


FUSE_CONF = "/etc/fuse.conf"


def user_allow_other(path: str = FUSE_CONF) -> bool:
    """Whether fusermount3 lets users other than root mount with ``allow_other``."""
    try:
        with open(path) as f:
            return any(line.split("#", 1)[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def _block_floor(spec: ShuffleSpec, src: Path, cache_dir: Path, world: int) -> tuple[ShuffleSpec, str | None]:
    """``spec`` with the floor of its automatic block size from ``shufflefs advise``'s measurement
    of the source's device (saved in ``cache_dir/advise``), and a line saying so; unchanged with
    a block size given, with no measurement, and with several ranks, which must all cut the same
    blocks whatever each machine measured."""
    if spec.block_size is not None:
        return spec, None
    from ..advise.cache import measured_block_floor

    floor = measured_block_floor(str(src), cache_dir / "advise")
    if floor is None:
        return spec, None
    if world > 1:
        return spec, (f"a measurement of this device gives a {floor >> 10} KiB floor for automatic blocks, not "
                      f"used with --world-size {world} (every rank must cut the same blocks): give --block-size "
                      "on every rank to use it")
    return replace(spec, block_floor=floor), (f"automatic blocks are at least {floor >> 10} KiB, as "
                                              f"'shufflefs advise' measured this device (in {cache_dir / 'advise'})")


def cmd_mount(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> int:
    config, opts = mount_config(args, parser)
    v = opts.values
    log_file = str(v["log_file"]) if v["log_file"] is not None else None
    if v["foreground"] or args.ready_fd is not None:
        if args.owner_pid is not None:
            _end_with(args.owner_pid)
        return run_foreground(config, args.ready_fd, log_file, v["verbose"])
    if config.cache_warning:  # the daemon logs it where its output goes, perhaps nowhere
        print(f"{PROG} mount: warning: {config.cache_warning}", file=sys.stderr)
    return start_background(argv, config, v["verbose"])


def run_foreground(config: MountConfig, ready_fd: int | None, log_file: str | None, verbosity: int) -> int:
    from ..fs import daemon

    if ready_fd is not None:
        # Started by `start_background`: never pin the caller's working directory, and stop
        # writing to the start-up capture file once the parent has stopped reading it.
        os.chdir("/")
        ready_fd = _relay_ready(ready_fd, log_file)
    return daemon.run(config, ready_fd=ready_fd, log_file=log_file, verbosity=verbosity)


def _end_with(pid: int) -> None:
    """End this daemon as SIGTERM does (unmount, exit 0) once process ``pid`` has ended, however
    it ended: a mount made by `shufflefs.mount` does not outlive its script, also one killed by
    SIGKILL, which runs no exit handler."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        fd = None

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])
        # not before the daemon handles SIGTERM (once mounted): the default action would end it
        # with the mount left behind, dead
        while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="owner-watch", daemon=True).start()


def _relay_ready(parent_fd: int, log_file: str | None) -> int:
    """Pass the daemon's "ready" on to the parent, first moving stdout/stderr off the capture file."""
    r, w = os.pipe()

    def relay() -> None:
        data = b""
        while b"ready" not in data:
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
        os.close(r)
        if b"ready" in data:
            sys.stdout.flush()
            sys.stderr.flush()
            out = os.open(log_file or os.devnull, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(out)
            os.write(parent_fd, b"ready\n")
        os.close(parent_fd)

    threading.Thread(target=relay, name="ready-relay", daemon=True).start()
    return w


_RUN_MODULE = ("import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
               "runpy.run_module('shufflefs', run_name='__main__', alter_sys=True)")


def daemon_python() -> list[str]:
    """``python -m shufflefs`` without the working directory on ``sys.path``: started from a
    folder holding a checkout (a ``shufflefs/`` package in the cwd), ``-m`` would import that
    folder's code instead of this one (without its compiled gather).  ``-P`` from Python 3.11."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", "shufflefs"]
    return [sys.executable, "-c", _RUN_MODULE]


class DaemonFailed(Exception):
    """The background daemon exited (or hung) before mounting: ``output`` is what it printed,
    ``code`` its exit status (`EXIT_FAIL` if it has none)."""

    def __init__(self, message: str, output: str, code: int) -> None:
        super().__init__(message)
        self.output, self.code = output, code


def start_daemon(argv: list[str], config: MountConfig) -> subprocess.Popen:
    """Run ``shufflefs mount -f ...`` (``argv``: the arguments from ``mount`` on, already checked
    by `mount_config`) in a new session and return it once it has mounted.  The one way both the
    command line and `shufflefs.mount` start a daemon.  Raises `DaemonFailed` if it does not mount;
    on KeyboardInterrupt the daemon is stopped before the interrupt goes on."""
    i = argv.index("mount")
    r, w = os.pipe()
    cmd = [*daemon_python(), "mount", "-f", "--ready-fd", str(w), *argv[i + 1:]]
    env = dict(os.environ)
    pkg_root = Path(__file__).resolve().parent.parent
    if pkg_root.name not in ("site-packages", "dist-packages"):  # a source checkout
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pkg_root), env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryFile() as capture:
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=capture, stderr=capture, pass_fds=(w,),
                start_new_session=True, env=env,
            )
        finally:
            os.close(w)
        try:
            ready = _wait_ready(r)
        except KeyboardInterrupt:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            raise
        finally:
            os.close(r)
        if ready:
            return proc
        try:
            rc = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        capture.seek(0)
        output = capture.read().decode(errors="replace").rstrip()
    status = "still running" if rc is None else f"exit status {rc}"
    raise DaemonFailed(f"the daemon failed to mount {config.mountpoint} ({status})", output, rc or EXIT_FAIL)


def start_background(argv: list[str], config: MountConfig, verbosity: int) -> int:
    """``shufflefs mount`` without ``-f``: `start_daemon`, reported on the terminal."""
    try:
        proc = start_daemon(argv, config)
    except KeyboardInterrupt:
        print(f"{PROG} mount: interrupted; the daemon was stopped", file=sys.stderr)
        return 130
    except DaemonFailed as e:
        if e.output:
            print(e.output, file=sys.stderr)
        print(f"{PROG} mount: error: {e}", file=sys.stderr)
        return e.code
    if verbosity:
        print(f"{PROG}: mounted {config.source} on {config.mountpoint} (daemon pid {proc.pid})")
    return EXIT_OK


def _wait_ready(fd: int) -> bool:
    data = b""
    while b"ready" not in data:
        chunk = os.read(fd, 64)
        if not chunk:
            return False
        data += chunk
    return True
