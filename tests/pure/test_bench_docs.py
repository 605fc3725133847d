"""Level: pure (no mount, no daemon).

``tools/bench.py --update-docs``: the performance page's excerpt is rebuilt from the run's rows
(ratios to the `none` view and to the raw read of that run) and its targets, and the object-storage
page's block from its S3 section, only between the markers, and docs/benchmark.md is the run's
report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench import docs  # noqa: E402
from bench.reads import Reading  # noqa: E402
from bench.report import Report, Row  # noqa: E402


def row(what: str, cache: str, gbps: float) -> Row:
    return Row("lines", what, "1MiB", cache, Reading(int(gbps * 1e9), None, 1.0, 0.01, True), file_bytes=10**9)


def test_the_excerpt_is_rebuilt_between_the_markers(tmp_path: Path) -> None:
    rep = Report()
    for what, warm, cold in (("raw source", 20.0, 2.0), ("view none", 3.0, 1.5), ("view corgipile", 2.7, 1.8)):
        rep.add(row(what, "warm", warm))
        rep.add(row(what, "cold", cold))
    rep.section("Targets", ["| target | measured | verdict |", "|---|---|---|", "| x | 0.90x | met |"])
    rep.section(docs.S3_SECTION, ["| view | requests |", "| corgipile | 32 |"])
    (tmp_path / "docs" / "guide").mkdir(parents=True)
    perf, objs = tmp_path / "docs" / "performance.md", tmp_path / "docs" / "guide" / "object-storage.md"
    perf.write_text(f"# t\n\nbefore\n{docs.START}\nold table\n{docs.END}\nafter\n")
    objs.write_text(f"# s\n\nmiddle\n{docs.S3_START}\nold s3\n{docs.S3_END}\nend\n")
    written = docs.update(rep, "the report\n", tmp_path, "a test machine")
    text = perf.read_text()
    assert written == [tmp_path / "docs" / "benchmark.md", perf, objs]
    assert (tmp_path / "docs" / "benchmark.md").read_text() == "the report\n"
    assert text.startswith("# t\n\nbefore\n") and text.endswith("after\n") and "old table" not in text
    assert "| view `corgipile` | 2.70 | 1.80 | 0.90 | 0.90 |" in text
    assert "| view `full` | - | - | - | - |" in text
    assert "| x | 0.90x | met |" in text and "a test machine" in text
    s3 = objs.read_text()
    assert "old s3" not in s3 and "| corgipile | 32 |" in s3 and s3.startswith("# s\n\nmiddle\n") and s3.endswith("end\n")


def test_no_markers_no_rewrite(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "performance.md").write_text("no markers\n")
    with pytest.raises(SystemExit):
        docs.update(Report(), "r", tmp_path, "m")
    assert (tmp_path / "docs" / "performance.md").read_text() == "no markers\n"
    assert not (tmp_path / "docs" / "benchmark.md").exists()
