"""Mount options as one value, and the parsing of sizes like ``4MiB`` and buffers like ``10%``."""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .strategies.base import ShuffleSpec

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}


XATTR_PREFIX = "user.shufflefs."
"""The extended attributes of a mount (read by the CLI and `shufflefs.torch`, served by `fs.fuse_ops`)."""
EPOCH_XATTR = XATTR_PREFIX + "epoch"
STATS_XATTR = XATTR_PREFIX + "stats"
PID_XATTR = XATTR_PREFIX + "pid"
RESUME_XATTR = XATTR_PREFIX + "resume"
"""On the mount root: the resume state of the mount's epoch (``shufflefs epoch MNT E --resume``):
its JSON, or ``@`` and the absolute path of a file holding it (a state over `RESUME_INLINE` bytes)."""
RESUME_INLINE = 60_000
"""The largest state sent as the attribute's value (the kernel takes values up to 64 KiB)."""
RESUME_FILE_MAX = 256 << 20
"""The largest resume state file a mount reads."""
MAX_EPOCH = 2**31 - 1
"""The largest epoch (the ``user.shufflefs.epoch`` attribute, ``--epoch``, ``shufflefs epoch``): as
many as a 32-bit signed counter holds, far beyond any training run, and small enough that every
plan's arithmetic on epochs stays exact."""
MAX_SEED = 2**63 - 1
MIN_BLOCK, MAX_BLOCK = 512, 1 << 30
"""``--block-size`` range (a block is read whole into memory, so it must fit many times over)."""
MIN_PAGE, MAX_PAGE = 512, 1 << 20
"""``--page-size`` range (a power of two)."""
MIN_BUFFER, MAX_SIZE = 4096, 1 << 40
MIN_BUFFER_FRACTION = 1e-4
"""The smallest ``--buffer`` share, 0.01%: below it a buffer holds a record or two."""
MAX_WORLD = 1 << 20
MIX_DIR = ".mix"
"""``MNT/.mix/NAME/`` holds the shards of mixture NAME (``[[mix]]`` in the config file).  Not
listed in ``MNT/``, so that readers walking the mount do not read the sources twice."""
MAX_MIX_SHARDS = 4096
PARTS_DIR = ".parts"
"""``MNT/.parts/K/i/`` mirrors the tree; each view there holds the i-th of K disjoint parts of
what the view at ``MNT/`` holds (one part per loader process).  Not listed in ``MNT/``."""


def parse_size(text: str | int) -> int:
    """``4MiB`` -> 4194304, ``1.5GB`` -> 1500000000, ``4096`` -> 4096; units are case-insensitive."""
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
        if not m or m.group(2).lower() not in _UNITS:
            raise ValueError(f"not a size: {text!r} (examples: 4096, 64KiB, 4MiB, 1GB)")
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def parse_buffer(text: str | int | float) -> int | float:
    """A buffer is bytes (``64MiB``) or a share of each file's record bytes (``10%``, ``0.1%``)."""
    if isinstance(text, float):
        frac = text
    elif isinstance(text, str) and text.strip().endswith("%"):
        try:
            frac = float(text.strip()[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"not a percentage: {text!r}") from None
    else:
        return parse_size(text)
    if not 0.0 < frac <= 1.0:
        raise ValueError(f"buffer percentage must be in (0%, 100%]: {text!r}")
    return frac


def format_size(n: int) -> str:
    """The shortest exact form `parse_size` reads back: ``4194304`` -> ``4MiB``."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{unit}"
    return str(n)


def format_buffer(buffer: int | float) -> str:
    return f"{buffer * 100:g}%" if isinstance(buffer, float) else format_size(buffer)


STAGE_WAIT = 1.0
"""Seconds an open of a Parquet view waits for its stage (``--stage-wait``).  Epoch jumps on a
file of 1.07 GiB (view 2.25 GiB), read with ``iter_batches``: read as written, the first row
group came after 0.30-0.47 s and the epoch after 2.45-2.70 s; waiting for the stage (built in
0.6-0.85 s), 0.78-0.94 s and 1.60-1.98 s (`serve.early_opens`)."""


@dataclass(frozen=True)
class MixSource:
    """One source of a mixture: the data files ``glob`` matches (as `FormatRule` globs match),
    drawn with ``weight``."""

    glob: str
    weight: float


@dataclass(frozen=True)
class MixSpec:
    """A mixture (``[[mix]]``): ``samples`` records per epoch (None: as many as its sources
    hold) drawn from ``sources`` in proportion to their weights, shown as ``shards`` files
    (None: one per source file)."""

    name: str
    sources: tuple[MixSource, ...]
    samples: int | None = None
    shards: int | None = None


@dataclass
class MountConfig:
    """Everything a mount needs; built by the CLI, read by the filesystem."""

    source: Path | str
    """A directory, or ``scheme://...`` of a store registered in `shufflefs.sources.STORES`."""
    mountpoint: Path
    spec: ShuffleSpec = field(default_factory=ShuffleSpec)
    epoch: int = 0
    rank: int = 0
    world: int = 1
    rules: list[Any] = field(default_factory=list)
    """`shufflefs.formats.FormatRule`s from ``--format`` and the config file, first match wins."""
    format_defaults: dict[str, Any] = field(default_factory=dict)
    """Parameters for formats chosen by extension, e.g. ``record_size`` and ``header_bytes``."""
    cache_dir: Path | None = None
    """Where indexes are cached; None means the user's cache directory."""
    pool: bool = True
    """Shuffle each set of shard files as one pool (`shufflefs.pools.shards`); False: every file alone."""
    pool_globs: list[str] = field(default_factory=list)
    """Declared sets: each glob pools the data files it matches (`pools.find_sets`)."""
    mixes: list[MixSpec] = field(default_factory=list)
    """Mixtures shown under ``MNT/.mix/`` (`pools.mixes`)."""
    stage_dir: Path | None = None
    """pls: keep the rank's partition of every file in stage files here (`shufflefs.stages.store`)."""
    store_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the source's store (an object store's endpoint, region, requests)."""
    verify: str = "frames"
    """``frames``: check every record's checksums (TFRecord) in every window as it is gathered;
    ``index``: only when the index is built."""
    source_cache: str = "auto"
    """``keep`` or ``drop`` a window's source pages once it is built; ``auto`` chooses per view
    (`sources.cache_mode`)."""
    decoded_copies: str = "auto"
    """``auto``: every compressed file gets a decoded copy, written by its index scan or made in the
    background, when the disk has room; ``needed``: only those that cannot be read otherwise
    (`stages.decoded`)."""
    passthrough: str = "auto"
    """``auto``: Parquet views are read by the kernel from a stage file (FUSE passthrough) where it
    can (`serve.passthrough`); ``off``: the daemon serves every read."""
    stage_wait: float = STAGE_WAIT
    """Seconds an open waits for its Parquet view's stage before reading it as it is written
    (`serve.early_opens`)."""
    direct_io: bool = False
    """Serve every view but npy and fixed-size ones with ``direct_io`` (no page cache): shared
    mappings of them fail with ENODEV.  False: every view goes through the page cache."""
    page_cache: bool = False
    """Serve every view through the page cache, also those `serve.serving` would serve with
    ``direct_io`` because their source does not stay cached."""
    compiled_replies: bool = True
    """Answer reads inside a handle's loaded window without entering Python (`shufflefs.replies`);
    False: Python answers every read."""
    reply_threads: int | None = None
    """Threads that write compiled replies (0: the FUSE loop's own thread); None: `REPLY_THREADS`."""
    allow_other: bool = False
    """Let users other than the owner reach the mount (FUSE ``allow_other``; the kernel checks
    every access against the source's modes, ``default_permissions``)."""
    epoch_setters: str = "owner"
    """Who may set epochs and resume states: ``owner`` (the daemon's user) and root, or ``any``
    (`serve.access`)."""
    block_floor_note: str | None = None
    """Where the floor of the automatic block size comes from when a measurement of the source's
    device was found (`advise.cache.measured_block_floor`): logged at mount and shown by stat."""
    cache_warning: str | None = None
    """Why ``cache_dir`` cannot be written (`cache_unwritable`) and where new indexes go instead,
    or None: set by the command line (a background mount prints it) and by the daemon (its log,
    ``shufflefs stat``)."""


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin",
                "/snap", "/sys", "/usr")
"""Never a cache or stage directory, nor anything beneath them: the system's own files."""
SYSTEM_DIRS = ("/", "/home", "/media", "/mnt", "/opt", "/run", "/srv", "/var", "/var/cache", "/var/lib",
               "/var/log", "/var/spool")
"""Never a cache or stage directory themselves (a directory of one's own beneath them may be)."""


def check_own_dir(path: str | os.PathLike, what: str, option: str) -> str | None:
    """Why the daemon must not write its files (indexes, stages) in ``path``, or None.

    Not a system directory: a daemon run as root would write ``/etc/ab/....npz``.  Not an
    existing directory of another user: they could replace what it holds (with links, say) or
    read what it writes; a directory that does not exist yet is made by the daemon, for itself.
    Links are followed first (``~/cache -> /etc`` is /etc)."""
    real = os.path.realpath(path)
    tree = next((t for t in SYSTEM_TREES if _inside(real, t)), None)
    if tree is not None or real in SYSTEM_DIRS:
        return (f"{what} {path} is {'in ' if tree not in (None, real) else ''}the system directory "
                f"{tree or real}: choose a directory of your own with {option}")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{what} {path}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{what} {path} is not a directory"
    if st.st_uid != os.geteuid():
        return (f"{what} {path} belongs to {_user(st.st_uid)}, not to {_user(os.geteuid())} who runs the "
                f"daemon: choose a directory of your own with {option}")
    return None


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (KeyError, ImportError):
        return f"uid {uid}"


def cache_unwritable(cache_dir: str | os.PathLike) -> str | None:
    """Why indexes cannot be written to ``cache_dir`` (made if missing), or None if they can."""
    try:
        os.makedirs(cache_dir, exist_ok=True)
    except OSError as e:
        return f"cannot create it: {e.strerror}"
    if not os.access(cache_dir, os.W_OK | os.X_OK):
        try:
            return "read-only file system" if os.statvfs(cache_dir).f_flag & os.ST_RDONLY else "not writable"
        except OSError as e:
            return e.strerror
    return None


def check_paths(config: MountConfig) -> str | None:
    """What is wrong with the source, mount point, cache or stage directory, or None.

    Shared by the command line (a usage error before any process starts) and the daemon (so that
    `daemon.run` is safe to call directly).  A daemon must never reach into its own mount (it
    would wait on itself) and never write into the source.
    """
    from .sources import STORES, scheme_of

    scheme = scheme_of(str(config.source))
    if scheme:
        if scheme not in STORES:
            known = ", ".join(f"{s}://" for s in sorted(STORES) if s) or "none but local directories"
            return f"source {config.source}: unknown scheme {scheme}:// (known: {known})"
        return _check_mountpoint(config, None)
    src = Path(config.source)
    if not src.exists():
        return f"source {src} does not exist"
    if not src.is_dir():
        return f"source {src} is not a directory"
    try:
        os.listdir(src)
    except OSError as e:
        return f"cannot read source {src}: {e.strerror}"
    return _check_mountpoint(config, src)


def _check_mountpoint(config: MountConfig, src: Path | None) -> str | None:
    """`check_paths` for the mount point and the cache directory; ``src``: a local source."""
    from .index.table import default_cache_dir

    mnt = Path(config.mountpoint)
    try:
        if not mnt.exists():
            return f"mount point {mnt} does not exist (create an empty directory)"
        if not mnt.is_dir():
            return f"mount point {mnt} is not a directory"
    except OSError as e:
        hint = f" (a dead mount? run: shufflefs umount {mnt})" if e.errno == errno.ENOTCONN else ""
        return f"mount point {mnt}: {e.strerror}{hint}"
    rsrc, rmnt = (os.path.realpath(src) if src is not None else None), os.path.realpath(mnt)
    if rsrc == rmnt:
        return "source and mount point are the same directory"
    if rsrc is not None and _inside(rmnt, rsrc):
        return f"mount point {mnt} is inside the source {src}; the mount would contain itself"
    if rsrc is not None and _inside(rsrc, rmnt):
        return f"source {src} is inside the mount point {mnt}"
    if os.path.ismount(mnt):
        return f"mount point {mnt} is already a mount point (unmount it first: shufflefs umount {mnt})"
    try:
        if os.listdir(mnt):
            return f"mount point {mnt} is not empty"
    except OSError as e:
        return f"mount point {mnt}: {e.strerror}"
    cache_dir = config.cache_dir if config.cache_dir is not None else default_cache_dir()
    rcache = os.path.realpath(cache_dir)
    if rsrc is not None and _inside(rcache, rsrc):
        fix = "give a --cache-dir outside it" if config.cache_dir is None else "choose a --cache-dir outside it"
        which = "the default cache directory" if config.cache_dir is None else "--cache-dir"
        return f"{which} {cache_dir} is inside the source {src}, which is never written: {fix}"
    if _inside(rcache, rmnt):
        return f"cache directory {cache_dir} is inside the mount point {mnt}"
    problem = check_own_dir(cache_dir, "cache directory", "--cache-dir")
    if problem is None and config.stage_dir is not None:
        problem = check_own_dir(config.stage_dir, "stage directory", "--stage-dir")
    return problem
