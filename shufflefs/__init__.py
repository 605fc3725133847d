"""shufflefs: a read-only FUSE view of a dataset whose files hold their records in a per-epoch shuffled order.

From Python, `mount` starts a mount and returns a `Mount` handle (``shufflefs.api``); importing
this package imports nothing else until it is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    from .api import Mount, MountError

__version__ = "0.1.0"
__all__ = ["Mount", "MountError", "mount"]


def mount(src: str | os.PathLike[str], mnt: str | os.PathLike[str], **options: Any) -> Mount:
    """Mount ``src`` at ``mnt`` with ``shufflefs mount``'s options as keywords (``seed=3``,
    ``block_size="64KiB"``, ``rank=1``, ``world_size=2``...) and return the `Mount` once it is
    ready; see `shufflefs.api.mount`.  Raises TypeError (unknown keyword), ValueError (bad value,
    the command's message; nothing is mounted) or MountError (the daemon did not mount)."""
    from .api import mount as _mount

    return _mount(src, mnt, **options)


def __getattr__(name: str) -> Any:
    if name in ("Mount", "MountError"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
