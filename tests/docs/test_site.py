"""Level: pure (no mount). The documentation site builds with ``mkdocs build --strict`` (a broken
link, a missing anchor or a page left out of the navigation fails it), and its reference pages
name every command-line option, config key and extended attribute the code has."""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytest.importorskip("mkdocs")
pytest.importorskip("material")


def build(root: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(root / "mkdocs.yml"),
                           "-d", str(out)], cwd=root, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(REPO, out)
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def text_of(site: Path, page: str) -> str:
    """A built page's text, without tags."""
    return html.unescape(re.sub(r"<[^>]+>", "", (site / page / "index.html").read_text()))


def test_the_site_builds_strict(site: Path) -> None:
    for page in ("guide/cluster", "reference/cli", "reference/config", "reference/xattrs", "troubleshooting", "SEMANTICS"):
        assert (site / page / "index.html").exists(), page


def test_a_page_left_out_of_the_nav_or_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root)
    shutil.copytree(REPO / "docs", root / "docs")
    (root / "docs" / "stray.md").write_text("# Not in the navigation\n")
    done = build(root, tmp_path / "out")
    assert done.returncode != 0 and "stray.md" in done.stdout + done.stderr
    (root / "docs" / "stray.md").unlink()
    page = root / "docs" / "guide" / "staging.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    done = build(root, tmp_path / "out")
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr


def test_the_cli_reference_has_every_command_and_option(site: Path) -> None:
    from shufflefs.cli.parser import build_parser

    page = text_of(site, "reference/cli")
    _, subs = build_parser()
    missing = []
    for name, sub in subs.items():
        assert f"usage: shufflefs {name}" in page, name
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:  # internal (the daemon's readiness pipe), not for users
                continue
            missing += [f"{name} {s}" for s in action.option_strings if s.startswith("--") and s not in page]
    assert not missing, f"options missing from the CLI reference: {missing}"


def test_the_config_reference_has_every_key(site: Path) -> None:
    from shufflefs.cli.options import OPTIONS

    page = text_of(site, "reference/config")
    assert not [k for k in OPTIONS if k not in page]
    for table in ("[[format]]", "[[pool]]", "[[mix]]", "[[mix.source]]"):
        assert table in page


def test_the_xattr_reference_has_every_attribute() -> None:
    from shufflefs.serve.xattrs import OURS

    page = (REPO / "docs" / "reference" / "xattrs.md").read_text()
    names = sorted(n.decode() for n in OURS)
    assert len(names) >= 12
    assert not [n for n in names if f"`{n}`" not in page], "attributes missing from docs/reference/xattrs.md"
