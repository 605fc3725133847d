"""tools/bench.py --only s3-costs (tools/bench/s3_costs.py): its model of a record-level order's requests agrees with the requests the
views would make, and a block order fetches its share once."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[2] / "tools" / "bench.py"


def test_the_model_matches_a_count_and_block_orders_fetch_their_share_once():
    r = subprocess.run([sys.executable, str(TOOL), "--only", "s3-costs", "--records", "2e6", "--world", "20", "--objects", "100",
                        "--sample", "3", "--check-records", "1e6"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    m = re.search(r"([0-9.]+) requests per record measured, ([0-9.]+) modelled", r.stdout)
    assert m, r.stdout
    measured, modelled = map(float, m.groups())
    assert abs(measured - modelled) < 0.05, r.stdout
    rows = {line.split("|")[1].strip(): line.split("|")[2:] for line in r.stdout.splitlines() if line.startswith("| ")}
    for name in ("none", "corgipile", "stratified"):
        share = float(rows[name][2])  # bytes fetched over the rank's share of the data
        assert 0.95 <= share <= 1.1, r.stdout
    assert float(rows["pls, staged (later epochs)"][2]) < 0.2  # a tenth of the share, received
