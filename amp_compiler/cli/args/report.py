"""Where and how a precision report is written: ``convert --report FILE`` and the ``report`` command's view."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from amp_compiler.cli.args.group import ArgGroup
from amp_compiler.errors import OutputError

if TYPE_CHECKING:  # imported when a report is written, not to build the parser
    from amp_compiler.report.model import PrecisionReport

__all__ = ["ReportFileArgs", "ReportViewArgs", "write_text"]

FORMATS = ("terminal", "json", "csv", "html")


class ReportFileArgs(ArgGroup):
    """``convert --report FILE``: also write the report, in the format its suffix names. Asking for a
    report asks for the analysis path. Depends on nothing to parse; writing needs an analysis."""

    title = "report"

    def __init__(self) -> None:
        self.path: Path | None = None

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--report", metavar="FILE",
            help="also write the precision report; the format follows the suffix (.json, .csv, .html, else text)",
        )

    def parse(self, args: argparse.Namespace) -> None:
        self.path = Path(args.report) if args.report else None

    def write(self, report: PrecisionReport, source: Path) -> None:
        """Write ``report`` to ``--report``'s file (nothing when it was not given), never over ``source``."""
        if self.path is not None:
            from amp_compiler.report.render import render

            write_text(self.path, render(report, format_for(self.path)), source)


class ReportViewArgs(ArgGroup):
    """The ``report`` command's view: format, rows, and where it goes (``-o``, else stdout).
    Depends on nothing to parse; showing needs an analysis."""

    title = "report view"

    def __init__(self) -> None:
        self.format = "terminal"
        self.output: Path | None = None  # None: stdout
        self.sort = "cost"
        self.ops: list[str] = []
        self.precisions: list[str] = []
        self.verbose = False
        self.limit: int | None = None

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--format", default="terminal", choices=list(FORMATS), help="report format")
        group.add_argument("-o", "--output", metavar="FILE", help="write the report here instead of stdout")
        group.add_argument("--sort", default="cost", choices=["cost", "error", "name", "graph"], help="row order")
        group.add_argument(
            "--op", action="append", default=[], metavar="OP", help="only rows of this op type (repeatable)"
        )
        group.add_argument(
            "--precision", action="append", default=[], metavar="P",
            help="only rows of this precision: fp16, bf16, fp32, mixed, none, low, high (repeatable)",
        )
        group.add_argument("-v", "--verbose", action="store_true", help="show each decision's reason")
        group.add_argument("--limit", type=int, default=None, help="at most this many rows in the terminal table")

    def parse(self, args: argparse.Namespace) -> None:
        self.format, self.sort, self.verbose, self.limit = args.format, args.sort, args.verbose, args.limit
        self.output = Path(args.output) if args.output else None
        self.ops, self.precisions = args.op, args.precision

    def show(self, report: PrecisionReport, source: Path) -> None:
        """Render ``report`` as asked, to ``-o``'s file (never over ``source``, the model; one line
        says where it went) or to stdout (in colour on a terminal)."""
        from amp_compiler.report.render import render

        to_tty = self.output is None and sys.stdout.isatty()
        text = render(
            report,
            self.format,
            sort=self.sort,
            op=self.ops or None,
            precision=self.precisions or None,
            color=to_tty and self.format == "terminal",
            verbose=self.verbose,
            limit=self.limit,
        )
        if self.output is not None:
            write_text(self.output, text, source)
            print(f"{self.output}: {self.format} report written ({len(report.nodes)} rows)")
        else:
            sys.stdout.write(text)


def format_for(path: Path) -> str:
    """The report format a file's suffix names (.json, .csv, .html/.htm; anything else: terminal text)."""
    return {".json": "json", ".csv": "csv", ".html": "html", ".htm": "html"}.get(path.suffix.lower(), "terminal")


def write_text(path: Path, text: str, *sources: Path) -> None:
    """Write a report atomically (temporary file, then rename; the umask's permissions), never over
    the model files ``sources``."""
    from amp_compiler.onnx.write.save import check_output_path

    try:
        output = check_output_path(path, list(sources))
    except OutputError as exc:
        raise OutputError(f"{exc} (the report)") from None
    output.write_bytes(text.encode("utf-8"))
