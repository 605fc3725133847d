"""Rows of measurements, ratios to baselines from the same run, and the markdown report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .reads import Reading

MiB = 1 << 20


@dataclass
class Row:
    dataset: str
    what: str
    reader: str
    cache: str
    reading: Reading | None = None
    file_bytes: int = 0
    file_records: int = 0
    cpu_s: float | None = None
    rss: int | None = None
    own: int | None = None
    """Peak of the daemon's own memory (anonymous + shared, sampled), without mapped file pages."""
    note: str = ""
    base: str = ""
    ratio: float | None = None
    ratio_none: float | None = None
    extra_s: float = 0.0
    """Seconds added before the first record and to the epoch (e.g. a conversion counted in epoch 1)."""
    skipped: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.dataset, self.what, self.reader, self.cache)

    @property
    def gbps(self) -> float | None:
        r = self.reading
        if r is None or r.seconds <= 0:
            return None
        if self.extra_s:
            return self.file_bytes / self.epoch_s / 1e9
        return r.nbytes / r.seconds / 1e9

    @property
    def records_per_s(self) -> float | None:
        r = self.reading
        if r is None or r.seconds <= 0:
            return None
        if self.extra_s:
            return self.file_records / self.epoch_s
        if r.records is not None:
            return r.records / r.seconds
        if self.file_bytes:
            return r.nbytes * self.file_records / self.file_bytes / r.seconds
        return None

    @property
    def epoch_s(self) -> float | None:
        """Seconds for the whole file (extrapolated from the rate if the read was cut short)."""
        r = self.reading
        if r is None:
            return None
        if r.complete or r.nbytes == 0:
            return r.seconds + self.extra_s
        return self.file_bytes * r.seconds / r.nbytes + self.extra_s

    @property
    def first_s(self) -> float | None:
        return None if self.reading is None else self.reading.first_s + self.extra_s

    @property
    def extrapolated(self) -> bool:
        return self.reading is not None and not self.reading.complete


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    header: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def find(self, dataset: str, what: str, reader: str, cache: str) -> Row | None:
        for r in self.rows:
            if r.key == (dataset, what, reader, cache) and r.reading is not None:
                return r
        return None

    def compare(self, row: Row, base: Row | None, label: str, by: str = "gbps") -> None:
        """Set ``row.ratio`` to row/base on ``by`` (a rate property)."""
        row.base = label
        if base is None:
            return
        a, b = getattr(row, by), getattr(base, by)
        if a is not None and b:
            row.ratio = a / b

    def section(self, title: str, lines: Iterable[str]) -> None:
        self.sections.append((title, list(lines)))

    # ------------------------------------------------------------------ rendering

    def markdown(self) -> str:
        out = list(self.header)
        for dataset in dict.fromkeys(r.dataset for r in self.rows):
            out += ["", f"### {dataset}", "", *table(r for r in self.rows if r.dataset == dataset)]
        for title, lines in self.sections:
            out += ["", f"### {title}", "", *lines]
        return "\n".join(out) + "\n"


COLUMNS = ("read", "reader", "cache", "GB/s", "records/s", "epoch s", "first ms", "x base", "base", "x none",
           "daemon CPU s", "daemon peak MiB own / RSS", "note")


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _peaks(r: Row) -> str:
    if r.rss is None:
        return "-"
    return f"{_num(None if r.own is None else r.own / MiB, '.0f')} / {r.rss / MiB:.0f}"


def table(rows: Iterable[Row]) -> list[str]:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in rows:
        if r.skipped:
            cells = [r.what, r.reader, r.cache] + ["-"] * (len(COLUMNS) - 4) + [f"skipped: {r.skipped}"]
        else:
            epoch = _num(r.epoch_s, ".2f") + ("~" if r.extrapolated else "")
            note = r.note
            if r.extrapolated and r.reading is not None:
                cut = f"read {r.reading.nbytes / 1e6:.0f} MB in {r.reading.seconds:.1f} s, epoch extrapolated"
                note = f"{cut}; {note}" if note else cut
            cells = [
                r.what, r.reader, r.cache, _num(r.gbps, ".3f"), _num(r.records_per_s, ",.0f"), epoch,
                _num(None if r.first_s is None else r.first_s * 1e3, ".1f"), _num(r.ratio, ".2f"), r.base or "-",
                _num(r.ratio_none, ".2f"), _num(r.cpu_s, ".2f"), _peaks(r), note,
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def verdict(value: float | None, ok: bool | None) -> str:
    """``ok`` None with a value: a figure to report, not a pass/fail target."""
    if value is None:
        return "not measured"
    if ok is None:
        return "reported"
    return "met" if ok else "NOT met"
