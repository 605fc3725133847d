"""Small generated datasets for the documentation's recipes."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path


def corpus(root: Path, web: int = 4000, books: int = 1200) -> None:
    """Two sources for a mixture: ``web/`` (two files) and ``books/`` (one), records tagged by source."""
    for source, n, files in (("web", web, 2), ("books", books, 1)):
        (root / source).mkdir(parents=True)
        for f in range(files):
            lines = [json.dumps({"id": k, "source": source, "text": "w " * (k % 9 + 1)}, separators=(",", ":"))
                     for k in range(f, n, files)]
            (root / source / f"part-{f:05d}.jsonl").write_text("\n".join(lines) + "\n")


def wds_shards(root: Path, shards: int = 4, per_shard: int = 200, labels: int = 4) -> None:
    """Label-sorted WebDataset shards ``shard-00000i.tar``: samples of a ``.txt`` and a ``.cls`` member."""
    root.mkdir(parents=True)
    k = 0
    for s in range(shards):
        with tarfile.open(root / f"shard-{s:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for _ in range(per_shard):
                label = k * labels // (shards * per_shard)
                for ext, body in (("txt", f"sample {k}\n".encode() * (k % 5 + 1)), ("cls", str(label).encode())):
                    info = tarfile.TarInfo(f"{k:06d}.{ext}")
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
                k += 1
