"""The report as CSV: a header row, then one row per node with every NodeReport field flattened.

Lists (dtypes, cast names) are joined with ';'. The calibration range becomes ``range_min``,
``range_max``, ``range_absmax``, ``underflow_share``, ``subnormal_share``, ``range_count``; the error
becomes ``error_rel_l2``, ``error_max_abs``, ``error_added``. Missing values are empty cells. The first
column, ``index``, is the node's position in graph order (rows follow the requested sort).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import typing
from collections.abc import Iterable

from amp_compiler.report.common import select_nodes
from amp_compiler.report.model import NodeError, NodeReport, PrecisionReport, TensorRange

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


def _cell(value: typing.Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ";".join(str(v) for v in value)
    return str(value)  # floats: repr, full precision; nan/inf as 'nan'/'inf'


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
    writer = csv.DictWriter(buf, fieldnames=csv_columns(), lineterminator="\n")
    writer.writeheader()
    for i, n in select_nodes(report, sort=sort, op=op, precision=precision):
        writer.writerow(node_row(i, n))
    return buf.getvalue()
