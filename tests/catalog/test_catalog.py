"""Level: catalog (trio, no mount).

The catalog serves views without FUSE: lookups, opens, reads,
epochs, parts and errors driven directly from trio, compared with `layout.render` of the same
plan.  The mounted suites check the same through the kernel; these pin the catalog's own
contract (what the adapter relies on) and run in a fraction of the time."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any, Awaitable, Callable

import numpy as np
import pytest
import trio

from shufflefs.config import MountConfig
from shufflefs.formats import resolve_format, scan_file
from shufflefs.serve import xattrs
from shufflefs.serve.catalog import Catalog
from shufflefs.serve.nodes import ROOT, VIEW, Node, Reply
from shufflefs.sources import index_by_scan
from shufflefs.sources.local import LocalStore, SourceFile
from shufflefs.strategies import STRATEGIES, ShuffleSpec, make_plan
from shufflefs.windows.layout import render

SPEC = dict(seed=5, block_size=4096, buffer=16384)


def jsonl(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(json.dumps({"id": i, "pad": "x" * int(rng.integers(0, 90))}).encode() + b"\n" for i in range(n))


def reference(path: Path, spec: ShuffleSpec, epoch: int, rank: int = 0, world: int = 1,
              part: int = 0, parts: int = 1) -> bytes:
    index = scan_file(path, resolve_format(path.name, [], {}))
    return render(index, make_plan(index, spec, epoch, rank, world, part, parts), path.read_bytes())


def run(src: Path, tmp: Path, body: Callable[[Catalog], Awaitable[Any]], store: Any = None, **config: Any) -> Any:
    """``body(catalog)`` with the catalog started in a nursery, then shut down."""
    strategy = config.pop("strategy", "corgipile")
    cfg = MountConfig(src, tmp / "mnt", spec=ShuffleSpec(strategy=strategy, **SPEC), cache_dir=tmp / "cache", **config)

    async def main() -> Any:
        cat = Catalog(cfg, store)
        try:
            async with trio.open_nursery() as nursery:
                cat.start(nursery)
                result = await body(cat)
                nursery.cancel_scope.cancel()
            return result
        finally:
            cat.stopping()
            cat.shutdown()

    return trio.run(main)


async def lookup(cat: Catalog, relpath: str) -> Node:
    node = cat.tree.node(ROOT)
    for name in relpath.split("/"):
        node = await cat.lookup(node, name)
    return node


async def read_all(cat: Catalog, node: Node, sizes: tuple[int, ...] = (4096, 1 << 20, 333)) -> bytes:
    """The view read front to back in reads of varying sizes (crossing windows)."""
    h = await cat.open(node)
    try:
        out, off, i = bytearray(), 0, 0
        while True:
            data = await cat.read(h, off, sizes[i % len(sizes)])
            if not len(data):
                return bytes(out)
            out += data
            off += len(data)
            i += 1
    finally:
        cat.release(h)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    d = tmp_path / "src"
    (d / "sub").mkdir(parents=True)
    (d / "a.jsonl").write_bytes(jsonl(3000, 1))
    (d / "sub" / "b.jsonl").write_bytes(jsonl(500, 2))
    (d / "notes.md").write_bytes(b"not data\n")
    return d


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_views_equal_reference(src: Path, tmp_path: Path, strategy: str) -> None:
    spec = ShuffleSpec(strategy=strategy, **SPEC)

    async def body(cat: Catalog) -> None:
        node = await lookup(cat, "a.jsonl")
        assert node.kind == VIEW and node.size == (src / "a.jsonl").stat().st_size
        assert await read_all(cat, node) == reference(src / "a.jsonl", spec, 0)
        plain = await lookup(cat, "notes.md")
        assert plain.kind != VIEW and await read_all(cat, plain) == b"not data\n"

    run(src, tmp_path, body, strategy=strategy)


def test_epoch_moves_names_not_open_handles(src: Path, tmp_path: Path) -> None:
    """Holds: SEMANTICS.md#epochs-handles, SEMANTICS.md#views-inode"""
    spec = ShuffleSpec(strategy="corgipile", **SPEC)
    path = src / "a.jsonl"

    async def body(cat: Catalog) -> None:
        old = await lookup(cat, "a.jsonl")
        h = await cat.open(old)
        first = bytes(await cat.read(h, 0, 1000))
        await xattrs.set(cat, cat.tree.node(ROOT), b"user.shufflefs.epoch", b"3\n")
        new = await lookup(cat, "a.jsonl")
        assert new.ino != old.ino and new.epoch == 3 and old.epoch == 0
        assert await xattrs.get(cat, new, b"user.shufflefs.epoch") == b"3"
        rest = bytearray(first)
        while data := await cat.read(h, len(rest), 1 << 16):
            rest += data
        cat.release(h)
        assert bytes(rest) == reference(path, spec, 0)
        assert await read_all(cat, new) == reference(path, spec, 3) != reference(path, spec, 0)
        for bad in (b"-1", b"x", b"2147483648", b"1e3"):
            with pytest.raises(Reply) as e:
                await xattrs.set(cat, cat.tree.node(ROOT), b"user.shufflefs.epoch", bad)
            assert e.value.errno == errno.EINVAL

    run(src, tmp_path, body)


def test_parts_split_a_rank_share(src: Path, tmp_path: Path) -> None:
    spec = ShuffleSpec(strategy="corgipile", **SPEC)
    path = src / "a.jsonl"

    async def body(cat: Catalog) -> None:
        got = [await read_all(cat, await lookup(cat, f".parts/3/{i}/a.jsonl")) for i in range(3)]
        for i, data in enumerate(got):
            assert data == reference(path, spec, 0, part=i, parts=3)
        assert sorted(b"".join(got).splitlines()) == sorted(path.read_bytes().splitlines())
        with pytest.raises(Reply) as e:
            await lookup(cat, ".parts/3/3")
        assert e.value.errno == errno.ENOENT

    run(src, tmp_path, body)


def test_rank_share_sized_by_its_plan(src: Path, tmp_path: Path) -> None:
    spec = ShuffleSpec(strategy="corgipile", **SPEC)
    path = src / "sub" / "b.jsonl"

    async def body(cat: Catalog) -> bytes:
        node = await lookup(cat, "sub/b.jsonl")
        want = reference(path, spec, 0, rank=1, world=2)
        assert node.size == len(want)
        return await read_all(cat, node)

    assert run(src, tmp_path, body, rank=1, world=2) == reference(path, spec, 0, rank=1, world=2)


def test_changed_source_is_estale_never_bytes(src: Path, tmp_path: Path) -> None:
    """Holds: SEMANTICS.md#changes-open-estale"""
    path = src / "a.jsonl"

    async def body(cat: Catalog) -> None:
        node = await lookup(cat, "a.jsonl")
        h = await cat.open(node)
        await cat.read(h, 0, 100)
        st = path.stat()
        data = bytearray(path.read_bytes())
        data[10:12] = b"ZZ"
        path.write_bytes(bytes(data))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
        with pytest.raises(Reply) as e:
            await cat.read(h, 0, 100)
        assert e.value.errno == errno.ESTALE
        with pytest.raises(Reply) as e:  # and stays refused
            await cat.read(h, 50_000, 100)
        assert e.value.errno == errno.ESTALE
        cat.release(h)
        assert any("a.jsonl" in str(msg) for msg in xattrs.describe(cat)["last_errors"])

    run(src, tmp_path, body)


def test_refusals(src: Path, tmp_path: Path) -> None:
    async def body(cat: Catalog) -> None:
        root = cat.tree.node(ROOT)
        with pytest.raises(Reply) as e:
            await lookup(cat, "missing.jsonl")
        assert e.value.errno == errno.ENOENT
        with pytest.raises(Reply) as e:
            await cat.open(await lookup(cat, "sub"))
        assert e.value.errno == errno.EISDIR
        with pytest.raises(Reply) as e:
            await xattrs.set(cat, root, b"user.shufflefs.strategy", b"full")
        assert e.value.errno == errno.EPERM
        with pytest.raises(Reply) as e:
            await xattrs.get(cat, root, b"user.other")
        assert e.value.errno == errno.ENODATA
        with pytest.raises(Reply) as e:
            cat.tree.node(10**9)
        assert e.value.errno == errno.ESTALE
        names = [p.name for p in await cat.listing(root)]
        assert names == ["a.jsonl", "notes.md", "sub"]

    run(src, tmp_path, body)


class RemoteLike(LocalStore):
    """The local tree seen the way a store without file descriptors (object storage) shows it:
    sources that only read runs of bytes, stats without block counts, indexes by `index_by_scan`."""

    opened = 0

    class Source:
        local_fd = -1

        def __init__(self, inner: SourceFile) -> None:
            self.inner = inner

        def place(self, index: Any, first: Any, count: Any) -> None:
            return None

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    def open(self, relpath: str, stamp: Any) -> Any:
        RemoteLike.opened += 1
        return RemoteLike.Source(super().open(relpath, stamp))

    def stat(self, relpath: str, follow_last: bool = False) -> os.stat_result:
        st = super().stat(relpath, follow_last)
        return os.stat_result(tuple(st)[:10], {"st_atime_ns": st.st_atime_ns, "st_mtime_ns": st.st_mtime_ns,
                                               "st_ctime_ns": st.st_ctime_ns})

    def index(self, relpath: str, fmt: Any, cache_dir: Any) -> Any:
        return index_by_scan(self, relpath, fmt, cache_dir)


@pytest.mark.parametrize("strategy", ["corgipile", "full"])
def test_a_store_without_descriptors_serves_the_same_bytes(src: Path, tmp_path: Path, strategy: str) -> None:
    """Windows of a source without descriptors are built from its ``read_runs`` (single files and
    pools of shards), byte for byte the views of the same files read locally."""
    for i in range(3):
        (src / f"shard-{i:05d}-of-00003.jsonl").write_bytes(jsonl(700 + 50 * i, 10 + i))
    names = ["a.jsonl", "sub/b.jsonl"] + [f"shard-{i:05d}-of-00003.jsonl" for i in range(3)]

    async def body(cat: Catalog) -> list[bytes]:
        nodes = [await lookup(cat, n) for n in names]
        assert [n.pool is not None for n in nodes] == [False, False, True, True, True]
        return [await read_all(cat, n) for n in nodes]

    local = run(src, tmp_path / "local", body, strategy=strategy)
    RemoteLike.opened = 0
    remote = run(src, tmp_path / "remote", body, store=RemoteLike(str(src)), strategy=strategy)
    assert RemoteLike.opened >= len(names)
    assert remote == local
    assert remote[0] == reference(src / "a.jsonl", ShuffleSpec(strategy=strategy, **SPEC), 0)
    shards = b"".join(remote[2:])
    want = b"".join((src / n).read_bytes() for n in names[2:])
    assert sorted(shards.splitlines()) == sorted(want.splitlines()) and shards != want
