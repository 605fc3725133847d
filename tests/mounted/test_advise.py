"""Level: mounted (real FUSE mounts, real readers).

`shufflefs advise` (the storage probe and its recommendation) and tools/bench.py end to end.

No timing is asserted: the probe's figures depend on the machine; what must hold is the shape of
the answer (a measured power-of-two block size, a buffer of whole blocks within the budget) and
that the source is only read.
"""

from __future__ import annotations

import re

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shufflefs import advise
from shufflefs.advise import BLOCK_SIZES, AdviseError, Measurement, ProbeResult, format_report, probe, recommend
from shufflefs.cli import main

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _tree(root: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under root: size, mtime and content hash."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "big.bin").write_bytes(os.urandom(6 * MiB))
    (src / "sub" / "small.jsonl").write_bytes(b'{"a": 1}\n' * 2000)
    (src / "tiny.txt").write_bytes(b"x")  # below 4 KiB: never probed
    return src


@pytest.mark.parametrize("direct", [True, False])
def test_probe_measures_every_size_that_fits_and_reads_only(source: Path, direct: bool) -> None:
    before = _tree(source)
    result = probe(source, seconds=0.6, seed=1, direct=direct)
    assert _tree(source) == before  # nothing written, nothing touched
    measured = [m.block_size for m in result.random]
    assert measured == [b for b in BLOCK_SIZES if b <= 6 * MiB]
    assert all(m.reads >= 2 and m.nbytes == m.reads * m.block_size for m in result.random)
    assert result.sequential.nbytes > 0 and result.sequential.seconds > 0
    assert result.files == 2 and result.data_bytes == 6 * MiB + 18000
    assert any("large enough" in w for w in result.warnings)  # 8 MiB and 16 MiB reads had no file
    assert any("MiB of data" in w for w in result.warnings)  # too little data to defeat caches
    if not direct:
        assert not result.direct
        assert any("O_DIRECT is not supported" in w for w in result.warnings)


def test_recommendation_is_a_measured_power_of_two_and_fits_the_budget(source: Path) -> None:
    result = probe(source, seconds=0.5, seed=2)
    for budget in (1 << 30, 64 * MiB, 3 * MiB):
        adv = recommend(result, budget)
        assert adv.block_size in BLOCK_SIZES
        assert adv.block_size & (adv.block_size - 1) == 0
        assert adv.block_size in [m.block_size for m in result.random]
        assert adv.buffer % adv.block_size == 0 and adv.buffer // adv.block_size == adv.blocks_per_window
        assert adv.buffer <= max(budget // 3, adv.block_size)
    text = format_report(result, recommend(result, 1 << 30))
    for m in result.random:
        assert f"random {advise._size(m.block_size)}" in text
    assert "sequential" in text and "--block-size" in text and "--buffer" in text


def _result(fractions: dict[int, float]) -> ProbeResult:
    seq = Measurement(16 * MiB, 10, 1000 * 10**6, 1.0)  # 1000 MB/s
    rows = [Measurement(b, 10, int(f * 1000 * 10**6), 1.0) for b, f in fractions.items()]
    return ProbeResult("src", 1, 1 << 32, True, seq, rows)


def test_recommend_takes_the_smallest_size_from_which_on_all_reach_the_target() -> None:
    r = _result({4096: 0.05, 65536: 0.95, 262144: 0.7, 1 * MiB: 0.92, 4 * MiB: 1.1, 16 * MiB: 1.0})
    adv = recommend(r, 1 << 30)
    assert adv.block_size == 1 * MiB and adv.reaches_target  # the lucky 64 KiB does not decide
    assert adv.buffer == 341 * MiB and adv.blocks_per_window == 341
    assert recommend(r, 1 << 30, target=0.5).block_size == 65536
    assert recommend(r, 1 << 30, target=0.04).block_size == 4096


def test_recommend_without_a_size_reaching_the_target_and_with_a_tiny_budget() -> None:
    r = _result({4096: 0.05, 1 * MiB: 0.5, 4 * MiB: 0.6})
    adv = recommend(r, 1 << 30)
    assert adv.block_size == 4 * MiB and not adv.reaches_target and adv.notes
    small = recommend(_result({4 * MiB: 1.0}), 8 * MiB)
    assert small.blocks_per_window == 1 and small.buffer == 4 * MiB
    assert any("fewer than 2 blocks" in n for n in small.notes)
    with pytest.raises(ValueError):
        recommend(r, 0)


def test_recommend_never_exceeds_the_data_and_the_table_is_aligned() -> None:
    r = _result({4096: 0.05, 1 * MiB: 0.95, 4 * MiB: 1.0, 16 * MiB: 1.0})
    r.data_bytes = 28 * MiB
    adv = recommend(r, 1 << 30)
    assert adv.buffer == 28 * MiB and any("fits in the buffer" in n for n in adv.notes)
    lines = format_report(r, adv).splitlines()
    table = lines[lines.index(next(line for line in lines if line.strip().startswith("read"))):][:6]
    # every row's numeric columns end at the same positions as the header's
    ends = lambda line: [m.end() for m in re.finditer(r"\S+(?= {2}|$)", line)][:4]  # noqa: E731
    header = ends(table[0].replace("of sequential", "of_sequential"))
    for row in table[1:]:
        assert ends(row.replace("random ", "random_").replace("<- recommended", "")) == header, row


def test_probe_refuses_a_directory_without_data(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"short")
    with pytest.raises(AdviseError, match="no regular file"):
        probe(tmp_path, seconds=0.1)
    with pytest.raises(ValueError):
        probe(tmp_path, seconds=0)


def test_cli_advise(source: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(source), "--seconds", "0.5", "--budget", "64MiB", "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "of sequential" in out and "shufflefs mount SRC MNT --block-size" in out
    with pytest.raises(SystemExit) as e:
        main(["advise", str(source), "--budget", "lots"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["advise", str(source / "missing")])
    assert e.value.code == 2
    empty = source.parent / "empty"
    empty.mkdir()
    assert main(["advise", str(empty)]) == 1
    assert "no regular file" in capsys.readouterr().err


# --------------------------------------------------------------------------- the benchmark


def _bench_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root (mounts, dropping caches)"
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return "needs FUSE"
    if shutil.which("gcc") is None or subprocess.run(["pkg-config", "--exists", "fuse3"]).returncode != 0:
        return "needs gcc and libfuse3-dev for the C passthrough"
    return None


@pytest.mark.skipif(_bench_missing() is not None, reason=_bench_missing() or "")
def test_benchmark_runs_end_to_end_and_prints_every_row(tmp_path: Path) -> None:
    out = tmp_path / "results.md"
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench.py"), "--quick", "--size", "3MiB", "--max-seconds", "1",
         "--remount-records", "50000", "--epochs", "1", "--workers", "0", "--out", str(out), "--tmp", str(work)],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    text = out.read_text()
    assert text.strip() in r.stdout
    rows = [line.split("|")[1:4] for line in text.splitlines() if line.startswith("| ") and not line.startswith("| read ")]
    have = {tuple(c.strip() for c in cells) for cells in rows}
    strategies = ("none", "stratified", "corgipile", "block", "full", "lirs-page", "window", "once")
    for cache in ("warm", "cold"):
        for reader in ("1MiB", "128KiB", "loop"):
            for what in ["raw source", "C passthrough (direct_io)", "C passthrough (page cache)",
                         *(f"view {s}" for s in strategies)]:
                assert (what, reader, cache) in have, (what, reader, cache)
        for what, reader in [("pread Dataset, 0 workers", "random"), ("MosaicML epoch", "py1e"),
                             ("Shuffle Once copy", "1MiB"), ("Shuffle Once copy", "loop"),
                             ("Shuffle Once epoch 1 incl. rewrite", "loop")]:
            assert (what, reader, cache) in have, (what, reader, cache)
    assert text.count("### lines") == 1 and text.count("### fixed") == 1
    for title in ("Daemon memory", "Paired rounds", "Index build", "Remount with a cached index", "Epoch change",
                  "Object storage (a local S3 server)", "Targets"):
        assert f"### {title}" in text
    s3 = text.split("### Object storage (a local S3 server)")[1].split("###")[0]
    for view in ("none", "corgipile", "full"):  # a row per view, with requests counted
        assert any(line.startswith(f"| {view} |") and line.split("|")[6].strip() not in ("0", "~0") for line in s3.splitlines()), s3
    targets = text.split("### Targets")[1].splitlines()
    measured = [t for t in targets if "warm corgipile 1 MiB reads >= 0.7x" in t or "remount with a cached index" in t]
    assert len(measured) == 3 and not any(t.endswith("not measured |") for t in measured)
    paired = [t for t in targets if "(paired" in t]  # warm and cold ratios, first passes of none and corgipile
    assert len(paired) == 12 and not any(t.endswith("not measured |") for t in paired), paired
    mix = [t for t in targets if "label mix of the default view" in t]
    assert len(mix) == 1 and not mix[0].endswith("not measured |"), mix
    assert "Label mix of each view" in text
    assert "Larger than memory: not run" in text  # 3 MiB is no larger than any memory
    assert os.listdir(work) == []  # the work directory is gone
    with open("/proc/mounts") as f:
        assert str(work) not in f.read()
