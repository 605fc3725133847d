"""Where source bytes come from: the `Store` registry (see `base` for the interfaces).

A store is chosen by the scheme of the mount's source (``scheme://...``; a plain path is local).
Adding one: a module implementing `base.Store` and `base.Source`, and one line in `STORES`.
"""

from __future__ import annotations

import importlib
import re

from .base import PlainFile, Reader, Runs, Source, Store, index_by_scan

__all__ = ["STORES", "PlainFile", "Reader", "Runs", "Source", "Store", "index_by_scan", "open_store", "scheme_of"]

STORES: dict[str, str] = {
    "": "shufflefs.sources.local:LocalStore",
}
"""URL scheme -> ``module:class`` of its store (imported when a mount uses it)."""


def scheme_of(location: str) -> str:
    """``s3`` for ``s3://bucket/prefix``; "" for a local path."""
    m = re.match(r"([a-z][a-z0-9+.-]*)://", str(location))
    return m.group(1) if m else ""


def open_store(location: str) -> Store:
    """The store of a mount's source; ValueError names an unknown scheme."""
    scheme = scheme_of(location)
    if scheme not in STORES:
        known = ", ".join(f"{s}://" for s in sorted(STORES) if s) or "none"
        raise ValueError(f"{location}: unknown source scheme {scheme!r} (known: local paths, {known})")
    module, name = STORES[scheme].split(":")
    return getattr(importlib.import_module(module), name)(location)
