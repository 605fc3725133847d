"""``shufflefs index``: build the offset tables of a source tree ahead of mounting."""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
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


def _part(text: str | None, parser: argparse.ArgumentParser) -> tuple[int, int]:
    if text is None:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        parser.error(f"--part {text!r}: expected i/N with 0 <= i < N, e.g. 3/16")
    return i, n


def cmd_index(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ..errors import ShuffleError
    from ..formats import resolve_format
    from ..index.table import IndexCache
    from ..sources import misspelled_url, scheme_of

    if misspelled_url(args.source):
        parser.error(misspelled_url(args.source))
    part = _part(args.part, parser)
    if scheme_of(args.source):
        return _index_store(args, parser, part)
    if args.index_url:
        parser.error("--index-url is where an s3:// source's indexes are published; a local source's go to --index-dir")
    opts = resolve_options(args, (*FORMAT_KEYS, "index_dir"), parser)
    if not os.path.isdir(args.source):
        parser.error(f"source {args.source!r} is not a directory")
    source = Path(os.path.realpath(args.source))
    if args.publish != (opts.values["index_dir"] is not None):
        parser.error("a local source's indexes are published with --publish --index-dir DIR (a shared path "
                     "that mounts then take as --index-dir)")
    where = opts.values["index_dir"] if args.publish else opts.values["cache_dir"]
    cache = IndexCache(_cache_dir(where, source, parser))

    jobs = []
    skipped = 0
    failures: list[str] = []
    for n, (path, rel) in enumerate(iter_source_files(source)):
        if n % part[1] != part[0]:
            continue
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
    # files side by side on every core (the scans are numpy and release the GIL); one file's
    # progress is shown as it is scanned, several files' as each ends
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    progress = bar.file_progress if workers == 1 else (lambda scanned: None)
    try:
        with ThreadPoolExecutor(workers) as pool:
            futures = {pool.submit(_load_index, path, fmt, cache, progress): (path, size) for path, fmt, size in jobs}
            for future in as_completed(futures):
                path, size = futures[future]
                try:
                    index, was_cached = future.result()
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


def _walk(store: Any, relpath: str = "") -> list[str]:
    """Every object under the store's root, in key order (the store's own prefix left out)."""
    out = []
    for name in store.list(relpath):
        rel = f"{relpath}/{name}" if relpath else name
        if stat.S_ISDIR(store.stat(rel).st_mode):
            out.extend(_walk(store, rel))
        else:
            out.append(rel)
    return out


def _index_store(args: argparse.Namespace, parser: argparse.ArgumentParser, part: tuple[int, int]) -> int:
    """``shufflefs index s3://...``: index the objects (downloading each), and with --publish
    write the indexes to the bucket."""
    from ..errors import ShuffleError
    from ..formats import resolve_format
    from ..sources import open_store

    if getattr(args, "index_dir", None) is not None:
        parser.error("--index-dir is for local sources; an s3:// source publishes beside its data, or to --index-url")
    opts = resolve_options(args, (*FORMAT_KEYS, "endpoint_url", "region", "index_url"), parser)
    cache_dir = _cache_dir(opts.values["cache_dir"], Path(os.devnull), parser)
    store_opts = {k: opts.values[k] for k in ("endpoint_url", "region", "index_url") if opts.values.get(k) is not None}
    try:
        store = open_store(args.source, store_opts)
    except (ValueError, ImportError, OSError, ShuffleError) as e:
        print(f"{PROG} index: {e}", file=sys.stderr)
        return EXIT_FAIL
    start = time.monotonic()
    done = published = nbytes = records = 0
    failures: list[str] = []

    def one(rel: str) -> tuple[int, int] | None:
        """(records, bytes published) of one object; None if it has no format."""
        fmt = resolve_format(rel, opts.rules, opts.format_defaults)
        if fmt is None:
            return None
        wrote = store.publish(rel, fmt, cache_dir) if args.publish else 0
        return store.index(rel, fmt, cache_dir).n, wrote

    try:
        objects = _walk(store)
        mine = [rel for n, rel in enumerate(objects) if n % part[1] == part[0]]
        # objects side by side: downloads wait on the network, scans release the GIL in numpy
        with ThreadPoolExecutor(max(2, os.cpu_count() or 2)) as pool:
            futures = {pool.submit(one, rel): rel for rel in mine}
            for future in tqdm(as_completed(futures), total=len(futures), unit="object", file=sys.stderr,
                               disable=not sys.stderr.isatty(), leave=False):
                try:
                    got = future.result()
                except (ShuffleError, OSError, ValueError) as e:
                    failures.append(f"{store.path(futures[future])}: {e}")
                    print(f"{PROG} index: {failures[-1]}", file=sys.stderr)
                    continue
                if got is not None:
                    records, done = records + got[0], done + 1
                    if args.publish:
                        nbytes, published = nbytes + got[1], published + 1
        counts = store.requests()
    finally:
        store.close()
    what = f", {published} published ({_human(nbytes)}) under {store.index_location}" if args.publish else ""
    print(f"{len(mine)} of {len(objects)} objects (part {part[0]}/{part[1]}): {done} indexed, {records} records"
          f"{what}, {len(failures)} failed; {_human(counts.get('bytes', 0))} downloaded in "
          f"{time.monotonic() - start:.1f} s")
    return EXIT_FAIL if failures else EXIT_OK
