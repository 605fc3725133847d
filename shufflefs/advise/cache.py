"""The storage probe's result, cached per device, and the block-size floor a mount reads from it.

``shufflefs advise SRC`` measures the storage under SRC (`shufflefs.advise.probe`) and saves the
table here, one small JSON file per device under the shufflefs cache directory::

    $XDG_CACHE_HOME/shufflefs/advise/<major>-<minor>-<hash>.json   (default ~/.cache/shufflefs)

``<hash>`` is that of the device's identity (`device_identity`): the ``st_dev`` major:minor of the
directory, the filesystem type mounted there, and what ``/sys/dev/block/MAJ:MIN`` tells of the
device where present (model, vendor, serial, wwid, size in sectors; a partition's disk for those
it lacks).  Another disk that later gets the same numbers has another identity, so its mount
misses the cache instead of trusting a stranger's figures.  The file::

    {"version": 1, "device": {...identity...}, "date": "2026-11-25T23:59:00+00:00",
     "source": "/data/set", "direct": true, "target": 0.9, "window_bytes": 67108864,
     "sequential_mb_s": 1800.0, "views_sequential_mb_s": 1750.0,
     "table": [{"block_size": 16384, "qd1_mb_s": 120.0, "qd1_fraction": 0.07,
                "views_mb_s": 700.0, "views_fraction": 0.4}, ...],
     "floor": 131072}

`measured_block_floor` is what a mount calls: a few stats and file reads, never a measurement,
standard library only.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ..index.table import write_atomically

CACHE_VERSION = 1
FLOOR_TARGET = 0.9
"""Fraction of sequential throughput that random reads at the views' depth must reach."""
SYS_FIELDS = ("device/model", "device/vendor", "device/serial", "serial", "device/wwid", "wwid", "size")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip() or None
    except OSError:
        return None


def _fstype(dev: str, path: str) -> str | None:
    """The filesystem type of the deepest mount of device ``dev`` ("maj:min") above ``path``."""
    best, fstype = -1, None
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or fields[2] != dev or not right:
                    continue
                mnt = fields[4].replace("\\040", " ")
                inside = path == mnt or path.startswith(mnt.rstrip("/") + "/")
                if inside and len(mnt) > best:
                    best, fstype = len(mnt), right.split()[0]
    except OSError:
        return None
    return fstype


def device_identity(source_dir: str | os.PathLike) -> dict[str, Any]:
    """What identifies the storage under ``source_dir`` (raises OSError if it cannot be stat'ed)."""
    real = os.path.realpath(source_dir)
    st = os.stat(real)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    ident: dict[str, Any] = {"dev": f"{major}:{minor}", "fstype": _fstype(f"{major}:{minor}", real)}
    sysdev = Path(f"/sys/dev/block/{major}:{minor}")
    # a partition (/sys/block/sda/sda1): its disk has the model and serial
    disk = sysdev.resolve().parent if (sysdev / "partition").exists() else None
    for name in SYS_FIELDS:
        value = _read(sysdev / name)
        if value is None and disk is not None and name != "size":
            value = _read(disk / name)
        if value is not None:
            ident[name.replace("device/", "")] = value
    return ident


def cache_dir() -> Path:
    """Where probe results live: ``advise/`` in the shufflefs cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "shufflefs" / "advise"


def cache_path(identity: dict[str, Any], directory: str | os.PathLike | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return Path(directory or cache_dir()) / f"{identity['dev'].replace(':', '-')}-{digest}.json"


def floor_of(table: list[dict[str, Any]], target: float = FLOOR_TARGET, key: str = "views_fraction") -> int | None:
    """The smallest measured block size that reaches ``target`` of sequential throughput by
    ``key`` together with the next larger measured size, and from which on at least 3/4 of the
    measured sizes do (one lucky small size does not decide, one unlucky large one does not veto:
    a shared virtual disk's figures jump by 2x between measurements); the largest measured size if
    none does (the floor is at least that); None for an empty table."""
    rows = sorted((r for r in table if r.get(key) is not None), key=lambda r: r["block_size"])
    if not rows:
        return None
    ok = [r[key] >= target for r in rows]
    for i, r in enumerate(rows):
        rest = ok[i:]
        if all(ok[i: i + 2]) and 4 * sum(rest) >= 3 * len(rest):
            return int(r["block_size"])
    return int(rows[-1]["block_size"])


def table(result: Any) -> list[dict[str, Any]]:
    """Per block size of a `shufflefs.advise.ProbeResult`: MB/s and fraction of sequential at
    queue depth 1 and at the views' depth (None where a size was not measured)."""
    qd1 = {m.block_size: m for m in result.random}
    views = {m.block_size: m for m in result.windowed}
    rows = []
    for b in sorted(set(qd1) | set(views)):
        q, v = qd1.get(b), views.get(b)
        rows.append({"block_size": b,
                     "qd1_mb_s": round(q.mb_per_s, 1) if q else None,
                     "qd1_fraction": round(result.fraction(q), 3) if q else None,
                     "views_mb_s": round(v.mb_per_s, 1) if v else None,
                     "views_fraction": round(result.window_fraction(v), 3) if v else None})
    return rows


def record(result: Any, target: float = FLOOR_TARGET) -> dict[str, Any]:
    """What `save` keeps of a `shufflefs.advise.ProbeResult`: the table, the sequential figures,
    the floor (at the views' depth; at depth 1 for a probe without those measurements)."""
    rows = table(result)
    bseq = result.buffered_sequential
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "source": os.path.realpath(result.source), "files": result.files, "data_bytes": result.data_bytes,
            "direct": result.direct, "target": target, "window_bytes": result.window_bytes,
            "sequential_mb_s": round(result.sequential.mb_per_s, 1),
            "views_sequential_mb_s": round(bseq.mb_per_s, 1) if bseq is not None else None,
            "table": rows, "floor": floor_of(rows, target, "views_fraction" if result.windowed else "qd1_fraction"),
            "warnings": list(result.warnings)}


def save(source_dir: str | os.PathLike, record: dict[str, Any], directory: str | os.PathLike | None = None) -> Path:
    """Write ``record`` (the probe's table and figures) as the cache of ``source_dir``'s device,
    atomically; returns the file's path."""
    identity = device_identity(source_dir)
    path = cache_path(identity, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": CACHE_VERSION, "device": identity, **record}
    text = (json.dumps(body, indent=1, sort_keys=True) + "\n").encode()
    write_atomically(path, lambda f: f.write(text), prefix=".advise-", mode=0o644)
    return path


def load(source_dir: str | os.PathLike, directory: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The cached probe of ``source_dir``'s device, or None (none, unreadable, another version,
    or saved for a device of another identity)."""
    try:
        identity = device_identity(source_dir)
        with open(cache_path(identity, directory), encoding="utf-8") as f:
            body = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or body.get("version") != CACHE_VERSION or body.get("device") != identity:
        return None
    if not isinstance(body.get("table"), list):
        return None
    return body


def measured_block_floor(source_dir: str, cache_dir: str | os.PathLike | None = None) -> int | None:
    """The smallest measured block size whose cold random reads at the views' queue depth (WILLNEED
    on a window's blocks, then ascending preads) reached 90% of sequential throughput on the device
    under ``source_dir`` (from then on every larger measured size too), from the cached probe of
    ``shufflefs advise``; the largest measured size if none reached it; None without a cached probe
    for that device.  Never measures: a few stats and small file reads."""
    body = load(source_dir, cache_dir)
    if body is None:
        return None
    try:
        return floor_of(body["table"])
    except (KeyError, TypeError, ValueError):
        return None


__all__ = ["CACHE_VERSION", "FLOOR_TARGET", "cache_dir", "cache_path", "device_identity", "floor_of", "load",
           "measured_block_floor", "record", "save", "table"]
