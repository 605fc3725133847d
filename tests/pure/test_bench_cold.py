"""Level: pure (no mount, no daemon).

``tools/bench.py --only parquet-cold`` holds the machine's free page reporting back for half its
rounds: the setting it changes is put back whatever happens in between, and it changes only a
setting the kernel has."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench import parquet_cold  # noqa: E402


def test_the_setting_is_restored_even_when_the_rounds_fail(tmp_path: Path) -> None:
    knob = tmp_path / "min_free_ms"
    knob.write_text("0\n")
    with parquet_cold.setting(knob, "60000"):
        assert knob.read_text() == "60000"
    assert knob.read_text().strip() == "0"
    with pytest.raises(RuntimeError):
        with parquet_cold.setting(knob, "60000"):
            raise RuntimeError("a round failed")
    assert knob.read_text().strip() == "0"
    with parquet_cold.setting(knob, None):  # the machine's own setting: not touched
        assert knob.read_text().strip() == "0"


def test_the_knob_is_used_only_where_the_kernel_has_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(parquet_cold, "KNOBS", tmp_path)
    (tmp_path / "page_reporting_order").write_text("9\n")
    assert parquet_cold.knob() is None
    (tmp_path / "min_free_ms").write_text("0\n")
    assert parquet_cold.knob() == (tmp_path / "min_free_ms", "60000")
