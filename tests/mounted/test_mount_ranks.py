"""Level: mounted (real FUSE mounts, real readers).

Ranks and loader parts through real mounts: W mounts of one source, K parts of each view.

Every rank mounts the same source with its own ``--rank``; together the ranks' views must hold
every source record exactly once, epoch after epoch, and the parts under ``.parts/K/i/`` of a
rank's mount must split that rank's view exactly.
"""

from __future__ import annotations

import collections
import errno
import io
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO
from test_mount import ARGS, RECORD, jsonl, lines, read

N_LINES = 900


def fixed(n: int) -> bytes:
    return b"".join(struct.pack("<I", i).ljust(RECORD, b"r") for i in range(n))


def records_of(data: bytes, rel: str) -> collections.Counter:
    if rel.endswith(".bin"):
        return collections.Counter(data[i: i + RECORD] for i in range(0, len(data), RECORD))
    return lines(data)


def cat(path) -> bytes:
    """Read with a real program."""
    return subprocess.run(["cat", str(path)], check=True, capture_output=True).stdout


@pytest.mark.parametrize("strategy", ["corgipile", "full", "window"])
def test_ranks_together_hold_every_record_exactly_once_every_epoch(mount, strategy: str):
    """Holds: SEMANTICS.md#ranks-share, SEMANTICS.md#views-size"""
    files = {"a.jsonl": jsonl(N_LINES, 3), "d/b.bin": fixed(700)}
    world = 3
    first = mount(files, *ARGS, "--strategy", strategy, "--rank", "0", "--world-size", str(world))
    ranks = [first] + [mount(None, *ARGS, "--strategy", strategy, "--rank", str(r), "--world-size", str(world),
                             src=first.src) for r in range(1, world)]
    for epoch in (0, 1):
        for m in ranks:
            m.set_epoch(epoch)
        for rel in files:
            source = records_of((first.src / rel).read_bytes(), rel)
            views = [cat(m.path(rel)) for m in ranks]
            got = sum((records_of(v, rel) for v in views), collections.Counter())
            assert got == source, f"{rel} epoch {epoch}: the ranks' views are not the source records"
            assert all(os.stat(m.path(rel)).st_size == len(v) for m, v in zip(ranks, views))
            counts = [sum(records_of(v, rel).values()) for v in views]
            assert [int(m.xattr("records", rel)) for m in ranks] == counts
        if epoch == 0:
            before = [cat(m.path("a.jsonl")) for m in ranks]
    assert before != [cat(m.path("a.jsonl")) for m in ranks]  # a new epoch, a new order


def test_parts_split_a_ranks_view_exactly(mount):
    """Holds: SEMANTICS.md#ranks-parts, SEMANTICS.md#tree-parts, SEMANTICS.md#epochs-root"""
    files = {"a.jsonl": jsonl(N_LINES, 5), "d/b.bin": fixed(500)}
    m = mount(files, *ARGS, "--rank", "1", "--world-size", "2")
    for k in (1, 2, 3):
        for rel in files:
            whole = records_of(cat(m.path(rel)), rel)
            parts = [records_of(cat(m.path(f".parts/{k}/{i}/{rel}")), rel) for i in range(k)]
            assert sum(parts, collections.Counter()) == whole
            assert all(not (parts[i] & parts[j]) for i in range(k) for j in range(i + 1, k))  # disjoint
    # the tree is mirrored under a part; the split directories list nothing and are not listed
    assert sorted(os.listdir(m.path(".parts/2/1"))) == sorted(os.listdir(m.path("")))
    assert os.listdir(m.path(".parts")) == [] and os.listdir(m.path(".parts/2")) == []
    assert ".parts" not in os.listdir(m.path(""))
    for bad in (".parts/0", ".parts/2/2", ".parts/x", ".parts/2/01", ".parts/99999"):
        with pytest.raises(FileNotFoundError):
            os.stat(m.path(bad))
    # an epoch set on a part tree's root is the mount's epoch
    m.set_epoch(4, ".parts/2/0")
    assert m.xattr("epoch") == "4" and m.xattr("epoch", ".parts/3/2/a.jsonl") == "4"


def test_rank_and_world_size_default_from_the_environment(mount, monkeypatch):
    """Holds: SEMANTICS.md#ranks-env"""
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    m = mount({"a.jsonl": jsonl(200, 1)}, *ARGS)
    stats = m.stats()
    assert (stats["rank"], stats["world"]) == (2, 4)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(subprocess.CalledProcessError) as e:
        subprocess.run([sys.executable, "-m", "shufflefs", "mount", "-f", str(m.src), str(m.mnt.parent / "x")],
                       check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert b"--rank 4 must be smaller than --world-size 4" in e.value.stderr


@pytest.mark.parametrize("even", ["pad", "drop"])
def test_even_counts_per_rank(mount, even: str):
    # blocks of 4 KiB over records of ~40-100 bytes: exact shares differ by many records
    """Holds: SEMANTICS.md#ranks-even"""
    files = {"a.jsonl": jsonl(N_LINES, 9)}
    world = 3
    first = mount(files, *ARGS, "--rank", "0", "--world-size", str(world), "--even", even)
    ranks = [first] + [mount(None, *ARGS, "--rank", str(r), "--world-size", str(world), "--even", even,
                             src=first.src) for r in range(1, world)]
    views = [records_of(read(m.path("a.jsonl")), "a.jsonl") for m in ranks]
    counts = [sum(v.values()) for v in views]
    assert len(set(counts)) == 1
    source = lines(files["a.jsonl"])
    total = sum(views, collections.Counter())
    if even == "pad":
        assert set(total) == set(source) and counts[0] * world >= N_LINES
        assert sum(total.values()) - N_LINES == counts[0] * world - N_LINES
    else:
        assert all(total[r] <= 1 for r in total) and not (set(total) - set(source))
        assert counts[0] * world <= N_LINES
    assert all(m.stats()["even"] == even for m in ranks)


def test_a_part_view_refuses_writes_like_any_view(mount):
    """Holds: SEMANTICS.md#errors-erofs"""
    m = mount({"a.jsonl": jsonl(50, 2)}, *ARGS)
    with pytest.raises(OSError) as e:
        open(m.path(".parts/2/0/a.jsonl"), "r+b")
    assert e.value.errno in (errno.EROFS, errno.EACCES)
    with pytest.raises(OSError):
        os.mkdir(m.path(".parts/2/0/new"))


@pytest.mark.parametrize("local", ["uniform", "corgipile"])
def test_pls_through_mounts_trades_the_exchanged_fraction(mount, local: str):
    files = {"a.jsonl": jsonl(N_LINES, 11)}
    world = 2
    args = [*ARGS, "--strategy", "pls", "--exchange", "0.25", "--world-size", str(world), "--pls-local", local]
    first = mount(files, *args, "--rank", "0")
    ranks = [first, mount(None, *args, "--rank", "1", src=first.src)]
    source = lines(files["a.jsonl"])
    held = []
    for epoch in (0, 1, 2):
        for m in ranks:
            m.set_epoch(epoch)
        views = [lines(cat(m.path("a.jsonl"))) for m in ranks]
        assert sum(views, collections.Counter()) == source
        infos = [json.loads(m.xattr("info", "a.jsonl")) for m in ranks]
        assert all(i["local"] == local for i in infos)
        if held:
            sent = infos[0]["sent"]
            assert sent == int(0.25 * min(i["partition_records"] for i in infos)) > 0
            for v, before, info in zip(views, held, infos):
                assert len(set(v) & set(before)) == info["kept"] == sum(v.values()) - sent
                assert info["received"] == sent
        # `shufflefs stat` shows the same counts
        for m, info in zip(ranks, infos):
            text = subprocess.run([sys.executable, "-m", "shufflefs", "stat", str(m.path(""))], check=True,
                                  capture_output=True, text=True, cwd=REPO).stdout
            assert (f"a.jsonl: epoch {epoch}: kept {info['kept']} received {info['received']} "
                    f"sent {info['sent']} of {info['partition_records']}") in text, text
        held = views


def tokens_jsonl(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return b"".join(json.dumps({"id": i, "tokens": int(t), "text": "t" * int(t)}).encode() + b"\n"
                    for i, t in enumerate(rng.integers(1, 200, n)))


@pytest.mark.parametrize("cost", ["bytes", "field"])
def test_balanced_ranks_pair_records_of_similar_cost(mount, cost: str):
    """--balance: every record once across the ranks, and at random_level 0 the i-th record of
    rank 0 never costs more than rank 1's (each step's records are neighbours in cost order,
    the cheaper to the lower rank); unbalanced ``full`` breaks that pairing."""
    files = {"a.jsonl": tokens_jsonl(N_LINES, 11)}
    flag = ["--balance"] if cost == "bytes" else ["--balance-field", "tokens"]
    common = [*ARGS, "--strategy", "full", "--world-size", "2", *flag]
    first = mount(files, *common, "--rank", "0")
    ranks = [first, mount(None, *common, "--rank", "1", src=first.src)]
    plain = mount(None, *ARGS, "--strategy", "full", "--world-size", "2", "--rank", "1", src=first.src)

    def costs(data: bytes) -> list[int]:
        return [len(x) if cost == "bytes" else json.loads(x)["tokens"] for x in data.splitlines(keepends=True)]

    source = records_of((first.src / "a.jsonl").read_bytes(), "a.jsonl")
    for epoch in (0, 1):
        for m in (*ranks, plain):
            m.set_epoch(epoch)
        views = [cat(m.path("a.jsonl")) for m in ranks]
        assert sum((records_of(v, "a.jsonl") for v in views), collections.Counter()) == source
        c0, c1 = (costs(v) for v in views)
        assert abs(len(c0) - len(c1)) <= 1
        assert all(a <= b for a, b in zip(c0, c1)), f"epoch {epoch}: a step's records are not paired by cost"
        unbalanced = costs(cat(plain.path("a.jsonl")))
        assert not all(a <= b for a, b in zip(c0, unbalanced))
    stats = first.stats()
    assert stats["balance"] is True and stats["balance_field"] == (None if cost == "bytes" else "tokens")
    info = json.loads(first.xattr("info", "a.jsonl"))
    assert info["balance"] == ("bytes" if cost == "bytes" else "tokens")


def test_balance_field_missing_is_an_error_naming_the_record(mount):
    data = tokens_jsonl(50, 12) + b'{"id": 50}\n'
    m = mount({"a.jsonl": data}, *ARGS, "--strategy", "full", "--balance-field", "tokens")
    with pytest.raises(OSError) as e, open(m.path("a.jsonl"), "rb") as f:
        f.read()
    assert e.value.errno == errno.EIO
    offset = len(tokens_jsonl(50, 12))
    assert any(f"at source offset {offset}" in line and "has no field 'tokens'" in line
               for line in m.stats().get("last_errors", [])), m.stats()


def test_balance_needs_strategy_full(mount, tmp_path):
    src = tmp_path / "s"
    src.mkdir()
    (src / "a.jsonl").write_bytes(jsonl(10, 1))
    mnt = tmp_path / "m"
    mnt.mkdir()
    out = subprocess.run([sys.executable, "-m", "shufflefs", "mount", str(src), str(mnt), "--balance",
                          "--cache-dir", str(tmp_path / "c")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 2 and "needs strategy full" in out.stderr, out.stderr


def test_pls_ranks_at_epoch_a_billion_hold_every_record_once_in_equal_shares(mount):
    data = b"".join(b'{"id": %07d}\n' % i for i in range(30000))
    views = []
    src = None
    for rank in range(2):
        m = mount({"a.jsonl": data} if src is None else None, "--strategy", "pls", "--exchange", "0.25",
                  "--world-size", "2", "--rank", str(rank), "--block-size", "4KiB", "--buffer", "64KiB",
                  "--epoch", str(10**9), src=src, name=f"r{rank}")
        src = m.src
        views.append(open(m.path("a.jsonl"), "rb").read().splitlines(keepends=True))
        info = json.loads(m.xattr("info", "a.jsonl"))
        assert info["received"] == info["sent"] == int(0.25 * 15000)
    assert [len(v) for v in views] == [15000, 15000]
    assert sorted(views[0] + views[1]) == data.splitlines(keepends=True)


@pytest.mark.parametrize("even", ["none", "pad", "drop"])
def test_npy_rank_shares_and_parts_load_with_numpy_plain_and_mapped(mount, even):
    arr = np.arange(10007 * 3, dtype=np.int32).reshape(10007, 3)
    buf = io.BytesIO()
    np.save(buf, arr)
    rows = []
    src = None
    for rank in range(3):
        m = mount({"a.npy": buf.getvalue()} if src is None else None, "--world-size", "3", "--rank", str(rank),
                  "--even", even, "--block-size", "4KiB", "--buffer", "32KiB", src=src, name=f"r{rank}")
        src = m.src
        share = np.load(m.path("a.npy"))
        assert np.array_equal(np.load(m.path("a.npy"), mmap_mode="r"), share)
        parts = [np.load(m.path(f".parts/3/{i}/a.npy")) for i in range(3)]
        assert all(np.array_equal(np.load(m.path(f".parts/3/{i}/a.npy"), mmap_mode="r"), p)
                   for i, p in enumerate(parts))
        joined = np.concatenate(parts)  # the parts hold the share's rows (each shuffled in its buffer)
        assert len(joined) == len(share)
        if even == "none":  # (padding repeats each part's own first rows)
            assert np.array_equal(joined[np.lexsort(joined.T[::-1])], share[np.lexsort(share.T[::-1])])
        rows.append(share)
    got = np.concatenate(rows)
    if even == "none":
        assert np.array_equal(got[np.argsort(got[:, 0])], arr)
    else:
        assert len({len(r) for r in rows}) == 1
        assert set(got[:, 0].tolist()) <= set(arr[:, 0].tolist())


@pytest.mark.parametrize("strategy", ["corgipile", "block", "none", "lirs-page", "full", "pls"])
def test_four_ranks_get_equal_shares_of_pooled_shards_and_of_a_single_file(mount, strategy):
    """Holds: SEMANTICS.md#ranks-share, SEMANTICS.md#ranks-pools"""
    shards = {f"part-{i:05d}.jsonl": b"".join(b'{"s": %d, "i": %05d, "pad": "%s"}\n' % (i, j, b"x" * (j % 40))
                                                for j in range(2500)) for i in range(8)}
    single = b"".join(b'{"i": %06d, "pad": "%s"}\n' % (j, b"y" * (j % 60)) for j in range(20001))
    files = {**{f"pool/{k}": v for k, v in shards.items()}, "one/train.jsonl": single}
    got: dict[str, list[list[bytes]]] = {"pool": [], "one": []}
    src = None
    for rank in range(4):
        m = mount(files if src is None else None, "--strategy", strategy, "--world-size", "4", "--rank", str(rank),
                  "--block-size", "16KiB", "--buffer", "128KiB", src=src, name=f"r{rank}")
        src = m.src
        got["pool"].append(b"".join(open(m.path(f"pool/{k}"), "rb").read() for k in sorted(shards)).splitlines())
        got["one"].append(open(m.path("one/train.jsonl"), "rb").read().splitlines())
    for what, source in (("pool", b"".join(shards.values())), ("one", single)):
        counts = [len(r) for r in got[what]]
        assert max(counts) - min(counts) <= 1, (what, counts)
        assert sorted(sum(got[what], [])) == sorted(source.splitlines()), what
