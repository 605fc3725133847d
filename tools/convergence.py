#!/usr/bin/env python3
"""Does SGD converge when it reads label-clustered data through a shufflefs view?  The tool lives
in the ``tools/convergence/`` package (its docstring says what it does); this is its command.

    python tools/convergence.py [--quick] [--rows N] [--epochs E] [--out DIR]
                                [--strategies S,...] [--models M,...] [--datasets D,...]
                                [--formats F,...] [--blocks N] [--seed N] [--work DIR]
"""

from __future__ import annotations

from convergence import main

if __name__ == "__main__":
    raise SystemExit(main())
