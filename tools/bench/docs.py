"""``--update-docs``: a full run rewrites docs/benchmark.md and the README's Performance excerpt
(between `START` and `END`), so the figures users read are the last run's, with its date."""

from __future__ import annotations

import re
import time
from pathlib import Path

from . import peers_docs
from .report import Report

START, END = "<!-- bench:excerpt:start -->", "<!-- bench:excerpt:end -->"
S3_START, S3_END = "<!-- bench:s3:start -->", "<!-- bench:s3:end -->"
S3_SECTION = "Object storage (a local S3 server)"
EXCERPT_VIEWS = ("none", "stratified", "corgipile", "block", "window", "lirs-page", "full")
RAW, PASSTHROUGH = "raw source", "C passthrough (direct_io)"


def _gbps(report: Report, ds: str, what: str, cache: str) -> float | None:
    row = report.find(ds, what, "1MiB", cache)
    return None if row is None else row.gbps


def _cell(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def excerpt(report: Report, machine: str, dataset: str = "lines") -> list[str]:
    """The README block: 1 MiB reads of one dataset, warm and cold, with ratios to the `none` view
    and to the raw read, then the targets table of the same run."""
    none_w, raw_c = _gbps(report, dataset, "view none", "warm"), _gbps(report, dataset, RAW, "cold")
    out = [f"Last full run: {time.strftime('%Y-%m-%d')}, {machine} (all of it: [docs/benchmark.md](docs/benchmark.md)). "
           f"`{dataset}` dataset, 1 MiB reads; ratios are within this run.", "",
           "| read | warm GB/s | cold GB/s | warm x `none` | cold x raw |", "|---|---:|---:|---:|---:|"]
    for what in (RAW, PASSTHROUGH, *(f"view {v}" for v in EXCERPT_VIEWS)):
        w, c = _gbps(report, dataset, what, "warm"), _gbps(report, dataset, what, "cold")
        shown = f"view `{what[5:]}`" if what.startswith("view ") else what
        out.append(f"| {shown} | {_cell(w)} | {_cell(c)} | {_cell(w / none_w if w and none_w else None)} | "
                   f"{_cell(c / raw_c if c and raw_c else None)} |")
    for title, lines in report.sections:
        if title == "Targets":
            out += ["", "Targets, as measured in that run:", "", *lines]
    return out


def update(report: Report, text: str, repo: Path, machine: str) -> list[Path]:
    """Write docs/benchmark.md and the README excerpt; returns the files written."""
    readme = repo / "README.md"
    body = readme.read_text()
    if START not in body or END not in body:
        raise SystemExit(f"bench: {readme} has no {START} ... {END} block to update")
    block = "\n".join([START, *excerpt(report, machine), END])
    body = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, body, flags=re.S)
    s3 = [lines for title, lines in report.sections if title == S3_SECTION]
    if s3 and S3_START in body:
        block = "\n".join([S3_START, f"Last full run: {time.strftime('%Y-%m-%d')}, {machine}.", "", *s3[0], S3_END])
        body = re.sub(re.escape(S3_START) + ".*?" + re.escape(S3_END), lambda _: block, body, flags=re.S)
    readme.write_text(body)
    doc = repo / "docs" / "benchmark.md"
    doc.write_text(peers_docs.keep(doc.read_text() if doc.exists() else "", text))  # the Peers section stays
    return [doc, readme]
