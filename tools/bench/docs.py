"""``--update-docs``: a full run rewrites docs/benchmark.md, the excerpt of docs/performance.md
(between `START` and `END`) and the object-storage block of docs/guide/object-storage.md (between
`S3_START` and `S3_END`), so the figures users read are the last run's, with its date."""

from __future__ import annotations

import re
import time
from pathlib import Path

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
    """The performance page's block: 1 MiB reads of one dataset, warm and cold, with ratios to the `none` view
    and to the raw read, then the targets table of the same run."""
    none_w, raw_c = _gbps(report, dataset, "view none", "warm"), _gbps(report, dataset, RAW, "cold")
    out = [f"Last full run: {time.strftime('%Y-%m-%d')}, {machine} (all of it: [benchmark.md](benchmark.md)). "
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


SECTION = re.compile(r"^<!-- [a-z0-9-]+:start -->$", re.M)
"""The start of a section a standalone run writes (`write_section`, the Peers section)."""


def keep_tail(old: str, new: str) -> str:
    """``new`` (a full run's report), then everything in ``old`` from its first standalone section on
    (peers, compressed, Parquet, object-storage blocks, larger than memory: written by runs of their
    own, which a full run does not make), so a full run replaces only its own figures."""
    m = SECTION.search(old)
    if m is None or m.group(0) in new:
        return new
    return new.rstrip("\n") + "\n\n" + old[m.start():]


def _replace(path: Path, start: str, end: str, block: list[str]) -> str:
    body = path.read_text()
    if start not in body or end not in body:
        raise SystemExit(f"bench: {path} has no {start} ... {end} block to update")
    text = "\n".join([start, *block, end])
    return re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: text, body, flags=re.S)


def write_section(doc: Path, start: str, end: str, title: str, stamp: str, text: str) -> Path:
    """A section of its own (``## title``, the command and date that made it, ``text``) between
    ``start`` and ``end`` in ``doc``, replaced if there, else appended: how the standalone
    sections (`bench.sections`) write their figures."""
    body = doc.read_text()
    section = f"{start}\n## {title}\n\n`{stamp}`\n\n{text}\n{end}"
    if start in body and end in body:
        body = body[: body.index(start)] + section + body[body.index(end) + len(end):]
    else:
        body = body.rstrip("\n") + "\n\n" + section + "\n"
    doc.write_text(body)
    return doc


def update(report: Report, text: str, repo: Path, machine: str) -> list[Path]:
    """Write docs/benchmark.md, the performance page's excerpt and the object-storage page's block;
    returns the files written. Nothing is written when a page lacks its markers."""
    perf, objs = repo / "docs" / "performance.md", repo / "docs" / "guide" / "object-storage.md"
    s3 = [lines for title, lines in report.sections if title == S3_SECTION]
    pages = {perf: _replace(perf, START, END, excerpt(report, machine))}
    if s3 and objs.exists() and S3_START in objs.read_text():
        pages[objs] = _replace(objs, S3_START, S3_END, [f"Last full run: {time.strftime('%Y-%m-%d')}, {machine}.", "", *s3[0]])
    doc = repo / "docs" / "benchmark.md"
    doc.write_text(keep_tail(doc.read_text() if doc.exists() else "", text))
    for path, body in pages.items():
        path.write_text(body)
    return [doc, *pages]
