"""Level: pure (no mount, no daemon).

Shard sets: which data files are pooled, in which order, and which are left alone."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shufflefs.formats import FormatRule
from shufflefs.pools.shards import (
    ShardSet,
    find_sets,
    membership,
    path_order,
    shard_key,
)

SETTINGS = settings(max_examples=200, deadline=None)

EXT_FORMATS = {
    ".jsonl": "lines", ".jsonl.gz": "lines-gz", ".csv": "csv", ".tfrecord": "tfrecord",
    ".npy": "npy", ".tar": "tar", ".tar.gz": "tar-gz", "": "lines",
}


def by_ext(relpath: str) -> str | None:
    """Format by the whole multi-part extension; names without a dot read as "lines"."""
    name = posixpath.basename(relpath)
    if name.startswith("README"):
        return None
    ext = name[name.index("."):] if "." in name else ""
    return EXT_FORMATS.get(ext)


def keys(sets: list[ShardSet]) -> dict[str, tuple[str, ...]]:
    return {s.key: s.members for s in sets}


# --------------------------------------------------------------------------- shard names


@pytest.mark.parametrize("name, expected", [
    ("train-00000-of-00064.tfrecord", ("train-*-of-00064.tfrecord", 0)),
    ("train-00063-of-00064.tfrecord", ("train-*-of-00064.tfrecord", 63)),
    ("part-00001.jsonl", ("part-*.jsonl", 1)),
    ("shard-000123.tar", ("shard-*.tar", 123)),
    ("data_0.npy", ("data_*.npy", 0)),
    ("p-9.jsonl", ("p-*.jsonl", 9)),
    ("p-10.jsonl", ("p-*.jsonl", 10)),
    ("v2-train-0001.jsonl", ("v2-train-*.jsonl", 1)),
    ("a-0001.jsonl.gz", ("a-*.jsonl.gz", 1)),
    ("b-7.tar.gz", ("b-*.tar.gz", 7)),
    ("c.3.jsonl", ("c.*.jsonl", 3)),
    ("part-00000", ("part-*", 0)),
    ("000017.tar", ("*.tar", 17)),
    ("clip-4.mp4", ("clip-*.mp4", 4)),
    ("x-1-of-2-of-3.jsonl", ("x-1-of-*-of-3.jsonl", 2)),
])
def test_shard_names(name, expected):
    assert shard_key(name) == expected


@pytest.mark.parametrize("name", [
    "train.jsonl", "model-v2.jsonl", "file1.txt", "data.tar.gz", "README", "x-1.7z", "part-",
    "a-1b.jsonl", "part-00000-9f3c-c000.snappy.parquet",
])
def test_not_shard_names(name):
    assert shard_key(name) is None


def test_total_and_extension_belong_to_the_set():
    assert shard_key("x-00000-of-00002.jsonl")[0] != shard_key("x-00000-of-00003.jsonl")[0]
    assert shard_key("a-0001.jsonl")[0] != shard_key("a-0001.csv")[0]
    assert shard_key("a-1.jsonl")[0] != shard_key("a-1.jsonl.gz")[0]
    # zero padding does not
    assert shard_key("p-9.jsonl")[0] == shard_key("p-0010.jsonl")[0]


# --------------------------------------------------------------------------- examples


def test_tfrecord_set_in_shard_order():
    names = [f"data/train-{i:05d}-of-00064.tfrecord" for i in range(64)]
    sets, singles = find_sets(reversed(names), by_ext)
    assert sets == [ShardSet("data/train-*-of-00064.tfrecord", tuple(names), "tfrecord")]
    assert singles == []


@pytest.mark.parametrize("names", [
    ["part-00000.jsonl", "part-00001.jsonl"],
    ["data_0.npy", "data_1.npy"],
    ["shard-000123.tar", "shard-000124.tar", "shard-000125.tar"],
    ["v2-train-0001.jsonl", "v2-train-0002.jsonl"],
    ["a-1.tar.gz", "a-2.tar.gz"],
])
def test_usual_sets(names):
    sets, singles = find_sets(names[::-1], by_ext)
    assert [s.members for s in sets] == [tuple(names)] and singles == []


def test_numeric_order_with_and_without_padding():
    sets, _ = find_sets(["d/p-10.jsonl", "d/p-9.jsonl", "d/p-0011.jsonl", "d/p-1.jsonl"], by_ext)
    assert keys(sets) == {"d/p-*.jsonl": ("d/p-1.jsonl", "d/p-9.jsonl", "d/p-10.jsonl", "d/p-0011.jsonl")}
    # equal numbers: by name
    sets, _ = find_sets(["p-1.jsonl", "p-01.jsonl", "p-001.jsonl"], by_ext)
    assert sets[0].members == ("p-001.jsonl", "p-01.jsonl", "p-1.jsonl")


def test_a_single_shard_name_is_no_set():
    sets, singles = find_sets(["shard-000123.tar", "model-v2.jsonl", "train.jsonl", "val.jsonl"], by_ext)
    assert sets == []
    assert singles == ["model-v2.jsonl", "shard-000123.tar", "train.jsonl", "val.jsonl"]


def test_versions_are_not_shards():
    sets, singles = find_sets(["model-v2.jsonl", "model-v3.jsonl"], by_ext)
    assert sets == [] and len(singles) == 2


def test_different_stems_totals_extensions_directories():
    files = [
        "train-00000-of-00002.jsonl", "train-00001-of-00002.jsonl",
        "val-00000-of-00002.jsonl", "val-00001-of-00002.jsonl",
        "x-00000-of-00003.jsonl", "x-00001-of-00002.jsonl",
        "a-0001.jsonl", "a-0001.csv",
        "d1/q-1.jsonl", "d2/q-2.jsonl",
        "train.jsonl",
    ]
    sets, singles = find_sets(files, by_ext)
    assert keys(sets) == {
        "train-*-of-00002.jsonl": ("train-00000-of-00002.jsonl", "train-00001-of-00002.jsonl"),
        "val-*-of-00002.jsonl": ("val-00000-of-00002.jsonl", "val-00001-of-00002.jsonl"),
    }
    assert sorted(singles) == sorted(["x-00000-of-00003.jsonl", "x-00001-of-00002.jsonl", "a-0001.jsonl",
                                      "a-0001.csv", "d1/q-1.jsonl", "d2/q-2.jsonl", "train.jsonl"])


def test_files_without_format_are_never_pooled():
    sets, singles = find_sets(["README-1", "README-2", "u-1.bin", "u-2.bin", "k-1.jsonl"], by_ext)
    assert sets == [] and singles == ["k-1.jsonl"]
    # a shard given no format (e.g. by a pass-through rule) drops out; the rest still pool
    fmt = lambda p: None if p == "s-2.jsonl" else by_ext(p)  # noqa: E731
    sets, singles = find_sets(["s-1.jsonl", "s-2.jsonl", "s-3.jsonl"], fmt)
    assert keys(sets) == {"s-*.jsonl": ("s-1.jsonl", "s-3.jsonl")} and singles == []


def test_mixed_formats_break_the_set():
    fmt = lambda p: "csv" if p == "s-2.jsonl" else by_ext(p)  # noqa: E731
    sets, singles = find_sets(["s-1.jsonl", "s-2.jsonl", "s-3.jsonl", "t-1.jsonl", "t-2.jsonl"], fmt)
    assert keys(sets) == {"t-*.jsonl": ("t-1.jsonl", "t-2.jsonl")}
    assert singles == ["s-1.jsonl", "s-2.jsonl", "s-3.jsonl"]


def test_declared_glob_spans_directories_and_takes_priority():
    files = ["a/train-1.tfrecord", "a/train-2.tfrecord", "b/train-10.tfrecord", "b/train-9.tfrecord",
             "train-1.tfrecord", "train-2.tfrecord", "b/eval-1.tfrecord", "b/eval-2.tfrecord"]
    sets, singles = find_sets(files, by_ext, declared=["**/train-*.tfrecord"])
    assert keys(sets) == {
        "**/train-*.tfrecord": ("a/train-1.tfrecord", "a/train-2.tfrecord",
                                "b/train-9.tfrecord", "b/train-10.tfrecord"),
        # '**/' needs a directory, as in format rules: the root's shards keep their own set
        "train-*.tfrecord": ("train-1.tfrecord", "train-2.tfrecord"),
        "b/eval-*.tfrecord": ("b/eval-1.tfrecord", "b/eval-2.tfrecord"),
    }
    assert singles == []
    assert next(s for s in sets if s.key == "**/train-*.tfrecord").declared


def test_declared_glob_pools_names_that_are_not_shards():
    files = ["data/train.jsonl", "data/val.jsonl", "data/x-1.jsonl", "data/x-2.jsonl", "data/y.csv",
             "other/z.jsonl"]
    sets, singles = find_sets(files, by_ext, declared=["data/*.jsonl"])
    assert keys(sets) == {"data/*.jsonl": ("data/train.jsonl", "data/val.jsonl", "data/x-1.jsonl", "data/x-2.jsonl")}
    assert singles == ["data/y.csv", "other/z.jsonl"]


def test_declared_glob_matches_basenames_like_format_rules():
    files = ["a/k.jsonl", "b/c/m.jsonl", "n.jsonl", "n.csv"]
    sets, singles = find_sets(files, by_ext, declared=["*.jsonl"])
    assert keys(sets) == {"*.jsonl": ("a/k.jsonl", "b/c/m.jsonl", "n.jsonl")} and singles == ["n.csv"]


def test_first_declared_glob_wins():
    files = ["d/a-1.jsonl", "d/a-2.jsonl", "d/a-3.jsonl", "d/b-1.jsonl"]
    sets, singles = find_sets(files, by_ext, declared=["d/a-1.*", "d/*"])
    # the first glob claims one file (no set), the second the rest
    assert keys(sets) == {"d/*": ("d/a-2.jsonl", "d/a-3.jsonl", "d/b-1.jsonl")}
    assert singles == ["d/a-1.jsonl"]


def test_declared_glob_with_mixed_formats_pools_nothing():
    files = ["d/a-1.jsonl", "d/a-2.jsonl", "d/a-3.csv", "d/a-4.csv"]
    sets, singles = find_sets(files, by_ext, declared=["d/a-*"])
    # claimed files do not fall back to name sets (a-*.jsonl, a-*.csv)
    assert sets == [] and singles == sorted(files)


def test_membership():
    sets, _ = find_sets(["p-10.jsonl", "p-9.jsonl", "q-1.csv", "q-2.csv"], by_ext)
    m = membership(sets)
    assert {p: i for p, (_, i) in m.items()} == {"p-9.jsonl": 0, "p-10.jsonl": 1, "q-1.csv": 0, "q-2.csv": 1}
    assert m["q-2.csv"][0].key == "q-*.csv"


def test_path_order_is_natural_per_component():
    paths = ["b/x-10", "b/x-9", "a-b/x", "a/x", "a/x/y", "b/x-09", "a10/z", "a9/z"]
    assert sorted(paths, key=path_order) == ["a/x", "a/x/y", "a9/z", "a10/z", "a-b/x", "b/x-09", "b/x-9", "b/x-10"]


# --------------------------------------------------------------------------- properties

DIRS = ["", "a", "a/b", "c"]
STEMS = ["train-", "val_", "p.", "", "v2-train-", "model-v", "x"]
EXTS = [".jsonl", ".csv", ".jsonl.gz", "", ".tar.gz", ".bin"]
DECLARED = ["a/*.jsonl", "**/train-*", "*.csv", "*-of-2.jsonl", "*.jsonl.gz", "c/*"]


@st.composite
def shard_group(draw):
    """Shards of one directory and name pattern (numbers may repeat with other padding)."""
    d = draw(st.sampled_from(DIRS))
    stem, ext = draw(st.sampled_from(STEMS)), draw(st.sampled_from(EXTS))
    total = draw(st.sampled_from(["", "", "-of-2", "-of-3"]))
    nums = draw(st.lists(st.tuples(st.integers(0, 120), st.integers(1, 4)), min_size=1, max_size=6))
    return [posixpath.join(d, f"{stem}{n:0{w}d}{total}{ext}") for n, w in nums]


@st.composite
def plain_name(draw):
    name = draw(st.sampled_from(["train", "val", "model-v2", "data", "README-1", "README-2"]))
    ext = "" if name.startswith("README") else draw(st.sampled_from(EXTS))
    return posixpath.join(draw(st.sampled_from(DIRS)), name + ext)


@st.composite
def cases(draw):
    groups = draw(st.lists(shard_group(), max_size=6))
    files = [p for g in groups for p in g] + draw(st.lists(plain_name(), max_size=6))
    # some files get a format other than their extension's (an explicit rule), some lose theirs
    override = draw(st.dictionaries(st.sampled_from(files), st.sampled_from(["csv", "npy", None]), max_size=2)
                    if files and draw(st.integers(0, 3)) == 0 else st.just({}))
    declared = draw(st.lists(st.sampled_from(DECLARED), max_size=2) if draw(st.booleans()) else st.just([]))
    return files, override, declared


def fmt_with(override):
    return lambda p: override[p] if p in override else by_ext(p)


@given(cases(), st.randoms(use_true_random=False))
@SETTINGS
def test_properties(case, rnd):
    files, override, declared = case
    format_of = fmt_with(override)
    sets, singles = find_sets(files, format_of, declared)
    data = {p for p in files if format_of(p) is not None}
    rules = [FormatRule(g, "none") for g in declared]

    def claim(p):
        return next((r.glob for r in rules if r.matches(p)), None)

    # a partition of the data files
    pooled = [p for s in sets for p in s.members]
    assert len(pooled) + len(singles) == len(data)
    assert set(pooled) | set(singles) == data
    assert len(set(s.key for s in sets)) == len(sets)

    for s in sets:
        assert len(s.members) >= 2
        assert {format_of(p) for p in s.members} == {s.format}
        if s.declared:
            assert all(claim(p) == s.key for p in s.members)
            assert list(s.members) == sorted(s.members, key=path_order)
        else:
            assert all(claim(p) is None for p in s.members)
            (d,) = {posixpath.dirname(p) for p in s.members}
            shards = [shard_key(posixpath.basename(p)) for p in s.members]
            (pattern,) = {k for k, _ in shards}
            assert s.key == posixpath.join(d, pattern)
            order = [(n, posixpath.basename(p)) for (_, n), p in zip(shards, s.members)]
            assert order == sorted(order)

    # maximal: a whole group (one glob, or one directory and name pattern) forms a set or nothing
    groups: dict[tuple, set[str]] = {}
    for p in data:
        g = claim(p)
        k = shard_key(posixpath.basename(p))
        key = ("glob", g) if g is not None else ("name", posixpath.dirname(p), k[0]) if k else ("one", p)
        groups.setdefault(key, set()).add(p)
    by_member = membership(sets)
    for group in groups.values():
        hit = {by_member[p][0].key if p in by_member else None for p in group}
        one_format = len({format_of(p) for p in group}) == 1
        if len(group) >= 2 and one_format:
            assert len(hit) == 1 and None not in hit
            assert len(by_member[next(iter(group))][0].members) == len(group)
        else:
            assert hit == {None}

    # independent of input order and duplicates
    shuffled = files + files[: len(files) // 2]
    rnd.shuffle(shuffled)
    assert find_sets(shuffled, format_of, declared) == (sets, singles)
    assert singles == sorted(singles, key=path_order)
