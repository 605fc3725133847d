"""The extended attributes a mount shows (``user.shufflefs.*``) and its state for ``stat``.

The epoch attribute, and on the root the resume state, are the writable ones; the others
describe a view's plan (built if needed), or the mount (on the root).  ``user.shufflefs.error`` of a file is the last error a
reader of its path got (`stats.PathErrors`), listed only while there is one, so that the reason
for an errno is one ``getfattr`` away instead of in the daemon's log."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
from typing import Any

from ..config import (
    EPOCH_XATTR,
    MAX_EPOCH,
    PID_XATTR,
    RESUME_FILE_MAX,
    RESUME_XATTR,
    STATS_XATTR,
    XATTR_PREFIX,
    format_buffer,
)
from ..errors import ShuffleError
from ..index.table import default_cache_dir
from ..strategies.base import AUTO_BLOCK_FLOOR
from ..strategies.resume import ResumeError, ResumeState
from ..windows.view import GATHER
from . import access, order_info
from .access import OWNER, Caller
from .catalog import Catalog
from .mix_tree import in_mix_tree
from .nodes import DIR, FILE, ROOT, VIEW, Node, Reply
from .parquet_views import copy_of
from .stats import fit as fit_stats
from .workers import Timeout

log = logging.getLogger("shufflefs")

MIX_MEMBERS_SHOWN = 40_000
"""Bytes of file names a mixture shard's ``user.shufflefs.info`` lists at most (values stop at 64 KiB)."""

X_EPOCH, X_STATS, X_PID = EPOCH_XATTR.encode(), STATS_XATTR.encode(), PID_XATTR.encode()
X_RESUME = RESUME_XATTR.encode()
X_ERROR = (XATTR_PREFIX + "error").encode()
VIEW_ATTRS = [X_EPOCH] + [
    (XATTR_PREFIX + n).encode()
    for n in ("strategy", "seed", "records", "windows", "format", "block_size", "buffer", "info")
]
ROOT_ATTRS = [X_EPOCH, X_STATS, X_PID]
OURS = frozenset(VIEW_ATTRS + ROOT_ATTRS + [X_ERROR, X_RESUME])
EPOCH_VALUE = re.compile(rb"(0|[1-9][0-9]{0,9})\n?")
"""An epoch as the attribute reads back (decimal, no sign, no leading zero), plus at most one
trailing newline (``echo N > ...``-style tools add one).  Nothing else: a value such as ``" 1"``
or ``"01"`` is more likely a mistake in a script than an epoch."""


def names(node: Node, cat: Catalog | None = None) -> list[bytes]:
    """The node's attributes; with ``cat``, also ``user.shufflefs.error`` while its path has one."""
    if node.ino == ROOT:
        return list(ROOT_ATTRS) + ([X_RESUME] if cat is not None and cat.epochs.resume is not None else [])
    if node.kind == DIR:
        return [X_EPOCH]
    failed = [X_ERROR] if cat is not None and node.relpath in cat.stats.paths else []
    if node.kind == VIEW:
        return list(VIEW_ATTRS) + failed
    return failed if node.kind == FILE else []


async def get(cat: Catalog, node: Node, name: bytes, caller: Caller = OWNER) -> bytes:
    """ENODATA for a name the node does not have; the resume state and the stats' file names
    only for those `access` allows."""
    if name == X_ERROR and node.kind in (VIEW, FILE):
        line = cat.stats.paths.get(node.relpath)
        if line is None:
            raise Reply(errno.ENODATA)
        return line.encode()
    if name not in names(node, cat):
        raise Reply(errno.ENODATA)
    if name == X_RESUME:
        if not access.may_set(caller, cat.config.epoch_setters):
            raise Reply(errno.EACCES)
        return cat.epochs.resume.to_json().encode()
    if name == X_EPOCH:
        return str(cat.epochs.shown(node)).encode()
    if name == X_PID:
        return str(os.getpid()).encode()
    if name == X_STATS:
        return fit_stats(describe(cat, details=access.trusted(caller)))
    spec = cat.spec
    field = name.decode()[len(XATTR_PREFIX):]
    simple = {"strategy": spec.strategy, "seed": spec.seed, "format": node.fmt.name, "buffer": format_buffer(spec.buffer)}
    if field in simple:
        return str(simple[field]).encode()
    try:
        plan = await cat.planner.plan(node)
    except (ShuffleError, OSError) as e:
        raise cat.fail("getxattr", node.relpath, node.epoch, None, e) from None
    if field == "records":  # the records this view holds (a rank's or a part's share)
        return str(int(plan.window_records.sum())).encode()
    if field == "windows":
        return str(plan.n_windows).encode()
    if field == "block_size":  # the file's own when automatic
        return str(plan.spec.block_size).encode()
    info = {
        **plan.describe(),
        "path": node.relpath,
        "view_records": int(plan.window_records.sum()),
        "format": node.fmt.name,
        "format_params": node.fmt.params(),
        "block_size_auto": spec.block_size is None,
        "buffer": format_buffer(spec.buffer),
        "source_size": node.stamp.size,
        "view_size": node.size,
    }
    info.update(await order_info.fields(cat, node, plan))  # effective block size and buffer, label mix
    if node.fmt.codec is not None:  # how a compressed file's records are read: restart points or a copy
        info["compressed"] = {"served_as": f"{node.fmt.codec} container of uncompressed blocks",
                              **cat.planner.decoding.describe_view(node.index, cat.store.path(node.relpath))}
    if node.fmt.name == "parquet":  # its row groups, and its file's decoded copy
        info["parquet"] = cat.views.parquet.describe_view(copy_of(cat.store, node), node.layout)
        stage = getattr(node.view.view, "stage", None) if node.view is not None else None
        if stage is not None:  # read by the kernel (`serve.passthrough`)
            info["parquet"]["stage"] = {"bytes": stage.size, "seconds": round(stage.seconds, 3), "made": stage.made}
    if node.pool is not None:
        info.update(pool=node.pool.pool.key, pool_shards=node.pool.shards, pool_declared=node.pool.pool.declared)
        if node.pool.mix is not None:
            mix = node.pool.mix
            info.update(mixture=mix.spec.name, mixture_files=len(mix.members), mixture_samples=mix.spec.samples,
                        mixture_sources=[[s.glob, s.weight] for s in mix.spec.sources], mixture_firsts=list(mix.firsts))
            if sum(len(m) + 4 for m in mix.members) < MIX_MEMBERS_SHOWN:  # for `shufflefs inspect`
                info["mixture_members"] = list(mix.members)
    return json.dumps(info, sort_keys=True, default=str).encode()


async def set(cat: Catalog, node: Node, name: bytes, value: bytes, caller: Caller = OWNER) -> None:  # noqa: A001
    """Only the epoch, and on the root the resume state, can be set (EINVAL for a value that is
    none; EPERM for a caller `access` does not allow); ours are EPERM, others EROFS (the mount is
    read-only)."""
    if name in (X_EPOCH, X_RESUME) and not access.may_set(caller, cat.config.epoch_setters):
        log.warning("%s of /%s not set: uid %d may not set it (only %s may: --epoch-setters)",
                    name.decode(), node.relpath, caller.uid, access.who_may_set(cat.config.epoch_setters))
        raise Reply(errno.EPERM)
    if name == X_RESUME and node.ino == ROOT:
        state = await parse_resume(cat, value, caller)
        cat.set_resume(node, state)
        return
    if name != X_EPOCH:
        raise Reply(errno.EPERM if name in OURS else errno.EROFS)
    cat.set_epoch(node, parse_epoch(value, node.relpath))


async def parse_resume(cat: Catalog, value: bytes, caller: Caller = OWNER) -> ResumeState:
    """A resume state: its JSON, or ``@`` and the absolute path of a regular file holding it,
    read and parsed on a worker thread with a deadline (`access.read_state_file`: never in this
    mount).  Every view it names must be a file of the mount.  EINVAL with a log line saying what
    is wrong (the writer sees only the errno); EACCES for ``@`` from a caller other than the
    owner and root, whose rights the daemon cannot read with."""
    where = "the attribute's value"
    if value.startswith(b"@"):
        where = os.fsdecode(value[1:].rstrip(b"\n"))
        if not access.trusted(caller):
            log.error("%s: resume state file %s refused: uid %d is neither the mount's owner nor root, and the "
                      "daemon reads files with its own rights (send the state itself)", RESUME_XATTR, where, caller.uid)
            raise Reply(errno.EACCES)
    try:
        state = await cat.workers.run(_read_state, value, where, cat.mountpoint)
    except Timeout as e:
        log.error("%s: resume state file %s refused: %s (a path leading into this mount, or a hung "
                  "filesystem)", RESUME_XATTR, where, e)
        raise Reply(errno.EINVAL) from None
    except (OSError, ValueError) as e:
        log.error("%s: invalid resume state file %s: %s", RESUME_XATTR, where, e)
        raise Reply(errno.EINVAL) from None
    except ResumeError as e:
        log.error("%s: invalid resume state (%s): %s", RESUME_XATTR, where, e)
        raise Reply(errno.EINVAL) from None
    missing = await cat.workers.run(_missing_views, cat, list(state.views))
    if missing:
        shown = ", ".join(repr(p) for p in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        log.error("%s: invalid resume state (%s): it names %s, not a file of this mount", RESUME_XATTR, where, shown)
        raise Reply(errno.EINVAL)
    return state


def _read_state(value: bytes, where: str, mountpoint: str) -> ResumeState:
    """Blocking: the state of an attribute's value (a file's for ``@PATH``)."""
    text = value
    if value.startswith(b"@"):
        text = access.read_state_file(where, mountpoint, RESUME_FILE_MAX)
    return ResumeState.from_json(text, MAX_EPOCH)


def _missing_views(cat: Catalog, paths: list[str]) -> list[str]:
    """Blocking: the paths of ``paths`` that are no regular file of the source (or no mixture's
    shard): a state naming them would resume nothing there, silently."""
    missing = []
    for relpath in paths:
        try:
            if in_mix_tree(relpath):
                found = cat.mixes is not None and cat.mixes.probe(relpath) is not None
            else:
                found = stat.S_ISREG(cat.store.stat(relpath).st_mode)
        except (OSError, ValueError):  # gone, a link on the way, a name no file system can hold
            found = False
        if not found:
            missing.append(relpath)
    return missing


def parse_epoch(value: bytes, where: str = "") -> int:
    """`EPOCH_VALUE` in [0, MAX_EPOCH], else EINVAL with a log line (the writer sees only the errno)."""
    m = EPOCH_VALUE.fullmatch(value)
    if m is None or int(m.group(1)) > MAX_EPOCH:
        log.warning("epoch of /%s not set: %r is not an epoch (a decimal from 0 to %d without sign, spaces "
                    "or leading zeros, optionally one trailing newline)", where, value[:40], MAX_EPOCH)
        raise Reply(errno.EINVAL)
    return int(m.group(1))


def remove(node: Node, name: bytes) -> None:
    ours = name in names(node) or name == X_RESUME and node.ino == ROOT or (name == X_ERROR and node.kind in (VIEW, FILE))
    raise Reply(errno.EPERM if ours else errno.ENODATA)


def _exchange_counts(cat: Catalog) -> dict[str, str]:
    """pls: what each view of the current epoch with a plan kept and received this epoch."""
    out = {}
    for node in cat.tree.nodes.values():
        if node.kind == VIEW and node.plan is not None and node.parts == 1 \
                and node.epoch == cat.epochs.of(node.epoch_path):
            d = node.plan.describe()
            if d.get("resumed"):
                continue
            out[node.relpath] = (f"epoch {node.epoch}: kept {d['kept']} received {d['received']} "
                                 f"sent {d['sent']} of {d['partition_records']}")
    return dict(sorted(out.items()))


DETAILS = ("few_blocks", "small_buffers", "pls_exchange", "epoch_overrides", "last_errors", "staging",
           "decoded_copies", "parquet_copies")
"""Fields of the stats that name files: shown to the mount's owner and root only (`access`)."""


def describe(cat: Catalog, details: bool = True) -> dict[str, Any]:
    """The mount's state for ``user.shufflefs.stats`` (and `shufflefs stat`); without
    ``details``, no field that names a file (`DETAILS`, the resumed views): counts instead."""
    state = _describe(cat)
    if details:
        return state
    for key in DETAILS:
        if key in state:
            value = state.pop(key)
            if key in ("few_blocks", "last_errors"):
                state[key + "_count"] = len(value)
    if "resume" in state:
        state["resume"] = {"epoch": state["resume"]["epoch"], "views": len(state["resume"]["views"])}
    state["details"] = (f"file names are shown to the mount's owner (uid {os.geteuid()}) and root only")
    return state


def _describe(cat: Catalog) -> dict[str, Any]:
    state = _snapshot(cat)
    replies = cat.reads.replies.describe()  # reads answered without entering Python count too
    state["reads"] += replies.get("replies", 0)
    state["bytes_served"] += replies.get("bytes", 0)
    state["compiled_replies"] = replies
    return state


def _snapshot(cat: Catalog) -> dict[str, Any]:
    spec, config, views = cat.spec, cat.config, cat.views
    return cat.stats.snapshot(
        source=cat.source,
        mountpoint=cat.mountpoint,
        strategy=spec.strategy,
        seed=spec.seed,
        block_size="auto" if spec.block_size is None else spec.block_size,
        **({"block_floor": spec.block_floor or AUTO_BLOCK_FLOOR, "block_floor_note": config.block_floor_note
            or f"the default ({AUTO_BLOCK_FLOOR >> 10} KiB): no measurement of the device"}
           if spec.block_size is None else {}),
        effective=cat.planner.notes.effective_counts(),
        few_blocks=dict(cat.planner.notes.few_blocks),
        small_buffers=dict(cat.planner.notes.small_buffers),
        buffer=format_buffer(spec.buffer),
        page_size=spec.page_size,
        rank=config.rank,
        world=config.world,
        even=spec.even,
        exchange=spec.exchange,
        **({"pls_exchange": _exchange_counts(cat), "pls_local": spec.pls_local} if spec.strategy == "pls" else {}),
        pooling=cat.pools is not None,
        pool_globs=list(config.pool_globs),
        **({"mixtures": {name: {str(e): got for e, got in sorted(epochs.items())}
                         for name, epochs in cat.planner.mixed.items()}} if config.mixes else {}),
        balance=spec.balance,
        balance_field=spec.balance_field,
        random_level=spec.random_level,
        epoch=cat.epochs.epoch,
        epoch_overrides=cat.epochs.overrides(),
        **({"resume": {"epoch": cat.epochs.resume.epoch, "views": sorted(cat.epochs.resume.views)}}
           if cat.epochs.resume is not None else {}),
        views=len(views.open_views) - len(views.idle),
        idle_views=len(views.idle),
        handles=cat.handles,
        inodes=len(cat.tree.nodes),
        cache_dir=str(config.cache_dir if config.cache_dir is not None else default_cache_dir()),
        **({"cache_warning": config.cache_warning} if config.cache_warning else {}),
        memory={**cat.windows.describe(), **cat.planner.describe(), "peeks": cat.reads.peeks},
        epoch_prefetches=cat.prep.prefetches,
        gather=GATHER,
        source_cache=views.source_cache.describe(),
        serving=dict(cat.serving),
        passthrough={**cat.passthrough.describe(), "staged_ahead": cat.prep.staged_ahead,
                     "building_ahead": cat.prep.building_ahead},
        code=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        read_bytes=views.read_bytes.snapshot(),
        **({"store_requests": cat.store.requests()} if hasattr(cat.store, "requests") else {}),
        **({"staging": views.stages.describe()} if views.stages is not None else {}),
        **_decoded(cat),
        **cat.views.parquet.describe(),
    )


def _decoded(cat: Catalog) -> dict[str, Any]:
    """The decoded copies of compressed files (`stages.decoded`): where, how many bytes, which."""
    got = cat.planner.decoding.describe()
    if not got["copies"] and not got["being_made"] and not got["queued"] and not got["refused"]:
        return {}
    return {"decoded": {"dir": got["dir"], "files": len(got["copies"]), "bytes": got["bytes"],
                        "background": got["background"], "being_made": got["being_made"], "queued": got["queued"],
                        "refused": got["refused"], "kept_for_later_mounts": got["kept_for_later_mounts"]},
            "decoded_copies": got["copies"]}
