"""The report as CSV (RFC 4180): a header row, then one row per node with every NodeReport field flattened.

Lists (dtypes, cast names) are joined with ';'. The calibration range becomes ``range_min``,
``range_max``, ``range_absmax``, ``underflow_share``, ``subnormal_share``, ``range_count``; the error
becomes ``error_rel_l2``, ``error_max_abs``, ``error_added``. Missing values are empty cells. The first
column, ``index``, is the node's position in graph order (rows follow the requested sort).

Names and reasons come from the model, which is untrusted: a cell that starts with ``=``, ``+``,
``-``, ``@``, a tab or a carriage return would be a formula to a spreadsheet ("CSV injection"), so
such a cell is written with a leading ``'`` (as OWASP advises; spreadsheets show the text as it
is), unless it is a plain number (``-0.5``, ``-inf``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import typing
from collections.abc import Iterable

from amp_compiler.report.common import select_nodes
from amp_compiler.report.model import NodeError, NodeReport, PrecisionReport, TensorRange

__all__ = ["csv_columns", "neutralise", "render_csv"]

# Nested dataclass fields of NodeReport and how their members are named in the header.
_NESTED = {"range": TensorRange, "error": NodeError}


def _nested_column(field: str, member: str) -> str:
    if field == "range" and member.endswith("_share"):
        return member  # underflow_share, subnormal_share
    return f"{field}_{member}"


def csv_columns() -> list[str]:
    """The header, derived from the data model so that new fields appear without touching this file."""
    cols = ["index"]
    for f in dataclasses.fields(NodeReport):
        if f.name in _NESTED:
            cols += [_nested_column(f.name, m.name) for m in dataclasses.fields(_NESTED[f.name])]
        else:
            cols.append(f.name)
    return cols


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralise(text: str) -> str:
    """``text`` as a cell no spreadsheet takes for a formula (see the module doc)."""
    if not text.startswith(_FORMULA_STARTS):
        return text
    try:
        if text == text.strip():
            float(text)
            return text
    except ValueError:
        pass
    return "'" + text


def _cell(value: typing.Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return neutralise(";".join(str(v) for v in value))
    return neutralise(str(value))  # floats: repr, full precision; nan/inf as 'nan'/'inf'


def node_row(index: int, node: NodeReport) -> dict[str, str]:
    row = {"index": str(index)}
    for f in dataclasses.fields(NodeReport):
        value = getattr(node, f.name)
        if f.name in _NESTED:
            for m in dataclasses.fields(_NESTED[f.name]):
                row[_nested_column(f.name, m.name)] = _cell(None if value is None else getattr(value, m.name))
        else:
            row[f.name] = _cell(value)
    return row


def render_csv(
    report: PrecisionReport,
    *,
    sort: str = "graph",
    op: str | Iterable[str] | None = None,
    precision: str | Iterable[str] | None = None,
) -> str:
    buf = io.StringIO()
    # Rows end in CRLF (RFC 4180): with "\n" alone, the csv module would leave a cell holding a
    # carriage return (a hostile node name) unquoted, and readers would split the row there.
    writer = csv.DictWriter(buf, fieldnames=csv_columns(), lineterminator="\r\n")
    writer.writeheader()
    for i, n in select_nodes(report, sort=sort, op=op, precision=precision):
        writer.writerow(node_row(i, n))
    return buf.getvalue()
