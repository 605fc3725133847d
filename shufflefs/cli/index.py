"""``shufflefs index``: build the offset tables of a source tree ahead of mounting."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any, Callable

from tqdm import tqdm

from .common import EXIT_FAIL, EXIT_OK, PROG, _human
from .mount import _cache_dir
from .options import FORMAT_KEYS, resolve_options


class Progress:
    """A tqdm bar over the bytes of all files to index, files done in its label; silent unless
    stderr is a terminal.  Messages go through `note` so that they do not break the bar."""

    def __init__(self, files: int, total_bytes: int) -> None:
        self.files, self.total, self.done_files = files, total_bytes, 0
        self.start = time.monotonic()
        self._scanned = 0  # bytes of the current file counted so far
        self.bar = tqdm(total=total_bytes, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                        disable=not sys.stderr.isatty(), leave=False, dynamic_ncols=True,
                        desc=f"0/{files} files")

    def file_progress(self, scanned: int) -> None:
        self.bar.update(scanned - self._scanned)
        self._scanned = scanned

    def file_done(self, size: int) -> None:
        self.bar.update(size - self._scanned)
        self._scanned = 0
        self.done_files += 1
        self.bar.set_description(f"{self.done_files}/{self.files} files", refresh=False)

    def note(self, line: str) -> None:
        tqdm.write(line, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def iter_source_files(source: Path) -> list[tuple[str, str]]:
    """(path, path relative to source) of every regular file the mount serves as itself, sorted.

    Symlinks are skipped: the mount shows them as links to files indexed under their own path.
    """
    out = []
    for root, dirs, files in os.walk(source):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                out.append((path, os.path.relpath(path, source)))
    return out


def cmd_index(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..errors import ShuffleError
    from ..formats import resolve_format
    from ..index.table import IndexCache

    opts = resolve_options(args, FORMAT_KEYS, parser)
    if not os.path.isdir(args.source):
        parser.error(f"source {args.source!r} is not a directory")
    source = Path(os.path.realpath(args.source))
    cache = IndexCache(_cache_dir(opts.values["cache_dir"], source, parser))

    jobs = []
    skipped = 0
    failures: list[str] = []
    for path, rel in iter_source_files(source):
        try:
            fmt = resolve_format(rel, opts.rules, opts.format_defaults)
        except (ShuffleError, ValueError) as e:
            failures.append(f"{path}: {e}")
            print(f"{PROG} index: {failures[-1]}", file=sys.stderr)
            continue
        if fmt is None:
            skipped += 1
            continue
        jobs.append((path, fmt, os.path.getsize(path)))

    bar = Progress(len(jobs), sum(j[2] for j in jobs))
    records = cached = built = 0
    reported = len(failures)
    try:
        for path, fmt, size in jobs:
            try:
                index, was_cached = _load_index(path, fmt, cache, bar.file_progress)
            except ShuffleError as e:
                failures.append(str(e))
            except OSError as e:
                failures.append(f"{path}: {e.strerror or e}")
            else:
                records += index.n
                cached += was_cached
                built += not was_cached
            if len(failures) > reported:
                bar.note(f"{PROG} index: {failures[-1]}")
                reported = len(failures)
            bar.file_done(size)
    finally:
        bar.close()
    elapsed = time.monotonic() - bar.start
    print(
        f"{len(jobs)} files, {records} records, {_human(bar.total)}: {built} built, {cached} cached, "
        f"{len(failures)} failed, {skipped} skipped (no format) in {elapsed:.1f} s"
    )
    return EXIT_FAIL if failures else EXIT_OK


def _load_index(path: str, fmt: Any, cache: Any, progress: Callable[[int], None]) -> tuple[Any, bool]:
    """(index, True if it came from the cache)."""
    from ..formats import load_or_build_index
    from ..index.table import SourceStamp, cache_key

    stamp = SourceStamp.of(os.stat(path))
    index = cache.load(cache_key(path, stamp, fmt.name, fmt.params()), stamp)
    if index is not None:
        return index, True
    return load_or_build_index(path, fmt, cache, progress=progress), False
