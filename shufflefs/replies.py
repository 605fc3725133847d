"""The compiled replies (`shufflefs._replies`), loaded so that pyfuse3 binds to them.

The extension defines libfuse's ``fuse_session_process_buf``; pyfuse3 is linked with immediate
binding, so the definition it uses is fixed when pyfuse3 is loaded.  Loading the extension first,
into the global symbol scope, makes it that definition: reads of windows Python registered are
then answered without entering Python, and every other request goes on to libfuse.  Loaded after
pyfuse3, the extension never sees a request (``bound`` is False; stat says "unbound") and Python
answers every read.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType


def _load() -> tuple[ModuleType | None, bool]:
    """The extension (None without the build) and whether pyfuse3 will bind to it."""
    bound = "pyfuse3" not in sys.modules
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_GLOBAL)
    try:
        from . import _replies
    except ImportError:  # pragma: no cover - depends on the build
        return None, False
    finally:
        sys.setdlopenflags(flags)
    return _replies, bound


compiled, bound = _load()

