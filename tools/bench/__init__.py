"""Pieces of ``tools/bench.py``: dataset generation, processes and mounts, read loops, the
user-space alternatives, and the report.  Measuring instruments, not part of the package."""
