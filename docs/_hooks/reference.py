"""MkDocs hook: the reference pages' generated parts, rendered at build time from the code itself,
so they cannot fall behind it.

``<!-- generated: cli -->`` becomes ``shufflefs --help`` and ``shufflefs COMMAND --help`` for every
command, as the argument parser prints them; ``<!-- generated: config-keys -->`` becomes the table
of the top-level keys a ``--config`` file takes (``shufflefs.cli.options.OPTIONS``)."""

from __future__ import annotations

import os
from typing import Any

WIDTH = "100"


def cli_markdown() -> str:
    """Every command's help, one section each, in the parser's order."""
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps at $COLUMNS: the same page on every terminal
    try:
        from shufflefs.cli.parser import build_parser

        parser, subs = build_parser()
        out = ["## shufflefs", "", "```text", parser.format_help().rstrip(), "```", ""]
        for name, sub in subs.items():
            out += [f"## shufflefs {name}", "", "```text", sub.format_help().rstrip(), "```", ""]
        return "\n".join(out)
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved


def _default(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value >> 20}MiB`"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def config_markdown() -> str:
    """One row per key a config file may set: its command-line option, default and help."""
    from shufflefs.cli.options import OPTIONS
    from shufflefs.cli.parser import build_parser

    _, subs = build_parser()
    helps = {a.dest: " ".join((a.help or "").split()) for a in subs["mount"]._actions}
    rows = ["| key | option | default | environment | what it sets |", "|---|---|---|---|---|"]
    for key, opt in OPTIONS.items():
        text = helps.get(key, "").replace("|", "\\|").replace("%%", "%")
        rows.append(f"| `{key}` | `--{key.replace('_', '-')}` | {_default(opt.default)} | "
                    f"{'`$' + opt.env + '`' if opt.env else '-'} | {text} |")
    return "\n".join(rows)


GENERATED = {"<!-- generated: cli -->": cli_markdown, "<!-- generated: config-keys -->": config_markdown}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    for marker, render in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
