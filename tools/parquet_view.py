"""What a Parquet view costs, without FUSE: the index, the layout, encoding, and reading.

    python tools/parquet_view.py FILE.parquet [--rows-per-group 100000] [--window 2] [--rounds 3]
                                              [--out VIEW.parquet]

Measures, on one source (warm: in the page cache), the median of ``--rounds`` each:

- index: decoding every row group once for the per-row sizes (`sizes_of_file`), and its bytes
  per row;
- layout: every page, chunk, row group and the footer for a random permutation of all rows
  (`plan_view`), numpy only;
- decode: one source row group by pyarrow into levels and PLAIN values (`decode_group`);
- encode: one row group of a view whose rows come from ``--window`` source row groups (shuffled
  among them, as a block order's window does), decoded beforehand (`encode_group`), in MB/s of
  view bytes;
- iter_batches: ``pyarrow.parquet.ParquetFile.iter_batches`` over the whole source and over a
  whole view (a random permutation of all rows, written once to ``--out``), in rows/s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shufflefs.formats.parquet import (SourceGroups, decode_group, encode_group, plan_view,  # noqa: E402
                                       sizes_of_file, write_view)


def timed(fn: Callable[[], object], rounds: int) -> tuple[float, object]:
    """Median seconds of ``rounds`` calls, and the last result."""
    times, result = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def iter_rows(path: str) -> int:
    import pyarrow.parquet as pq

    n = 0
    for batch in pq.ParquetFile(path).iter_batches():
        n += batch.num_rows
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("--rows-per-group", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=2, help="source row groups one view row group draws from")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", help="where the whole view is written (default: a temporary file)")
    args = ap.parse_args(argv)
    src, rounds = args.source, args.rounds

    t_index, (footer, sizes) = timed(lambda: sizes_of_file(src), 1)
    n = sizes.n_rows
    print(f"source: {Path(src).stat().st_size / 2**20:.0f} MiB, {n} rows, {len(footer.group_rows)} row groups, "
          f"{len(footer.leaves)} leaf columns")
    print(f"index: {t_index:.2f} s, {sizes.nbytes / max(n, 1):.2f} bytes per row")

    rng = np.random.default_rng(0)
    perm = rng.permutation(n)
    t_layout, layout = timed(lambda: plan_view(footer, sizes, perm, args.rows_per_group), rounds)
    print(f"layout of a random permutation: {t_layout * 1e3:.0f} ms ({layout.n_groups} row groups, "
          f"footer {len(layout.footer)} bytes, view {layout.size / 2**20:.0f} MiB)")

    import pyarrow.parquet as pq

    pf = pq.ParquetFile(src)
    t_decode, _ = timed(lambda: decode_group(pf, footer, 0, src), rounds)
    print(f"decode of source row group 0 ({footer.group_rows[0]} rows): {t_decode * 1e3:.0f} ms")

    w = min(args.window, len(footer.group_rows))
    window_rows = np.arange(int(sizes.group_starts[w]))
    order = np.concatenate([rng.permutation(window_rows), np.arange(int(sizes.group_starts[w]), n)])
    local = plan_view(footer, sizes, order, args.rows_per_group)
    groups = SourceGroups(src, footer, src, keep=w)
    for s in range(w):
        groups(s)
    start, end = local.group_range(0)
    out = np.empty(end - start, np.uint8)
    t_encode, _ = timed(lambda: encode_group(local, 0, groups, out), rounds)
    print(f"encode of a view row group drawn from {w} source row groups: {t_encode * 1e3:.0f} ms, "
          f"{(end - start) / t_encode / 1e6:.0f} MB/s ({(end - start) / 2**20:.0f} MiB)")
    groups.close()

    with tempfile.TemporaryDirectory() as tmp:
        out_path = args.out or str(Path(tmp) / "view.parquet")
        all_groups = SourceGroups(src, footer, src, keep=len(footer.group_rows))

        def write() -> None:
            with open(out_path, "wb") as f:
                write_view(layout, all_groups, f)

        t_write, _ = timed(write, 1)
        all_groups.close()
        print(f"whole view written (each source row group decoded once): {t_write:.2f} s")
        iter_rows(src), iter_rows(out_path)  # warm both
        t_src, rows = timed(lambda: iter_rows(src), rounds)
        t_view, rows_v = timed(lambda: iter_rows(out_path), rounds)
        assert rows == rows_v == n
        print(f"iter_batches: source {n / t_src / 1e6:.2f} Mrows/s ({t_src:.2f} s), "
              f"view {n / t_view / 1e6:.2f} Mrows/s ({t_view:.2f} s): {t_src / t_view:.2f}x")


if __name__ == "__main__":
    main()
