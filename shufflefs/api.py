"""Mounts from Python: `mount` starts the same background daemon as ``shufflefs mount``, and the
`Mount` it returns sets epochs and resume states, reads the stats and unmounts, as the
``shufflefs epoch``, ``stat`` and ``umount`` commands do.

The keyword options are turned into the command line's arguments and parsed and checked by the
command line's own parser and `shufflefs.cli.mount.mount_config` (a mistake raises `ValueError`
with the command's message), then `shufflefs.cli.mount.start_daemon` runs the daemon with those
arguments, so a mount made here is the one the command would make.  The daemon runs in its own
session: a crash of the calling script cannot take it down mid-request, and the handle unmounts
on leaving a ``with`` block, at `Mount.unmount` or at interpreter exit; the daemon itself
unmounts when the script's process is gone (killed by SIGKILL), so no mount outlives it.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn, Union

from .config import EPOCH_XATTR, MAX_EPOCH, MountConfig, STATS_XATTR

StrPath = Union[str, "os.PathLike[str]"]
ResumeInput = Union[bytes, str, "os.PathLike[str]", dict]

__all__ = ["Mount", "MountError", "mount"]

_NOT_KEYWORDS = ("help", "ready_fd", "owner_pid", "foreground")
"""Mount options with no keyword: ``-f`` would serve in this process, which `mount` never does."""


class MountError(RuntimeError):
    """A mount that failed to start, to take an epoch or resume state, or to unmount."""


class _RaisingParser(argparse.ArgumentParser):
    """The command line's parser, raising its usage errors instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ValueError((message or f"exit status {status}").strip())


def _long_name(action: argparse.Action) -> str:
    return max(action.option_strings, key=len)


def mount_argv(src: StrPath, mnt: StrPath, options: dict[str, Any]) -> list[str]:
    """``mount SRC MNT --opt=value ...``: the arguments ``shufflefs mount`` would be given for
    ``options`` (keywords: the long options in snake_case).  Raises TypeError for a keyword that
    is no option and ValueError for a flag that is not a bool; values are checked by the parser."""
    from .cli.parser import build_parser
    from .sources import scheme_of

    _, subs = build_parser()
    actions = {a.dest: a for a in subs["mount"]._actions if a.option_strings and a.dest not in _NOT_KEYWORDS}
    source = os.fspath(src)
    argv = ["mount", source if scheme_of(source) else os.path.abspath(source), os.path.abspath(os.fspath(mnt))]
    for key, value in options.items():
        action = actions.get(key)
        if action is None:
            known = ", ".join(sorted(actions))
            raise TypeError(f"mount() got an unexpected keyword argument {key!r} (mount options: {known})")
        if value is None:
            continue
        flag = _long_name(action)
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreConstAction)):
            if not isinstance(value, bool):
                raise ValueError(f"argument {flag}: must be true or false: {value!r}")
            argv += [flag] if value else []
        elif isinstance(action, argparse._CountAction):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"argument {flag}: must be an integer >= 0: {value!r}")
            argv += [flag] * value
        elif isinstance(action, argparse._AppendAction):
            values = [value] if isinstance(value, (str, os.PathLike)) else list(value)
            argv += [f"{flag}={os.fspath(v)}" for v in values]
        else:
            argv.append(f"{flag}={os.fspath(value) if isinstance(value, os.PathLike) else value}")
    return argv


def check_options(argv: list[str]) -> MountConfig:
    """Parse and check ``argv`` (`mount_argv`) as ``shufflefs mount`` does; raises ValueError with
    its message (also for a problem only the checks find: a mount point that is not empty, a
    cache directory inside the source...)."""
    from .cli.mount import mount_config
    from .cli.parser import build_parser

    parser, subs = build_parser(_RaisingParser)
    config, _ = mount_config(parser.parse_args(argv), subs["mount"])
    return config


def mount(src: StrPath, mnt: StrPath, **options: Any) -> Mount:
    """Mount ``src`` (a dataset directory or ``s3://BUCKET/PREFIX``) at ``mnt`` and return once the
    mount is ready.

    Args:
        src: the dataset, as ``shufflefs mount SRC``.
        mnt: an empty directory to mount on.
        **options: ``shufflefs mount``'s long options in snake_case, e.g. ``strategy="corgipile"``,
            ``seed=3``, ``block_size="64KiB"`` (or ``65536``), ``buffer="10%"``, ``rank=1``,
            ``world_size=2``, ``epoch=0``, ``cache_dir=...``, ``direct_io=True``; ``format`` and
            ``pool`` take a list.  Unset options take the command's defaults (``rank`` and
            ``world_size`` from ``RANK`` and ``WORLD_SIZE`` when set, as torchrun does).

    Returns:
        A `Mount`, also a context manager that unmounts on leaving the block.

    Raises:
        TypeError: a keyword that is no mount option.
        ValueError: a bad value or path, with ``shufflefs mount``'s message; nothing is mounted.
        MountError: the daemon did not mount (its output is in the message).
    """
    from .cli.mount import DaemonFailed, start_daemon

    argv = [*mount_argv(src, mnt, options), f"--owner-pid={os.getpid()}"]
    config = check_options(argv)
    try:
        proc = start_daemon(argv, config)
    except DaemonFailed as e:
        raise MountError(f"{e}" + (f":\n{e.output}" if e.output else "")) from None
    return Mount(str(config.mountpoint), proc, config)


class Mount:
    """A running mount started by `mount`: its epoch, resume state and stats, and its unmount.

    Unmounts on leaving a ``with`` block (also when the block raises), at `unmount`, or at
    interpreter exit if still mounted; and if the process that made it is killed outright
    (SIGKILL runs no exit handler), the daemon unmounts when it sees that process gone.
    """

    def __init__(self, mountpoint: str, proc: subprocess.Popen, config: MountConfig) -> None:
        self.mountpoint: Path = Path(mountpoint)
        """The mount point (absolute)."""
        self.config: MountConfig = config
        """The checked settings the daemon runs with."""
        self._proc = proc
        self._lock = threading.Lock()
        self._mounted = True
        self._owner = os.getpid()
        atexit.register(self._at_exit)

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        return self._proc.pid

    @property
    def mounted(self) -> bool:
        """False once `unmount` has run (or the mount is gone)."""
        return self._mounted

    def __repr__(self) -> str:
        state = "mounted" if self._mounted else "unmounted"
        return f"<shufflefs.Mount {self.config.source} on {self.mountpoint} ({state}, daemon pid {self.pid})>"

    def __fspath__(self) -> str:
        return str(self.mountpoint)

    def __enter__(self) -> Mount:
        return self

    def __exit__(self, *exc: object) -> None:
        self._unmount_anyway()

    # ------------------------------------------------------------------ epochs and state

    @property
    def epoch(self) -> int:
        """The epoch of the mount's root (every file without an epoch of its own)."""
        from .cli.common import _parse_epoch, get_xattr

        return _call(lambda: _parse_epoch(get_xattr(str(self.mountpoint), EPOCH_XATTR).strip(), str(self.mountpoint)))

    @epoch.setter
    def epoch(self, n: int) -> None:
        self.set_epoch(n)

    def set_epoch(self, n: int) -> None:
        """Show epoch ``n``'s order in every file opened from now on (files already open keep
        theirs); clears a resume state, as ``shufflefs epoch MNT N`` does."""
        from .cli.epoch import _refused
        from .fs import control

        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_EPOCH:
            raise ValueError(f"epoch {n!r}: not an epoch: an integer from 0 to {MAX_EPOCH}")
        path = str(self.mountpoint)

        def set_it() -> None:
            try:
                control.set_xattr(path, EPOCH_XATTR, str(n).encode())
            except OSError as e:
                raise _refused(e, path, EPOCH_XATTR) from None

        _call(set_it)

    def resume(self, state: ResumeInput, epoch: int | None = None) -> int:
        """Resume an epoch after a stop, as ``shufflefs epoch MNT N --resume STATE`` does: every
        view shows the records of the state's epoch that its layouts did not consume, as this
        rank's share.

        Args:
            state: the state (`shufflefs.torch.Progress.state_dict`'s dict, or its JSON as bytes
                or str), or the path of a JSON file holding it.
            epoch: if given, the epoch the state must be of.

        Returns:
            The resumed epoch.
        """
        from .cli.epoch import resume

        if isinstance(state, dict):
            text, source = json.dumps(state).encode(), "the resume state"
        elif isinstance(state, bytes):
            text, source = state, "the resume state"
        elif isinstance(state, str) and state.lstrip().startswith("{"):
            text, source = state.encode(), "the resume state"
        elif isinstance(state, (str, os.PathLike)):
            source = os.fspath(state)
            try:
                text = Path(source).read_bytes()
            except OSError as e:
                raise ValueError(f"{source}: cannot read the resume state: {e.strerror}") from None
        else:
            raise TypeError(f"a resume state is a dict, JSON bytes or str, or a file's path: {type(state).__name__}")
        return _call(lambda: resume(str(self.mountpoint), text, epoch, source))

    def stat(self) -> dict[str, Any]:
        """The mount's settings and counters (``user.shufflefs.stats``, as ``shufflefs stat
        --json`` prints them)."""
        from .cli.common import CliError, get_xattr

        def read() -> dict[str, Any]:
            raw = get_xattr(str(self.mountpoint), STATS_XATTR)
            try:
                return dict(json.loads(raw))
            except ValueError:
                raise CliError(f"{self.mountpoint}: unreadable stats: {raw[:200]!r}") from None

        return _call(read)

    # ------------------------------------------------------------------ unmount

    def unmount(self, lazy: bool = False, timeout: float = 10.0) -> None:
        """Unmount and wait up to ``timeout`` seconds for the daemon to exit, as ``shufflefs
        umount`` does (``lazy``: detach now even if files are open; the daemon exits when the
        last one closes).  Does nothing once unmounted.  Raises MountError if the mount is busy
        (a file open or a working directory under it) and ``lazy`` is false."""
        from .cli.umount import unmount
        from .fs import control

        with self._lock:
            if not self._mounted:
                return
            path = str(self.mountpoint)
            if control.is_shufflefs(path):
                _call(lambda: unmount(path, lazy, timeout))
            self._mounted = False
            atexit.unregister(self._at_exit)
            if not lazy:
                self._reap(timeout)

    def _reap(self, timeout: float) -> None:
        """Collect the daemon's exit status (it is this process's child): no zombie is left."""
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def _unmount_anyway(self) -> None:
        """Unmount; if files under the mount are still open (a block that raised while reading),
        detach it lazily rather than leave it mounted."""
        try:
            self.unmount()
        except MountError:
            self.unmount(lazy=True)

    def _at_exit(self) -> None:
        if os.getpid() != self._owner:  # a forked child that exits normally: the mount is its parent's
            return
        try:
            self._unmount_anyway()
        except MountError as e:
            print(f"shufflefs: could not unmount {self.mountpoint} at exit: {e}", file=sys.stderr)


def _call(fn: Any) -> Any:
    """``fn()`` with the command line's errors raised as ValueError (usage) or MountError."""
    from .cli.common import EXIT_USAGE, CliError

    try:
        return fn()
    except CliError as e:
        if e.code == EXIT_USAGE:
            raise ValueError(str(e)) from None
        raise MountError(str(e)) from None
