#!/usr/bin/env python3
"""shufflefs against the loaders people use, on one label-sorted dataset, at equal memory.

    sudo .venv/bin/python tools/peers.py [--records N] [--quick] [--update-docs]

Contenders: shufflefs with no shuffle options (a Python loop, a DataLoader over `.parts`, and
WebDataset over tar views), shufflefs `--strategy full` and `corgipile`, a pread Dataset with
RandomSampler, Hugging Face `datasets` (map-style `.shuffle()` and an iterable dataset's shuffle
buffer), WebDataset with shardshuffle and a shuffle buffer, litdata, and MosaicML Streaming (in a
venv of its own).  For each: samples/s warm and cold, preparation time, extra disk, peak memory,
label mix and gap entropy (see tools/bench/peers*.py).  ``--update-docs`` writes the "Peers"
section of docs/benchmark.md.  Needs root (mounts, dropping the page cache).
"""

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path[:0] = [str(TOOLS), str(TOOLS.parent)]

from bench.peers import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())
