"""Level: pure (no mount, no daemon).

``tools/bench.py --only parquet-cold`` and ``--only compressed`` hold the machine's free page
reporting back for half their rounds: the setting they change is put back whatever happens in
between, and they change only a setting the kernel has."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench import page_reporting  # noqa: E402


@pytest.fixture(autouse=True)
def left_in(tmp_path: Path, monkeypatch) -> Path:
    """The record of a killed run's value, in the test's own directory."""
    left = tmp_path / "left"
    monkeypatch.setattr(page_reporting, "LEFT", left)
    return left


def test_the_setting_is_restored_even_when_the_rounds_fail(tmp_path: Path) -> None:
    knob = tmp_path / "min_free_ms"
    knob.write_text("0\n")
    with page_reporting.setting(knob, "60000"):
        assert knob.read_text() == "60000"
    assert knob.read_text().strip() == "0"
    with pytest.raises(RuntimeError):
        with page_reporting.setting(knob, "60000"):
            raise RuntimeError("a round failed")
    assert knob.read_text().strip() == "0"
    with page_reporting.setting(knob, None):  # the machine's own setting: not touched
        assert knob.read_text().strip() == "0"


def test_the_knob_is_used_only_where_the_kernel_has_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(page_reporting, "KNOBS", tmp_path)
    (tmp_path / "page_reporting_order").write_text("9\n")
    assert page_reporting.knob() is None
    (tmp_path / "min_free_ms").write_text("0\n")
    assert page_reporting.knob() == (tmp_path / "min_free_ms", "60000")


def test_the_page_cache_write_leaves_nothing_behind(tmp_path: Path) -> None:
    before = sorted(tmp_path.iterdir())
    seconds, cpu = page_reporting.write_new(tmp_path, bytes(2 << 20), nbytes=8 << 20, preallocate=True)
    assert cpu >= 0.0
    assert sorted(tmp_path.iterdir()) == before  # an unnamed file, gone at its close


def test_a_value_a_killed_run_left_is_put_back_by_the_next(tmp_path: Path, left_in: Path, monkeypatch) -> None:
    knob = tmp_path / "min_free_ms"
    knob.write_text("0\n")
    with page_reporting.setting(knob, "60000"):
        assert left_in.read_text() == "0"  # recorded while the knob is changed
    assert not left_in.exists()
    knob.write_text("60000\n")  # as a run killed by SIGKILL inside the block leaves it
    left_in.write_text("0")
    monkeypatch.setattr(page_reporting, "KNOBS", tmp_path)
    path, settings = page_reporting.settings()
    assert path == knob and knob.read_text().strip() == "0" and not left_in.exists()
    assert [value for _, value in settings] == [None, "60000"]
    knob.write_text("60000\n")
    left_in.write_text("0")
    with page_reporting.setting(knob, "60000"):  # a run that changes it first restores it too
        assert left_in.read_text() == "0"
    assert knob.read_text().strip() == "0"


def test_the_settings_take_turns_round_by_round() -> None:
    both = [("as the machine has it", None), ("held back", "60000")]
    assert page_reporting.in_turn(both, 0) == both
    assert page_reporting.in_turn(both, 1) == both[::-1]
