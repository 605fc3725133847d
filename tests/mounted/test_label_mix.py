"""Level: mounted (real FUSE mounts; ``shufflefs inspect --verify`` reads the views).

A view's ``expected_label_mix`` (``user.shufflefs.info``) is what its order really gives a file
whose records carry 10 equally common labels in source order: the label mix per 1,000 records that
``shufflefs inspect --window 1000`` measures on that very view.  A file of one block under
``block`` (or one page under ``lirs-page``) is shown in source order every epoch and reports
that, where the mix of its one buffer, reported before, was 0."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

RECORDS = 2000


def sorted_lines(n: int = RECORDS, pad: int = 0) -> bytes:
    return b"".join(b'{"label": %d, "i": %d, "p": "%s"}\n' % (i * 10 // n, i, b"x" * pad) for i in range(n))


def inspected(path) -> float:
    """The label mix per 1,000 records of the view at ``path``, measured by ``shufflefs inspect``
    on the labels read from it (``--verify``: the view holds exactly the order measured)."""
    r = subprocess.run([sys.executable, "-m", "shufflefs", "inspect", str(path), "--label-field", "label",
                        "--window", "1000", "--verify", "--json"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["verified"] and len(out["strategies"]) == 1
    return next(iter(out["strategies"].values()))["label_tv"]


def mix_info(m, rel: str) -> dict:
    return json.loads(m.xattr("info", rel))


@pytest.mark.parametrize("args", [["--strategy", "block", "--block-size", "1MiB"],
                                  ["--strategy", "lirs-page", "--page-size", "1MiB"]])
def test_a_one_block_file_shown_in_source_order_reports_the_mix_of_source_order(mount, args):
    """Holds: SEMANTICS.md#views-mix"""
    data = sorted_lines()
    m = mount({"one.jsonl": data}, *args)
    for epoch in (0, 1, 2):
        m.set_epoch(epoch)
        assert m.path("one.jsonl").read_bytes() == data  # one unit: the source order, every epoch
        info = mix_info(m, "one.jsonl")
        # two stretches of 1,000 records, each of 5 of the 10 labels: TV 0.5 from the file's mix
        assert info["expected_label_mix"] == 0.5 == round(inspected(m.path("one.jsonl")), 3)
        assert info["uniform_label_mix"] < 0.05 and info["label_mix_records"] == RECORDS


@pytest.mark.parametrize("strategy", ["none", "once", "full", "lirs-page", "block", "window", "corgipile",
                                      "stratified"])
def test_the_reported_mix_is_what_inspect_measures_on_the_view(mount, strategy):
    """Holds: SEMANTICS.md#views-mix"""
    n = 20_000
    m = mount({"s.jsonl": sorted_lines(n, 40)}, "--strategy", strategy, "--block-size", "16KiB",
              "--buffer", "256KiB", "--page-size", "4KiB")
    for epoch in (0, 3):
        m.set_epoch(epoch)
        info = mix_info(m, "s.jsonl")
        assert info["label_mix_records"] == n
        assert info["expected_label_mix"] == round(inspected(m.path("s.jsonl")), 3), (epoch, info)
    if strategy == "none":
        assert info["expected_label_mix"] == 0.9  # every stretch of 1,000 holds one label
    if strategy in ("corgipile", "stratified", "full", "once"):
        assert info["expected_label_mix"] < 0.3


def test_a_rank_share_reports_the_mix_of_its_own_records(mount):
    """Holds: SEMANTICS.md#views-mix"""
    m = mount({"s.jsonl": sorted_lines(12_000)}, "--strategy", "corgipile", "--block-size", "4KiB",
              "--buffer", "64KiB", "--world-size", "2", "--rank", "1")
    info = mix_info(m, "s.jsonl")
    assert info["label_mix_records"] == info["view_records"] == 6000
    assert info["expected_label_mix"] == round(inspected(m.path("s.jsonl")), 3)
