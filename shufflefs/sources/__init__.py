"""Where source bytes come from: the `Store` registry (see `base` for the interfaces).

A store is chosen by the scheme of the mount's source (``scheme://...``; a plain path is local).
Adding one: a module implementing `base.Store` and `base.Source`, and one line in `STORES`.
Imports `formats`, `index` (`joined_index`: a pool's members) and `resolve`; `base` holds
`gather`, the record copy (compiled, else numpy) that sources and the windows above use.
"""

from __future__ import annotations

import importlib
import os
import re
from typing import Any

from .base import PlainFile, Reader, Runs, Source, Store, index_by_scan

__all__ = ["STORES", "PlainFile", "Reader", "Runs", "Source", "Store", "index_by_scan", "misspelled_url", "open_store",
           "scheme_of"]

STORES: dict[str, str] = {
    "": "shufflefs.sources.local:LocalStore",
    "s3": "shufflefs.sources.s3:S3Store",
}
"""URL scheme -> ``module:class`` of its store (imported when a mount uses it)."""


def scheme_of(location: str) -> str:
    """``s3`` for ``s3://bucket/prefix``; "" for a local path."""
    m = re.match(r"([a-z][a-z0-9+.-]*)://", str(location))
    return m.group(1) if m else ""


def misspelled_url(location: str) -> str | None:
    """Why ``location`` is no source, when it starts like a URL of a known scheme without its two
    slashes (``s3:/bucket``, ``s3:bucket``) and is no existing local path; else None."""
    m = re.match(r"([a-z][a-z0-9+.-]*):(?!//)", str(location))
    if m is None or not m.group(1) or m.group(1) not in STORES or os.path.lexists(location):
        return None
    return (f"{location}: no such local path, and an object-store source is written with two slashes: "
            f"{m.group(1)}://BUCKET[/PREFIX]")


def open_store(location: str, options: dict[str, Any] | None = None) -> Store:
    """The store of a mount's source, with the store's own ``options`` (keyword arguments of its
    class, e.g. ``endpoint_url``); ValueError names an unknown scheme, ImportError a missing extra."""
    scheme = scheme_of(location)
    if scheme not in STORES:
        known = ", ".join(f"{s}://" for s in sorted(STORES) if s) or "none"
        raise ValueError(f"{location}: unknown source scheme {scheme!r} (known: local paths, {known})")
    module, name = STORES[scheme].split(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ImportError(f"{location}: {scheme}:// sources need an extra: pip install 'shufflefs[{scheme}]' ({e})") from e
    return cls(location, **(options or {}))
