"""Level: mounted (real FUSE mounts, real readers).

Shuffle-quality metrics on orders whose answers are known, label extraction per format, and
``shufflefs inspect`` on a source file and on a real mount (with ``--verify``)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import Mount
from shufflefs import cli
from shufflefs.quality import metrics as q
from shufflefs.config import parse_buffer, parse_size
from shufflefs.errors import FormatError
from shufflefs.formats import make_format, scan_file
from shufflefs.quality.labels import BYTE, COLUMN, FIELD, LabelSource, encode_labels, extract_labels, read_source
from shufflefs.strategies import STRATEGIES, ShuffleSpec, make_plan

ROOT = Path(__file__).resolve().parents[2]
N = 10_000
SORTED4 = np.repeat(np.arange(4), N // 4)
"""Four balanced labels, sorted: the clustered case."""
IDENTITY = np.arange(N, dtype=np.int64)
UNIFORM = np.random.default_rng(20240611).permutation(N)


# --------------------------------------------------------------------------- metrics on known orders


def test_identity_and_reverse():
    for order, corr in ((IDENTITY, 1.0), (IDENTITY[::-1], -1.0)):
        assert q.rank_correlation(order) == pytest.approx(corr, abs=1e-12)
        assert q.gap_entropy(order) == 0.0  # every gap is 1
        # every window of 100 holds a single label: TV = 1 - 1/4
        assert q.label_mix_tv(order, SORTED4, 100) == pytest.approx(0.75, abs=1e-12)


def test_uniform_permutation_is_near_the_reference():
    assert abs(q.rank_correlation(UNIFORM)) < 0.05  # sd is 1/sqrt(N-1) = 0.01
    assert q.rank_correlation(UNIFORM) == pytest.approx(np.corrcoef(np.arange(N), UNIFORM)[0, 1], abs=1e-12)
    tv = q.label_mix_tv(UNIFORM, SORTED4, 100)
    assert tv == pytest.approx(q.expected_label_mix_tv([N // 4] * 4, 100), abs=0.01)
    assert tv < 0.1
    ref = q.uniform_reference(N, SORTED4, None, k=100, seed=1)
    assert q.gap_entropy(UNIFORM) == pytest.approx(ref[q.GAP_ENTROPY], abs=0.1)
    assert q.gap_entropy(UNIFORM) > 12  # log2(N) = 13.3; the plug-in estimate sits a little below


def test_hand_computed_values():
    # gaps 2, 2, 3, 2: p = 3/4, 1/4
    assert q.gap_entropy([0, 2, 4, 1, 3]) == pytest.approx(-(0.75 * math.log2(0.75) + 0.25 * math.log2(0.25)))
    labels = np.array([0, 0, 1, 1])
    assert q.label_mix_tv([0, 1, 2, 3], labels, 2) == pytest.approx(0.5)
    assert q.label_mix_tv([0, 2, 1, 3], labels, 2) == pytest.approx(0.0)
    assert q.label_mix_tv([0, 2, 1, 3, 0], np.array([0, 0, 1, 1]), 2) == pytest.approx(0.1)  # tail ignored; mix of all 5
    assert q.label_mix_tv([0, 1], labels, 5) == pytest.approx(0.0)  # shorter than k: one window, itself
    # blocks 0 0 1 1 2 2; batches of 3: {0,0,1} has 1 same pair of 3, {1,2,2} 1 of 3
    blocks = np.array([0, 0, 1, 1, 2, 2])
    assert q.same_block_pairs(np.arange(6), blocks, 3) == pytest.approx(2 / 6)
    # batches of 4: {0,0,1,1} 2 of 6 pairs, short last batch {2,2} 1 of 1
    assert q.same_block_pairs(np.arange(6), blocks, 4) == pytest.approx(3 / 7)
    assert q.rank_correlation([5, 9, 20]) == pytest.approx(1.0)  # a rank's subset of ids in source order


def test_same_block_pairs_identity_and_uniform():
    blocks = np.arange(N) // 50
    assert q.same_block_pairs(IDENTITY, blocks, 50) == 1.0
    assert q.same_block_pairs(IDENTITY[::-1], blocks, 50) == 1.0
    expected = q.expected_same_block_pairs(blocks)
    assert expected == pytest.approx(200 * 50 * 49 / (N * (N - 1)))
    assert q.same_block_pairs(UNIFORM, blocks, 32) == pytest.approx(expected, abs=0.002)


def test_expectations_are_exact_over_all_permutations():
    labels = np.array([0, 0, 0, 1, 1, 2])
    blocks = np.array([0, 0, 1, 1, 1, 2])
    perms = [np.array(p) for p in itertools.permutations(range(6))]
    tv = np.mean([q.label_mix_tv(p, labels, 2) for p in perms])
    assert tv == pytest.approx(q.expected_label_mix_tv(np.bincount(labels), 2), abs=1e-12)
    for batch in (2, 4):  # 4: a short last batch
        same = np.mean([q.same_block_pairs(p, blocks, batch) for p in perms])
        assert same == pytest.approx(q.expected_same_block_pairs(blocks), abs=1e-12)


def test_report_and_format():
    blocks = np.arange(N) // 100
    rep = q.report({"none": IDENTITY, "shuffled": UNIFORM}, SORTED4, blocks, k=100, batch=32,
                   label_names=["a", "b", "c", "d"])
    assert rep.columns["none"][q.RANK_CORR] == 1.0 and rep.columns["none"][q.SAME_BLOCK] > 0.6
    assert rep.expected[q.RANK_CORR] == 0.0 and q.GAP_ENTROPY not in rep.expected
    assert rep.blocks == 100 and rep.records == N
    text = q.format_report(rep)
    assert text.splitlines()[0].split() == ["none", "shuffled", q.UNIFORM, q.EXPECTED]
    assert "label mix TV per 100 records" in text and "same-block pairs per batch of 32" in text
    json.dumps(rep.to_json(), allow_nan=False)  # NaN-free, for --json
    assert "| `none` |" in q.format_markdown(rep)


def test_block_of_records_matches_strategies():
    bounds = np.array([0, 10, 20, 5000, 5010, 9000, 9010], dtype=np.int64)
    # 4 KiB blocks: records start at 0, 10, 20 (block 0), 5000 (block 1), 5010 (1), 9000 (2)
    assert q.block_of_records(bounds, 4096).tolist() == [0, 0, 0, 1, 1, 2]


# --------------------------------------------------------------------------- labels


def _index(tmp_path: Path, name: str, content: bytes, fmt: str, **params):
    path = tmp_path / name
    path.write_bytes(content)
    return path, scan_file(path, make_format(fmt, params))


def test_labels_jsonl(tmp_path):
    rows = [{"id": i, "label": lab, "meta": {"label": "inner"}} for i, lab in enumerate([10, 9, 10, 2])]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path, index = _index(tmp_path, "a.jsonl", text.encode(), "lines")
    got = extract_labels(index, "lines", read_source(path), LabelSource(FIELD, "label"), str(path))
    assert got.names == ["2", "9", "10"]  # numbers sort as numbers
    assert got.codes.tolist() == [2, 1, 2, 0]
    missing = text + '{"id": 4}\n'
    path, index = _index(tmp_path, "b.jsonl", missing.encode(), "lines")
    with pytest.raises(FormatError) as e:
        extract_labels(index, "lines", read_source(path), LabelSource(FIELD, "label"), str(path))
    assert e.value.offset == len(text.encode()) and "record 4" in str(e.value)


def test_labels_csv_and_tsv(tmp_path):
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["id", "note", "label"])
    labels = ["cat", "dog", "cat", "bird", "dog"]
    for i, lab in enumerate(labels):
        w.writerow([i, "two\nlines, with a comma" if i % 2 else "plain", lab])
    path, index = _index(tmp_path, "t.csv", out.getvalue().encode(), "csv")
    assert index.n == 5
    data = read_source(path)
    by_name = extract_labels(index, "csv", data, LabelSource(COLUMN, "label"), str(path))
    assert [by_name.names[c] for c in by_name.codes] == labels
    by_index = extract_labels(index, "csv", data, LabelSource(COLUMN, "2"), str(path))
    assert by_index.names == by_name.names and by_index.codes.tolist() == by_name.codes.tolist()
    with pytest.raises(ValueError, match="no column 'nope'"):
        extract_labels(index, "csv", data, LabelSource(COLUMN, "nope"), str(path))
    tsv = "a\tb\n" + "".join(f"{i}\t{i % 3}\n" for i in range(6))
    path, index = _index(tmp_path, "t.tsv", tsv.encode(), "lines", header_lines=1)
    got = extract_labels(index, "lines", read_source(path), LabelSource(COLUMN, "b"), str(path))
    assert got.codes.tolist() == [0, 1, 2, 0, 1, 2]


def test_labels_fixed_byte_and_npy(tmp_path):
    recs = b"".join(struct.pack("<IB3x", i, 7 - i % 3) for i in range(9))
    path, index = _index(tmp_path, "r.bin", b"HDR!" + recs, "fixed", record_size=8, header_bytes=4)
    got = extract_labels(index, "fixed", read_source(path), LabelSource(BYTE, 4), str(path))
    assert got.names == ["5", "6", "7"] and got.codes.tolist() == [2, 1, 0] * 3
    with pytest.raises(FormatError, match="no byte 8"):
        extract_labels(index, "fixed", read_source(path), LabelSource(BYTE, 8), str(path))

    arr = np.stack([np.arange(6), np.arange(6) % 2], axis=1).astype(np.float32)
    buf = io.BytesIO()
    np.save(buf, arr)
    path, index = _index(tmp_path, "a.npy", buf.getvalue(), "npy")
    got = extract_labels(index, "npy", read_source(path), LabelSource(COLUMN, 1), str(path))
    assert got.codes.tolist() == [0, 1] * 3 and got.names == ["0", "1"]
    rec = np.zeros(4, dtype=[("x", "f8"), ("y", "i2")])
    rec["y"] = [3, 1, 3, 2]
    buf = io.BytesIO()
    np.save(buf, rec)
    path, index = _index(tmp_path, "s.npy", buf.getvalue(), "npy")
    got = extract_labels(index, "npy", read_source(path), LabelSource(COLUMN, "y"), str(path))
    assert got.codes.tolist() == [2, 0, 2, 1]


def test_encode_labels_any_values():
    got = encode_labels(["b", "a", 1, None, "a"])
    assert got.names == ["1", "a", "b", "null"] and got.codes.tolist() == [2, 1, 0, 3, 1]
    got = encode_labels(["10", "9", "10"])  # numeric CSV cells
    assert got.names == ["9", "10"] and got.codes.tolist() == [1, 0, 1]


# --------------------------------------------------------------------------- shufflefs inspect


def shufflefs(*args, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shufflefs", *map(str, args)], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def clustered_jsonl(n: int = 3000, labels: int = 3) -> bytes:
    """Label-sorted JSON Lines records of varying length."""
    rng = np.random.default_rng(5)
    return b"".join(
        json.dumps({"id": i, "label": f"L{i * labels // n}", "pad": "x" * int(rng.integers(10, 60))}).encode() + b"\n"
        for i in range(n)
    )


def order_of(plan) -> np.ndarray:
    return np.concatenate([plan.window(k) for k in range(plan.n_windows)])


def have_matplotlib() -> bool:
    from shufflefs.quality.plots import have_matplotlib as have

    return have()


def test_inspect_source_file(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_bytes(clustered_jsonl())
    png = tmp_path / "out.png"
    args = ["inspect", src / "train.jsonl", "--label-field", "label", "--block-size", "4KiB", "--buffer", "10%",
            "--cache-dir", tmp_path / "cache", "--strategies", "none,full,window,corgipile,corgipile@2%", "--json"]
    if have_matplotlib():
        args += ["--png", png]
    r = shufflefs(*args)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    s = out["strategies"]
    assert list(s) == ["none", "full", "window", "corgipile", "corgipile@2%"]
    assert out["records"] == 3000 and out["labels"] == ["L0", "L1", "L2"] and not out["mounted"]
    assert s["none"]["rank_corr"] == 1.0 and s["none"]["gap_entropy"] == 0.0
    assert s["none"]["label_tv"] == pytest.approx(2 / 3, abs=0.01)
    assert abs(s["full"]["rank_corr"]) < 0.1 and s["full"]["label_tv"] < 0.15
    assert s["window"]["rank_corr"] > 0.9  # a sliding window barely moves records
    assert s["corgipile"]["label_tv"] < s["corgipile@2%"]["label_tv"] < s["none"]["label_tv"]
    assert s["corgipile"]["same_block"] > out["expected"]["same_block"]
    # the same numbers as measuring the plan directly
    index = scan_file(src / "train.jsonl", make_format("lines"))
    spec = ShuffleSpec("corgipile", 0, parse_size("4KiB"), parse_buffer("10%"))
    order = order_of(make_plan(index, spec, 0))
    assert s["corgipile"]["rank_corr"] == pytest.approx(q.rank_correlation(order), abs=1e-12)
    if have_matplotlib():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    r = shufflefs("inspect", src / "train.jsonl", "--cache-dir", tmp_path / "cache", "--block-size", "4KiB")
    assert r.returncode == 0, r.stderr
    header = r.stdout.split("\n\n")[1].splitlines()[0].split()
    assert header == [*STRATEGIES, q.UNIFORM, q.EXPECTED]  # all strategies by default
    assert "label mix" not in r.stdout  # no label given

    for bad, message in ((["--strategies", "none,nope"], "unknown strategy"), (["--verify"], "not in a shufflefs mount"),
                         (["--label-column", "label"], "no column 'label'")):
        r = shufflefs("inspect", src / "train.jsonl", "--cache-dir", tmp_path / "cache", *bad)
        assert r.returncode == 2 and message in r.stderr, (bad, r.stderr)


def test_inspect_mounted_view_with_verify(mount, monkeypatch, capsys):
    m: Mount = mount({"d/train.jsonl": clustered_jsonl(2000, 4)}, "--block-size", "4KiB", "--buffer", "10%",
                     "--seed", "11", "--strategy", "corgipile")
    m.set_epoch(3)
    view = m.path("d/train.jsonl")
    r = shufflefs("inspect", view, "--label-field", "label", "--verify", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mounted"] and out["verified"] and out["epoch"] == 3 and out["seed"] == 11
    assert list(out["strategies"]) == ["corgipile"]
    # the order reported is the plan of epoch 3, and differs from epoch 0
    index = scan_file(m.src / "d/train.jsonl", make_format("lines"))
    spec = ShuffleSpec("corgipile", 11, 4096, 0.1)
    order = order_of(make_plan(index, spec, 3))
    assert out["strategies"]["corgipile"]["rank_corr"] == pytest.approx(q.rank_correlation(order), abs=1e-12)
    r0 = json.loads(shufflefs("inspect", view, "--epoch", "0", "--json").stdout)
    assert r0["epoch"] == 0 and r0["strategies"]["corgipile"]["rank_corr"] != out["strategies"]["corgipile"]["rank_corr"]

    text = shufflefs("inspect", view, "--verify")
    assert text.returncode == 0 and "verified" in text.stdout and "corgipile" in text.stdout

    r = shufflefs("inspect", view, "--buffer", "2%")
    assert r.returncode == 2 and "does not apply to a mounted view" in r.stderr
    r = shufflefs("inspect", view, "--epoch", "1", "--verify")
    assert r.returncode == 2 and "epoch 3" in r.stderr

    # --verify fails loudly when the view is not the order computed (here: a corrupted reference)
    import shufflefs.windows.layout as layout

    real = layout.render

    def off_by_one(index, plan, data):
        b = bytearray(real(index, plan, data))
        b[len(b) // 2] ^= 1
        return bytes(b)

    monkeypatch.setattr(layout, "render", off_by_one)
    assert cli.main(["inspect", str(view), "--verify"]) == cli.EXIT_FAIL
    assert "VERIFY FAILED" in capsys.readouterr().err
