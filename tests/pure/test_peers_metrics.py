"""Level: pure (no mount, no daemon).

``tools/bench.py --only peers``: the label mix of a read (against the whole set's label shares) agrees with
`shufflefs.quality.label_mix_tv` where both apply, scores a sorted read near 1 - 1/L and a
uniform permutation near the exact expectation; its section survives the main benchmark's
rewrite of docs/benchmark.md and a re-run replaces it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from bench import docs, peers_data, peers_docs  # noqa: E402
from shufflefs.quality import metrics as quality  # noqa: E402

N = 100_000


def test_label_mix_of_known_orders() -> None:
    whole = peers_data.whole_shares(N)
    perm = np.random.default_rng(1).permutation(N)
    labels = peers_data.label_of(perm, N)
    mix = peers_data.label_mix(labels, whole)
    # the whole permutation: its own histogram is the whole set's, so both measures agree
    assert abs(mix - quality.label_mix_tv(perm, peers_data.label_of(np.arange(N), N), 1000)) < 1e-12
    assert abs(mix - quality.expected_label_mix_tv(np.bincount(peers_data.label_of(np.arange(N), N)), 1000)) < 0.003
    assert abs(peers_data.label_mix(peers_data.label_of(np.arange(N), N), whole) - 0.9) < 0.01
    # a read of only the first labels is judged against the whole set, not its own mix
    assert peers_data.label_mix(np.repeat([0, 1], 5000)[np.random.default_rng(2).permutation(10_000)], whole) > 0.75


def test_uniform_reference_and_entropy() -> None:
    ref = peers_data.uniform_reference(N, 20_000)
    assert ref["samples"] == 20_000 and ref["labels_seen"] == 10
    assert abs(ref["mix"] - ref["expected_mix"]) < 0.003
    sorted_read = peers_data.order_metrics(np.arange(N), peers_data.label_of(np.arange(N), N), N, 20_000)
    assert sorted_read["entropy"] == 0.0 and ref["entropy"] > 10


def test_section_is_kept_and_replaced(tmp_path: Path) -> None:
    doc = tmp_path / "benchmark.md"
    doc.write_text("## shufflefs benchmark\n\nold report\n")
    peers_docs.write(doc, [peers_docs.START, "first run", peers_docs.END])
    peers_docs.write(doc, [peers_docs.START, "second run", peers_docs.END])
    body = doc.read_text()
    assert body.count(peers_docs.START) == 1 and "second run" in body and "first run" not in body
    body += "\n<!-- compressed-bench:start -->\n## Compressed\n\nits run\n<!-- compressed-bench:end -->\n\n## Larger than memory\n\nby hand\n"
    kept = docs.keep_tail(body, "## shufflefs benchmark\n\nnew report\n")  # what a full run writes
    assert "new report" in kept and "old report" not in kept
    assert all(x in kept for x in ("second run", "its run", "Larger than memory", "by hand"))
    assert docs.keep_tail(kept, kept) == kept


def test_readme_table_is_written_between_its_markers(tmp_path: Path) -> None:
    from types import SimpleNamespace as NS

    def result(name: str, rate: float | None, mix: float, skipped: str = "") -> NS:
        return NS(spec=NS(name=name), skipped=skipped, out={"warm": {"complete": True}} if not skipped else {},
                  metrics={"mix": mix}, rate=lambda cache: rate)

    peers = NS(n=1000, uniform={"expected_mix": 0.0378},
               results=[result("shufflefs default, Python loop", 1234.0, 0.037), result("gone", None, 0, "not installed")])
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{peers_docs.README_START}\nold table\n{peers_docs.README_END}\n\n## next\n")
    peers_docs.write(readme, peers_docs.readme(peers), peers_docs.README_START, peers_docs.README_END)
    body = readme.read_text()
    assert "old table" not in body and "| shufflefs default, Python loop | 1,234 | 0.037 |" in body
    assert "gone" not in body and body.endswith("## next\n") and body.count(peers_docs.README_START) == 1
