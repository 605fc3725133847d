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
from shufflefs.layout import render
from shufflefs.serve import xattrs
from shufflefs.serve.catalog import Catalog
from shufflefs.serve.nodes import ROOT, VIEW, Node, Reply
from shufflefs.strategies import STRATEGIES, ShuffleSpec, make_plan

SPEC = dict(seed=5, block_size=4096, buffer=16384)


def jsonl(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(json.dumps({"id": i, "pad": "x" * int(rng.integers(0, 90))}).encode() + b"\n" for i in range(n))


def reference(path: Path, spec: ShuffleSpec, epoch: int, rank: int = 0, world: int = 1,
              part: int = 0, parts: int = 1) -> bytes:
    index = scan_file(path, resolve_format(path.name, [], {}))
    return render(index, make_plan(index, spec, epoch, rank, world, part, parts), path.read_bytes())


def run(src: Path, tmp: Path, body: Callable[[Catalog], Awaitable[Any]], **config: Any) -> Any:
    """``body(catalog)`` with the catalog started in a nursery, then shut down."""
    strategy = config.pop("strategy", "corgipile")
    cfg = MountConfig(src, tmp / "mnt", spec=ShuffleSpec(strategy=strategy, **SPEC), cache_dir=tmp / "cache", **config)

    async def main() -> Any:
        cat = Catalog(cfg)
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
    spec = ShuffleSpec(strategy="corgipile", **SPEC)
    path = src / "a.jsonl"

    async def body(cat: Catalog) -> None:
        old = await lookup(cat, "a.jsonl")
        h = await cat.open(old)
        first = bytes(await cat.read(h, 0, 1000))
        xattrs.set(cat, cat.tree.node(ROOT), b"user.shufflefs.epoch", b"3\n")
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
                xattrs.set(cat, cat.tree.node(ROOT), b"user.shufflefs.epoch", bad)
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
            xattrs.set(cat, root, b"user.shufflefs.strategy", b"full")
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
