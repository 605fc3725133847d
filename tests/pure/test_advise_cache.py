"""Level: pure (no mounts).

The storage probe's cache per device (`shufflefs.advise.cache`), the floor a mount reads from it
(`measured_block_floor`), the views-depth probe on a few small files, the label-mix arithmetic of
``shufflefs advise --target-mix`` and the CLI options.  Probes here last well under a second."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shufflefs import advise
from shufflefs.advise import cache as advise_cache
from shufflefs.advise import (
    BLOCK_SIZES,
    Measurement,
    ProbeResult,
    measured_block_floor,
    probe,
    recommend,
)
from shufflefs.advise.target import (
    DEFAULT_TARGET_MIX,
    blocks_for_mix,
    expected_window_mix,
    for_mix,
    format_mix,
)
from shufflefs.cli import main
from shufflefs.quality.metrics import expected_block_mix_tv

KiB, MiB = 1 << 10, 1 << 20


@pytest.fixture(autouse=True)
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "xdg-cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    return home


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3 * MiB))
    (src / "b.bin").write_bytes(os.urandom(MiB))
    return src


def _result(views: dict[int, float], qd1: dict[int, float] | None = None) -> ProbeResult:
    seq = Measurement(16 * MiB, 10, 1000 * 10**6, 1.0)  # 1000 MB/s
    rows = [Measurement(b, 10, int(f * 1000 * 10**6), 1.0) for b, f in (qd1 or {b: 0.1 for b in views}).items()]
    win = [Measurement(b, 10, int(f * 2000 * 10**6), 1.0) for b, f in views.items()]
    bseq = Measurement(MiB, 10, 2000 * 10**6, 1.0)  # 2000 MB/s buffered
    return ProbeResult("src", 1, 1 << 32, True, seq, rows, [], win, bseq)


def test_no_cache_no_floor(source: Path) -> None:
    assert measured_block_floor(str(source)) is None
    assert advise_cache.load(source) is None


def test_cache_round_trip_and_floor(source: Path, cache_home: Path) -> None:
    r = _result({16 * KiB: 0.5, 64 * KiB: 0.95, 128 * KiB: 0.85, 256 * KiB: 0.92, MiB: 1.0, 4 * MiB: 1.1})
    path = advise_cache.save(source, advise_cache.record(r))
    assert path.parent == cache_home / "shufflefs" / "advise" and path.suffix == ".json"
    body = json.loads(path.read_text())
    assert body["device"] == advise_cache.device_identity(source)
    assert body["device"]["dev"] == f"{os.major(source.stat().st_dev)}:{os.minor(source.stat().st_dev)}"
    assert body["date"] and body["table"][0]["block_size"] == 16 * KiB
    assert body["table"][1]["views_fraction"] == 0.95 and body["table"][1]["qd1_fraction"] == 0.1
    assert body["floor"] == 256 * KiB  # the lucky 64 KiB does not decide
    assert advise_cache.load(source) == body
    assert measured_block_floor(str(source)) == 256 * KiB
    assert measured_block_floor(str(source / "..")) == 256 * KiB  # same device, same cache
    assert recommend(r, 1 << 30).block_size == 256 * KiB  # recommend picks from the views' depth


def test_a_different_device_key_misses(source: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    advise_cache.save(source, advise_cache.record(_result({MiB: 1.0})))
    assert measured_block_floor(str(source)) == MiB
    real = advise_cache.device_identity
    for change in ({"serial": "another disk"}, {"dev": "250:7"}, {"fstype": "xfs"}, {"size": "1"}):
        monkeypatch.setattr(advise_cache, "device_identity", lambda d, c=change: {**real(d), **c})
        assert measured_block_floor(str(source)) is None, change
    monkeypatch.setattr(advise_cache, "device_identity", real)
    assert measured_block_floor(str(source)) == MiB


def test_a_foreign_or_broken_file_is_ignored(source: Path) -> None:
    path = advise_cache.save(source, advise_cache.record(_result({MiB: 1.0})))
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "device": {**body["device"], "serial": "x"}}))
    assert measured_block_floor(str(source)) is None
    path.write_text("{not json")
    assert measured_block_floor(str(source)) is None
    path.write_text(json.dumps({**body, "version": 99}))
    assert measured_block_floor(str(source)) is None


def test_floor_when_no_size_reaches_the_target() -> None:
    rows = [{"block_size": b, "views_fraction": 0.5} for b in (16 * KiB, MiB)]
    assert advise_cache.floor_of(rows) == MiB
    assert advise_cache.floor_of([]) is None


def test_probe_measures_the_views_depth_and_caches(source: Path) -> None:
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    r = probe(source, seconds=0.4, seed=3, block_sizes=(16 * KiB, 128 * KiB, MiB))
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before
    assert [m.block_size for m in r.windowed] == [16 * KiB, 128 * KiB, MiB]
    assert all(m.nbytes > 0 and m.seconds > 0 for m in r.windowed)
    assert r.buffered_sequential is not None and r.buffered_sequential.nbytes > 0
    path = advise_cache.save(source, advise_cache.record(r))
    floor = measured_block_floor(str(source))
    assert floor in (16 * KiB, 128 * KiB, MiB) and floor == json.loads(path.read_text())["floor"]
    text = advise.format_report(r, recommend(r, 1 << 30))
    assert "views MB/s" in text and "as the views read" in text


def test_window_mix_arithmetic() -> None:
    uniform = expected_block_mix_tv(1000, 10)
    assert 0.037 < uniform < 0.038
    assert expected_window_mix(10**9) == pytest.approx(uniform, rel=1e-3)
    n = blocks_for_mix(DEFAULT_TARGET_MIX)
    assert expected_window_mix(n) <= DEFAULT_TARGET_MIX < expected_window_mix(n - 1)
    assert all(expected_window_mix(m) <= DEFAULT_TARGET_MIX for m in range(n, n + 200))
    assert 300 < n < 400  # sqrt(9 / (2 pi n)) ~ sqrt(0.074^2 - 0.0378^2)
    tighter = blocks_for_mix(0.05)
    assert tighter > n and expected_window_mix(tighter) <= 0.05
    assert blocks_for_mix(0.2) < n
    with pytest.raises(ValueError):
        blocks_for_mix(0.03)  # below a uniform shuffle


def test_mix_advice_buffer_and_memory() -> None:
    mix = for_mix(DEFAULT_TARGET_MIX, 128 * KiB)
    assert mix.buffer % MiB == 0 and mix.buffer // (128 * KiB) >= mix.blocks
    assert mix.buffer - mix.blocks * 128 * KiB < MiB
    assert mix.object_block == 8 * MiB and mix.object_buffer == mix.blocks * 8 * MiB
    text = format_mix(mix)
    assert f"{mix.blocks} blocks per buffer" in text and "--block-size 128KiB" in text and "--block-size 8MiB" in text
    assert "sqrt(block_mix(n)^2 + uniform^2)" in text


def test_cli_target_mix_and_save(source: Path, cache_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["advise", "--help"])
    helptext = capsys.readouterr().out
    assert "--target-mix" in helptext and "--no-save" in helptext
    assert main(["advise", str(source), "--seconds", "0.3", "--no-save", "--target-mix", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "target 0.050" in out and f"{blocks_for_mix(0.05)} blocks per buffer" in out and "saved" not in out
    assert measured_block_floor(str(source)) is None
    assert main(["advise", str(source), "--seconds", "0.3"]) == 0
    out = capsys.readouterr().out
    saved = next(line for line in out.splitlines() if line.startswith("saved"))
    path = Path(saved.rsplit(": ", 1)[1])
    assert path.is_file() and path.parent == cache_home / "shufflefs" / "advise"
    assert measured_block_floor(str(source)) in BLOCK_SIZES
    with pytest.raises(SystemExit) as e:
        main(["advise", str(source), "--target-mix", "0.01"])
    assert e.value.code == 2
