"""One entry point for every report format: ``render(report, "terminal" | "json" | "csv" | "html")``."""

from __future__ import annotations

import json
from collections.abc import Iterable

from amp_compiler.report.common import SORTS
from amp_compiler.report.csv_render import render_csv
from amp_compiler.report.html import render_html
from amp_compiler.report.model import PrecisionReport
from amp_compiler.report.terminal import render_terminal

FORMATS = ("terminal", "json", "csv", "html")
__all__ = ["FORMATS", "SORTS", "render"]


def render(
    report: PrecisionReport,
    fmt: str = "terminal",
    *,
    sort: str = "cost",
    op: str | Iterable[str] | None = None,
    precision: str | Iterable[str] | None = None,
    width: int | None = None,
    color: bool = False,
    verbose: bool = False,
    limit: int | None = None,
) -> str:
    """The report as text in one format.

    ``sort`` (cost | error | name | graph), ``op`` and ``precision`` (op types / precisions, a list or a
    comma-separated string; precision also takes ``low`` and ``high``) order and select the node rows of
    the terminal table, the CSV and the HTML table; the summary, the HTML plots and JSON always cover
    the whole model. ``width`` (default 80), ``color`` (ANSI, for a TTY only), ``verbose`` (each rule's
    reason under its node) and ``limit`` (at most this many rows) apply to the terminal table.
    JSON is the full report (``PrecisionReport.from_dict(json.loads(text))`` gives it back); non-finite
    numbers are written as NaN/Infinity, as Python's json module does.
    """
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}; expected one of {', '.join(SORTS)}")
    if fmt == "terminal":
        return render_terminal(
            report, sort=sort, op=op, precision=precision, width=width, color=color, verbose=verbose, limit=limit
        )
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=1) + "\n"
    if fmt == "csv":
        return render_csv(report, sort=sort, op=op, precision=precision)
    if fmt == "html":
        return render_html(report, sort=sort, op=op, precision=precision)
    raise ValueError(f"unknown report format {fmt!r}; expected one of {', '.join(FORMATS)}")
