"""The benchmark's targets table: each target, what this run measured for it, and the verdict.

Speed ratios come from the paired rounds (`paired`: contenders read alternately, median of the
per-round ratios) when they ran; otherwise from the single rows of the main tables, marked so.
"""

from __future__ import annotations

from typing import Any, Callable

from bench.report import verdict

Ratio = tuple[float, list[float]] | None


def _rounds(r: Ratio) -> str:
    return "" if r is None else f" (rounds: {', '.join(f'{x:.2f}' for x in r[1])})"


def targets(bench: Any) -> list[str]:
    """Rows of the targets table for the run ``bench`` (a finished `Bench`)."""
    rep, paired = bench.report, bench.paired
    out = ["| target | measured | verdict |", "|---|---|---|"]

    def rate(ds: str, what: str, rd: str, cache: str, by: str = "gbps") -> float | None:
        r = rep.find(ds, what, rd, cache)
        return None if r is None else getattr(r, by)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def line(text: str, value: float | None, ok: Callable[[float], bool] | None, fmt: str = "{:.2f}x") -> None:
        shown = "-" if value is None else fmt.format(value)
        out.append(f"| {text} | {shown} | {verdict(value, None if value is None or ok is None else bool(ok(value)))} |")

    def pair(text: str, r: Ratio, ok: Callable[[float], bool] | None) -> None:
        line(text + _rounds(r), None if r is None else r[0], ok)

    if paired is not None and paired.rates:
        pair("warm stratified (the default) >= 0.85x none view (paired)", paired.ratio("warm", "stratified", "none"),
             lambda v: v >= 0.85)
        pair("cold stratified (the default) >= 0.8x none view (paired)", paired.ratio("cold", "stratified", "none"),
             lambda v: v >= 0.8)
        line("label mix of the default view <= 2x a uniform shuffle's (sorted labels, same run)",
             paired.mix_ratio("stratified"), lambda v: v <= 2.0)
        line("label mix of corgipile at the automatic block size, over a uniform shuffle's (report)",
             paired.mix_ratio("corgipile"), None)
        pair("warm corgipile >= 0.9x none view (paired)", paired.ratio("warm", "corgipile", "none"), lambda v: v >= 0.9)
        pair("warm corgipile >= 0.7x C passthrough direct_io (paired)", paired.ratio("warm", "corgipile", "passthrough"),
             lambda v: v >= 0.7)
        pair("warm stratified (the default) >= 0.5x C passthrough, both through the page cache (paired)",
             paired.ratio("warm", "stratified", "passthrough-pc"), lambda v: v >= 0.5)
        pair("warm stratified: compiled replies over --python-replies (paired, report)",
             paired.ratio("warm", "stratified", "stratified-python"), None)
        pair("warm full >= 0.5x none view (paired)", paired.ratio("warm", "full", "none"), lambda v: v >= 0.5)
        pair("warm lirs-page >= 0.7x none view (paired)", paired.ratio("warm", "lirs-page", "none"), lambda v: v >= 0.7)
        pair("cold corgipile >= 0.9x raw sequential read (paired)", paired.ratio("cold", "corgipile", "raw"),
             lambda v: v >= 0.9)
        pair("cold corgipile >= 1.0x C passthrough direct_io cold (paired)",
             paired.ratio("cold", "corgipile", "passthrough"), lambda v: v >= 1.0)
        for s in ("none", "corgipile"):
            pair(f"first pass of a fresh {s} mount >= 0.8x its later passes (paired)", paired.first_ratio(s),
                 lambda v: v >= 0.8)
    serving = getattr(bench, "serving", None)
    if serving is not None and serving.rates:
        pair("warm corgipile >= 0.85x none view, both served through the page cache (serving rounds)",
             serving.ratio("default/corgipile", "default/none"), lambda v: v >= 0.85)
        for s in ("none", "corgipile"):
            pair(f"warm {s}: page cache (default) vs --direct-io (serving rounds, report)",
                 serving.ratio(f"default/{s}", f"direct-io/{s}"), None)
    if paired is not None and paired.penalty:
        p = paired.penalty
        line("larger than memory: corgipile >= 10x full", ratio(p.get("corgipile"), p.get("full")), lambda v: v >= 10)
        between = None if len(p) < 3 else float(p["full"] <= p["lirs-page"] <= p["corgipile"])
        line("larger than memory: lirs-page between full and corgipile (1 = yes)", between, lambda v: v == 1.0,
             fmt="{:.0f}")
    for ds in [d.name for d in bench.datasets]:
        mode = bench.view_mode(ds)
        cp = "view corgipile"
        pt = f"C passthrough ({mode})"
        line(f"{ds}: warm corgipile 1 MiB reads >= 0.7x C passthrough ({mode}), single rows",
             ratio(rate(ds, cp, "1MiB", "warm"), rate(ds, pt, "1MiB", "warm")), lambda v: v >= 0.7)
        line(f"{ds}: warm corgipile 1 MiB reads vs none view, single rows (report)",
             ratio(rate(ds, cp, "1MiB", "warm"), rate(ds, "view none", "1MiB", "warm")), None)
        line(f"{ds}: warm corgipile 128 KiB reads vs C passthrough ({mode}) (report the gap)",
             ratio(rate(ds, cp, "128KiB", "warm"), rate(ds, pt, "128KiB", "warm")), None)
        line(f"{ds}: cold corgipile 1 MiB reads vs raw sequential read (cold), single rows (report)",
             ratio(rate(ds, cp, "1MiB", "cold"), rate(ds, "raw source", "1MiB", "cold")), None)
        line(f"{ds}: cold corgipile / full, 1 MiB reads, the file fits in the page cache (report: the kernel's "
             "readahead turns full's ascending record reads into a sequential read)",
             ratio(rate(ds, cp, "1MiB", "cold"), rate(ds, "view full", "1MiB", "cold")), None)
        loop = rate(ds, cp, "loop", "cold", "records_per_s")
        line(f"{ds}: cold corgipile Python loop >= 5x records/s of the pread Dataset (0 workers)",
             ratio(loop, rate(ds, "pread Dataset, 0 workers", "random", "cold", "records_per_s")), lambda v: v >= 5)
        for cache in bench.caches:
            mds = rep.find(ds, "MosaicML epoch 1 incl. conversion", "py1e", cache)
            cpl = rep.find(ds, cp, "loop", cache)
            value = None if mds is None or cpl is None else mds.epoch_s / cpl.epoch_s
            line(f"{ds}: {cache} epoch, corgipile Python loop >= 1x MosaicML Streaming with conversion "
                 "(MosaicML epoch 1 time / corgipile epoch time)", value, lambda v: v >= 1)
    line("index build, newline scanning, warm >= 1 GB/s", bench.index_gbps, lambda v: v >= 1, fmt="{:.2f} GB/s")
    line("remount with a cached index < 1 s (median of warm runs)", bench.remount_s, lambda v: v < 1, fmt="{:.3f} s")
    line("daemon's own memory <= 16 B/record + 3 windows + 100 MiB (worst view row, see the memory table)",
         worst_memory(rep), lambda v: v <= 1.0, fmt="{:.2f} of the bound")
    line("epoch change -> first byte of corgipile < 100 ms (setxattr, median)",
         None if bench.epoch_first_s is None else bench.epoch_first_s * 1e3, lambda v: v < 100, fmt="{:.1f} ms")
    for i, how in enumerate(("on the same layout", "after a stop on another layout")):
        line(f"resume -> first byte of corgipile < 100 ms, {how} (setxattr, median)",
             None if bench.resume_first_s is None else bench.resume_first_s[i] * 1e3, lambda v: v < 100, fmt="{:.1f} ms")
    return out


def worst_memory(rep: Any) -> float | None:
    """The largest own / bound of the daemon memory table."""
    worst = None
    for title, lines in rep.sections:
        if title.startswith("Daemon memory"):
            for ln in lines[2:]:
                cell = ln.strip("|").split("|")[-1].strip()
                if cell not in ("-", ""):
                    worst = max(worst or 0.0, float(cell))
    return worst
