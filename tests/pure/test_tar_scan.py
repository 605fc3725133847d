"""Level: pure (no mount, no daemon).

Tar shards as WebDataset samples: over archives that `tarfile` writes with random member counts,
sizes, long names (GNU and pax), non-ASCII names and directories, the scan finds the samples
`webdataset` finds, and every shuffled view of them is a tar that `tarfile`, GNU ``tar`` and
`webdataset` read as the same samples with identical bytes.  Damaged archives are a
`FormatError` naming the offset, never an index."""

from __future__ import annotations

import collections
import io
import shutil
import subprocess
import tarfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shufflefs.errors import FormatError
from shufflefs.formats import parse_format_option, resolve_format
from shufflefs.formats.tar import TarFormat
from shufflefs.strategies import STRATEGIES, ShuffleSpec, make_plan
from shufflefs.windows.layout import render

FORMATS = {"gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT, "ustar": tarfile.USTAR_FORMAT}


def make_tar(members: list[tuple[str, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """``(name, data)``; data None: a directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def samples(data: bytes, members: bool = False) -> list:
    """What webdataset reads: samples as dicts of suffix -> bytes, in order."""
    from webdataset.tariterators import group_by_keys, tar_file_expander

    got = list(group_by_keys(tar_file_expander([{"stream": io.BytesIO(data), "url": "t.tar"}])))
    return [{k: v for k, v in s.items() if not k.startswith("__")} | {"__key__": s["__key__"]} for s in got]


def contents(data: bytes) -> collections.Counter:
    with tarfile.open(fileobj=io.BytesIO(data)) as t:
        return collections.Counter((m.name, m.type, t.extractfile(m).read() if m.isreg() else None)
                                   for m in t.getmembers())


def scan(data: bytes):
    return TarFormat().scan(np.frombuffer(data, np.uint8), "t.tar")


@st.composite
def archives(draw) -> tuple[list[tuple[str, bytes | None]], int]:
    fmt_name = draw(st.sampled_from(sorted(FORMATS)))
    n = draw(st.integers(0, 12))
    suffixes = ["jpg", "json", "cls", "txt", "seg.png"]
    out: list[tuple[str, bytes | None]] = []
    for i in range(n):
        stem = draw(st.sampled_from([f"{i:06d}", f"d{i % 3}/{i:04d}", "x" * 120 + f"/{i}",
                                     f"long-{'y' * 110}-{i}", f"ñame-{i}"]))
        if fmt_name == "ustar" and (len(stem) > 90 or not stem.isascii()):
            stem = f"u{i}"
        if draw(st.booleans()) and fmt_name != "ustar":
            out.append((stem.rsplit("/", 1)[0] + "/" if "/" in stem else f"dir{i}/", None))
        for suf in draw(st.lists(st.sampled_from(suffixes), min_size=1, max_size=3, unique=True)):
            out.append((f"{stem}.{suf}", draw(st.binary(max_size=1500))))
    return out, FORMATS[fmt_name]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(archives(), st.sampled_from(sorted(STRATEGIES)), st.integers(0, 3))
def test_every_view_is_a_tar_of_the_same_samples(arch, strategy: str, epoch: int) -> None:
    members, fmt = arch
    data = make_tar(members, fmt)
    index = scan(data)
    source_samples = samples(data)
    assert index.n == len(source_samples)
    spec = ShuffleSpec(strategy=strategy, seed=3, block_size=4096, buffer=8192)
    view = render(index, make_plan(index, spec, epoch), data)
    assert len(view) == len(data)
    assert contents(view) == contents(data)
    got = samples(view)
    key = lambda s: s["__key__"]  # noqa: E731
    assert sorted(got, key=key) == sorted(source_samples, key=key)


def test_a_sample_moves_with_its_long_name_and_pax_headers() -> None:
    long = "a" * 200
    members = [(f"{long}/0001.jpg", b"J1"), (f"{long}/0001.cls", b"1"), ("0002.jpg", b"J2"),
               ("ü/0003.txt", b"t")]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        data = make_tar(members, fmt)
        index = scan(data)
        assert index.n == 3
        order = np.array([2, 1, 0])
        plan = make_plan(index, ShuffleSpec(strategy="none"), 0)
        view = render(index, plan, data)
        assert view == data
        pieces = [data[index.bounds[i]: index.bounds[i + 1]] for i in order]
        shuffled = data[:index.bounds[0]] + b"".join(pieces) + data[index.bounds[-1]:]
        assert [s["__key__"] for s in samples(shuffled)] == ["ü/0003", "0002", f"{long}/0001"]
        assert contents(shuffled) == contents(data)


def test_gnu_tar_lists_a_shuffled_view(tmp_path) -> None:
    if shutil.which("tar") is None:
        pytest.skip("GNU tar is not installed")
    members = [(f"{i:04d}.{s}", bytes([i]) * (i * 37 % 900)) for i in range(40) for s in ("jpg", "cls")]
    data = make_tar(members + [("z" * 150 + ".json", b"{}")], tarfile.GNU_FORMAT)
    index = scan(data)
    view = render(index, make_plan(index, ShuffleSpec(strategy="full", seed=1), 2), data)
    (tmp_path / "v.tar").write_bytes(view)
    out = subprocess.run(["tar", "-tf", str(tmp_path / "v.tar")], capture_output=True, text=True, check=True)
    names = out.stdout.split()
    assert sorted(names) == sorted(n for n, _ in members + [("z" * 150 + ".json", b"")])
    assert names != [n for n, _ in members]  # shuffled, and each sample's two members together
    pos = {n: i for i, n in enumerate(names)}
    assert all(pos[f"{i:04d}.cls"] == pos[f"{i:04d}.jpg"] + 1 for i in range(40))


def test_leading_entries_stay_first_and_the_end_stays_last() -> None:
    data = make_tar([("top/", None), ("README", b"read me"), ("top/0.jpg", b"0"), ("top/1.jpg", b"1"),
                     ("top/sub/", None), ("top/2.jpg", b"2")])
    index = scan(data)
    assert index.n == 3
    with tarfile.open(fileobj=io.BytesIO(data[:index.bounds[0]] + b"\0" * 1024)) as t:
        assert [m.name for m in t.getmembers()] == ["top", "README"]  # the view's header
    assert not any(data[index.bounds[-1]:])  # end-of-archive blocks and padding


def test_empty_and_memberless_archives() -> None:
    assert scan(b"").n == 0
    assert scan(make_tar([])).n == 0
    only_dirs = make_tar([("a/", None), ("b/", None)])
    index = scan(only_dirs)
    assert index.n == 0 and index.header_end == index.trailer_start > 0


def test_a_tar_inside_a_tar_is_data() -> None:
    inner = make_tar([(f"{i}.jpg", b"x" * 700) for i in range(5)])
    data = make_tar([("0.tar", inner), ("0.cls", b"1"), ("1.tar", inner)])
    index = scan(data)
    assert index.n == 2 and [s["__key__"] for s in samples(data)] == ["0", "1"]


def bad(data: bytes, match: str) -> FormatError:
    with pytest.raises(FormatError, match=match) as e:
        scan(data)
    assert e.value.path == "t.tar" and e.value.offset is not None
    return e.value


def test_damaged_archives_name_the_offset() -> None:
    data = bytearray(make_tar([(f"{i}.jpg", b"x" * 1000) for i in range(4)]))
    second = 512 + 1024  # header of the second member
    damaged = bytearray(data)
    damaged[second + 5] ^= 0xFF  # a byte of its name: the checksum no longer holds
    assert bad(bytes(damaged), "bad header checksum").offset == second
    assert bad(bytes(data[: second + 700]), "512-byte").offset == second + 512
    assert bad(bytes(data[: second + 1024]), "truncated").offset == second  # its data cut short
    garbage = bytearray(data)
    garbage[second: second + 512] = b"G" * 512
    assert bad(bytes(garbage), "no tar header").offset == second
    split = make_tar([("a.jpg", b"1"), ("b.jpg", b"2"), ("a.cls", b"3")])
    assert bad(split, "split").offset == 2048


def test_the_format_is_chosen_by_extension_or_declared_by_glob() -> None:
    assert isinstance(resolve_format("shards/shard-000000.tar", [], {}), TarFormat)
    rules = [parse_format_option("*.wds=tar")]
    assert isinstance(resolve_format("d/train-0.wds", rules, {}), TarFormat)
    assert resolve_format("d/x.tar", [parse_format_option("*.tar=none")], {}) is None
