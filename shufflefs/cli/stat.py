"""``shufflefs stat``: a mount's state, as the daemon reports it."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..config import (
    STATS_XATTR,
    format_buffer,
    parse_buffer,
)
from ..strategies.base import MIX_ASSUMPTION, object_block_size
from .common import EXIT_OK, REMOTE_BLOCK, CliError, _human, get_xattr


def cmd_stat(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    raw = get_xattr(args.mountpoint, STATS_XATTR)
    try:
        stats = json.loads(raw)
    except ValueError:
        raise CliError(f"{args.mountpoint}: unreadable stats: {raw[:200]!r}") from None
    if args.json:
        print(json.dumps(stats, indent=2))
    else:  # paths that are no UTF-8 (a resume state may name any) are printed escaped
        print(format_stats(stats).encode("utf-8", "backslashreplace").decode("utf-8"))
    return EXIT_OK


def format_stats(stats: dict) -> str:
    """Readable lines for the known fields of ``user.shufflefs.stats``; any others are listed after."""
    s = dict(stats)
    take = s.pop
    source = str(s.get("source", ""))
    lines: list[tuple[str, str]] = []

    pid, uptime = take("pid", None), take("uptime_s", None)
    about = ", ".join(x for x in (pid is not None and f"daemon pid {pid}", uptime is not None and f"up {_duration(uptime)}") if x)
    lines.append(("mount", f"{take('mountpoint', '?')}" + (f"  ({about})" if about else "")))
    if "source" in s:
        lines.append(("source", str(take("source"))))
    gather, code = take("gather", None), take("code", None)
    if gather is not None:
        lines.append(("gather", gather + (f"  (code in {code})" if code else "")
                      + ("" if gather == "compiled" else "  WARNING: the compiled module is missing, "
                         "windows are built several times slower; reinstall shufflefs")))
    cache = take("source_cache", None)
    if cache is not None:
        chosen = "; ".join(f"{why} ({n} view(s))" for why, n in cache.get("views", {}).items()) or "no view opened yet"
        loads = ", ".join(f"{n} {how}" for how, n in sorted(cache.get("window_loads", {}).items())) or "none"
        lines.append(("source cache", f"{cache.get('option')}: {chosen}; room {_human(int(cache.get('room', 0)))} "
                      f"({cache.get('room_from')}); window loads: {loads}; "
                      f"{_human(int(cache.get('dropped_bytes', 0)))} of source pages dropped"))
    serving = take("serving", None)
    if serving:
        lines.append(("serving", "; ".join(f"{why} ({n} open(s))" for why, n in sorted(serving.items()))))
    block_size, buffer = s.get("block_size"), s.get("buffer")
    params = [f"{k}={_param(k, take(k))}" for k in ("seed", "block_size", "buffer", "page_size") if k in s]
    lines.append(("strategy", "  ".join([str(take("strategy", "?")), *params])))
    floor, floor_note = take("block_floor", None), take("block_floor_note", None)
    if floor is not None:
        lines.append(("block floor", f"{_human(int(floor))}: {floor_note}"))
    for got in take("effective", None) or []:  # what another node must match to show the same bytes
        block = f"block_size={_param('block_size', got['block_size'])}  " if got.get("block_size") is not None else ""
        lines.append(("effective", f"{block}buffer={_param('buffer', got['buffer_bytes'])}  ({got['files']} "
                                   f"file(s) or pool(s) planned so far)"))
    rank, world, even = take("rank", None), take("world", None), take("even", "none")
    balance, field, level = take("balance", False), take("balance_field", None), take("random_level", 0.0)
    if world is not None and world != 1:
        lines.append(("rank", f"{rank} of {world}" + (f"  (even={even})" if even != "none" else "")))
    if balance:
        lines.append(("balance", f"by {field or 'byte length'}  random_level={level}"))
    for name, blocks in (take("few_blocks", None) or {}).items():
        lines.append(("few blocks", f"{name}: {blocks} block(s) {_few_blocks(block_size, source, buffer)}"))
    for name, got in (take("small_buffers", None) or {}).items():
        lines.append(("small buffer", f"{name}: {got.get('blocks_per_buffer')} blocks per buffer, expected label mix "
                                      f"{got.get('expected_label_mix')} (TV {MIX_ASSUMPTION}; 0 is a perfect mix): "
                                      "set --block-size smaller or --buffer larger"))
    pooling, globs = take("pooling", None), take("pool_globs", None) or []
    if pooling is not None:
        lines.append(("pools", ("shard sets by name" + (", declared: " + ", ".join(globs) if globs else ""))
                      if pooling else "off (every file shuffled alone)"))
    for name, epochs in (take("mixtures", None) or {}).items():
        for epoch, sources in epochs.items():
            lines.append(("mixture", f"{name} epoch {epoch}: " + ", ".join(
                f"{s['glob']} {s['taken']:,} of {s['records']:,}{_passes(s['passes'])}" for s in sources)))
    for relpath, counts in (take("pls_exchange", None) or {}).items():
        lines.append(("pls exchange", f"{relpath}: {counts}"))
    staging = take("staging", None)
    for epoch, got in (take("read_bytes", None) or {}).items():
        stage = f", from stages {_human(got.get('stage_bytes', 0))}" if staging is not None else ""
        asked = (f" in {got['source_requests']:,} requests ({_human(got.get('fetched_bytes', 0))} fetched)"
                 if got.get("source_requests") else "")
        lines.append(("read", f"epoch {epoch}: from the source {_human(got.get('source_bytes', 0))}{asked}{stage}"))
    store = take("store_requests", None)
    if isinstance(store, dict):
        lines.append(("requests", f"{store.get('requests', 0):,} to the store (all kinds), {_human(store.get('bytes', 0))} "
                                  f"received, {store.get('failed', 0)} failed after retries"))
        if "index_published" in store:
            lines.append(("indexes", f"{store['index_published']} taken from the bucket "
                                     f"({_human(store.get('index_published_bytes', 0))}), {store.get('index_built', 0)} "
                                     f"built by downloading their objects ({_human(store.get('index_built_bytes', 0))})"))
        if store.get("packed_copies"):
            lines.append(("copies", f"{store['packed_copies']} compressed object(s) copied to local disk "
                                    f"({_human(store.get('packed_bytes', 0))}), decoded from there"))
        if "link_ahead" in store:
            measured = f"GETs take {store['link_latency_ms']:.0f} ms or more" if "link_latency_ms" in store else ""
            if "link_part_ms" in store:
                measured += f", an 8 MiB part {store['link_part_ms']:.0f} ms unloaded"
            measured += "; " if measured else ""
            rate = f"{_human(store['link_rate'])}/s delivered lately; " if "link_rate" in store else ""
            lines.append(("link", f"{measured}{rate}{_human(store['link_ahead'])} kept loading ahead "
                                  f"(cap {_human(store['link_ahead_cap'])}: --requests x 8 MiB)"))
    if isinstance(staging, dict):
        lines.append(("stage dir", f"{staging.get('dir')}  ({staging.get('built', 0)} built, {staging.get('failed', 0)} failed)"))
        for st in staging.get("stages", []):
            lines.append(("stage", f"{st['name']} epoch {st['epoch']}: {st['records']} records, "
                                   f"{_human(st['bytes'])}, {st['readers']} readers"))
    decoded = take("decoded", None)
    if isinstance(decoded, dict):
        lines.append(("decoded", f"{decoded.get('files')} compressed file(s) read from decoded copies in "
                                 f"{decoded.get('dir')} ({_human(decoded.get('bytes', 0))})"))
        for path in decoded.get("being_made", []):
            lines.append(("decoded copy", f"{path}: being made in the background"))
        if decoded.get("queued"):
            lines.append(("decoded copy", f"{len(decoded['queued'])} more queued to be made one after another"))
        for path, why in (decoded.get("refused") or {}).items():
            lines.append(("decoded copy", f"{path}: none ({why}); read from restart points"))
        kept = decoded.get("kept_for_later_mounts") or {}
        if kept.get("files"):
            lines.append(("decoded copy", f"{kept['files']} kept from earlier mounts for later ones "
                                          f"({_human(kept.get('bytes', 0))}; they give way to copies in use)"))
    for path, got in (take("decoded_copies", None) or {}).items():
        lines.append(("decoded copy", f"{path}: {_human(got.get('bytes', 0))}, decoded in {got.get('seconds')} s "
                                      f"{got.get('made', '')}, read by {got.get('views')} view(s)"))
    passthrough = take("passthrough", None)
    if isinstance(passthrough, dict):
        lines.append(("passthrough", "on: Parquet views are read by the kernel from their stages "
                      f"({passthrough.get('stages_built', 0)} made, {passthrough.get('stages_kept', 0)} of them "
                      f"found whole in kept files; {passthrough.get('opens', 0)} opens; "
                      f"{passthrough.get('early_opens', 0)} read a stage as it was written)"
                      if passthrough.get("on") else f"off ({passthrough.get('why_not', '?')})"))
    parquet = take("parquet_copies", None)
    for path, got in (parquet or {}).get("copies", {}).items():
        lines.append(("parquet copy", f"{path}: {got.get('copied')} of {got.get('row_groups')} row groups decoded "
                                      f"into {parquet.get('dir')} ({_human(got.get('bytes', 0))}) {got.get('made', '')}, "
                                      f"{got.get('views')} view(s)"))
    overrides = take("epoch_overrides", None)
    epoch = str(take("epoch", "?"))
    if overrides:
        epoch += "  (own epochs: " + ", ".join(f"{k}={v}" for k, v in overrides.items()) + ")"
    lines.append(("epoch", epoch))
    resume = take("resume", None)
    if resume:
        views = resume.get("views", [])
        names = f" ({', '.join(views[:5])}{', ...' if len(views) > 5 else ''})" if isinstance(views, list) else ""
        count = len(views) if isinstance(views, list) else views  # a count for users other than the owner
        lines.append(("resume", f"epoch {resume.get('epoch')} resumed after a stop: {count} view(s){names}"))
    counts = [f"{take(k)} {label}" for k, label in (("files_opened", "opened"), ("views", "views"),
                                                     ("handles", "open handles"), ("inodes", "inodes")) if k in s]
    if counts:
        lines.append(("files", ", ".join(counts)))
    if "bytes_served" in s or "reads" in s:
        served = take("bytes_served", 0)
        lines.append(("served", f"{_human(served) if isinstance(served, (int, float)) else served} in {take('reads', '?')} reads"))
    memory = take("memory", None)
    if isinstance(memory, dict):
        lines.append(("memory", "  ".join(f"{k.removesuffix('_bytes')}={_human(v) if k.endswith('_bytes') else v}" for k, v in memory.items())))
    if "cache_dir" in s:
        lines.append(("cache dir", str(take("cache_dir"))))
    recent = take("last_errors", None)
    errors_ = take("errors", None)
    failing = take("paths_with_errors", 0)
    for key, value in s.items():
        if isinstance(value, dict):
            value = "  ".join(f"{k}={v}" for k, v in value.items())
        elif isinstance(value, list):
            value = ", ".join(map(str, value))
        lines.append((key.replace("_", " "), str(value)))
    if errors_ is not None:
        lines.append(("errors", str(errors_) + (f"  ({failing} path(s) failing now; the reason: getfattr -n "
                                                "user.shufflefs.error FILE)" if failing else "")))
    width = max(len(k) for k, _ in lines)
    out = [f"{k:<{width}}  {v}".rstrip() for k, v in lines]
    if recent:
        out.append("recent errors:")
        out.extend(f"  {line}" for line in (recent if isinstance(recent, list) else [recent]))
    return "\n".join(out)


def _passes(passes: list[int]) -> str:
    """Which passes over a mixture's source an epoch's records come from (0: the first)."""
    if not passes:
        return ""
    return f" (pass {passes[0]})" if passes[0] == passes[1] else f" (passes {passes[0]}-{passes[1]})"


def _few_blocks(block_size: Any, source: str, buffer: Any = None) -> str:
    """Why a file has few blocks and what to do, by where its block size came from."""
    if block_size == "auto":
        return ("of the automatic size (at least a page): block barely shuffles it, corgipile only within "
                "its buffer; use --strategy full or once for files this small")
    size = _param("block_size", block_size)
    try:  # the stats show the buffer as given: "64MiB", or "10%" (no fixed block then)
        buffer = parse_buffer(buffer) if isinstance(buffer, str) else buffer
    except ValueError:
        buffer = None
    default = object_block_size(buffer) if isinstance(buffer, int) else REMOTE_BLOCK
    origin = " (the object-store default)" if "://" in source and block_size == default else ""
    return (f"of {size}{origin}: block barely shuffles it, corgipile only within its buffer; "
            "lower --block-size")


def _duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _param(key: str, value: Any) -> str:
    if key == "buffer" and isinstance(value, float):
        return format_buffer(value)
    if key in ("block_size", "buffer") and isinstance(value, int):
        for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
            if value >= 1 << shift and value % (1 << shift) == 0:
                return f"{value >> shift}{unit}"
    return str(value)
