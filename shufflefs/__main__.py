"""``python -m shufflefs``: the same as the ``shufflefs`` command (the daemon is started this way)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
