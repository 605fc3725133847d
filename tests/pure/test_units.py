"""Level: pure (no mount, no daemon).

The systemd units in mount/ load without errors or ordering cycles (`systemd-analyze verify`
where it exists), and the mount unit does not order itself after local-fs.target (systemd
orders local mounts before it: a cycle)."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

UNITS = sorted((REPO / "mount").glob("*.mount")) + sorted((REPO / "mount").glob("*.service"))


def unit_options(path: Path) -> configparser.RawConfigParser:
    cp = configparser.RawConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment]
    cp.read_string(path.read_text())
    return cp


def test_the_mount_unit_has_no_ordering_cycle_with_local_fs():
    for unit in (u for u in UNITS if u.suffix == ".mount"):
        after = unit_options(unit).get("Unit", "After", fallback="")
        assert "local-fs.target" not in after.split(), f"{unit.name}: After=local-fs.target makes a cycle"


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_systemd_analyze_verify(unit, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text())
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(copy)], capture_output=True, text=True,
                       timeout=60)
    out = r.stdout + r.stderr
    # the service names an install path that is absent here; anything else is a defect
    problems = [line for line in out.splitlines() if line.strip() and "is not executable" not in line]
    assert not problems, out
    assert "cycle" not in out.lower()
