"""How fast a tar shard is indexed: the vectorised scan against Python's ``tarfile`` listing the
same archive (one pass over its headers, the per-member loop the scan avoids), in one process.

    python tools/tar_index.py [--small 100000] [--large 1000] [--large-size 1MiB] [--dir DIR]

Writes two shards (many small samples: a ~100-byte ``.jpg`` and a ``.cls`` each; few large ones:
``--large-size`` of ``.jpg``), then times, warm (the shard in the page cache), the median of
``--rounds``: the scan over a read-only mapping, and ``tarfile``'s iteration over the members.
"""

from __future__ import annotations

import argparse
import io
import mmap
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shufflefs.config import parse_size  # noqa: E402
from shufflefs.formats.tar import TarFormat  # noqa: E402


def write_shard(path: Path, samples: int, payload: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    blob = rng.integers(0, 256, payload + 64, dtype=np.uint8).tobytes()
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for i in range(samples):
            for suffix, data in (("jpg", blob[i % 64: i % 64 + payload]), ("cls", b"%d" % (i % 10))):
                info = tarfile.TarInfo(f"{i:08d}.{suffix}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))


def timed(fn, rounds: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def measure(path: Path, rounds: int) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        data = np.frombuffer(mm, np.uint8)
        data.sum()  # warm: in the page cache and mapped
        scan_s, index = timed(lambda: TarFormat().scan(data, str(path)), rounds)

        def listing() -> int:
            with tarfile.open(fileobj=io.BytesIO(memoryview(mm)), mode="r:") as t:
                return sum(1 for _ in t)

        tar_s, members = timed(listing, rounds)  # the mapping goes with the last view of it
    return {"bytes": size, "samples": index.n, "members": members, "scan_s": scan_s, "tarfile_s": tar_s}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", type=int, default=100_000, help="samples of the small-sample shard")
    p.add_argument("--large", type=int, default=1000, help="samples of the large-sample shard")
    p.add_argument("--large-size", default="1MiB", help="payload of each large sample")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--dir", default=None, help="where the shards are written (default: a temporary directory)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = []
        for name, samples, payload in (("small", args.small, 100), ("large", args.large, parse_size(args.large_size))):
            path = Path(tmp) / f"{name}.tar"
            write_shard(path, samples, payload)
            r = measure(path, args.rounds)
            rows.append((name, payload, r))
        print(f"tar index build, warm, median of {args.rounds} ({os.cpu_count()} CPUs)\n")
        print("| shard | samples | MB | scan MB/s | scan samples/s | tarfile listing s | scan / tarfile time |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, payload, r in rows:
            mb = r["bytes"] / 1e6
            print(f"| {name} ({payload} B/sample) | {r['samples']:,} | {mb:,.0f} | {mb / r['scan_s']:,.0f} | "
                  f"{r['samples'] / r['scan_s']:,.0f} | {r['tarfile_s']:.3f} | {r['scan_s'] / r['tarfile_s']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
