"""Helpers shared by the report renderers: number formats, node selection and ordering, the summary."""

from __future__ import annotations

import math
from collections.abc import Iterable

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.dtypes import HIGH_PRECISION, LOW_PRECISIONS, precision_rank
from amp_compiler.report.model import NodeReport, PrecisionReport
from amp_compiler.sizes import format_bytes

__all__ = [
    "SORTS", "changed_share", "changed_text", "clean", "cosine_str", "filter_note", "flops_by_precision", "has_errors",
    "has_ranges", "human_bytes", "human_count", "nodes_by_precision", "pct", "rows_note", "sci", "select_nodes",
    "short_num", "summary_parts", "worst_accuracy", "worst_changed",
]

SORTS = ("cost", "error", "name", "graph")


# ---------------------------------------------------------------------------------------------- numbers
def human_count(n: int | float | None) -> str:
    """1234 -> '1.23k', 1.2e9 -> '1.2G'; three significant digits, at most 5 characters."""
    if n is None:
        return "-"
    if isinstance(n, float) and not math.isfinite(n):
        return str(n)
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1000:
        return f"{sign}{n:.0f}"
    for unit in ("k", "M", "G", "T", "P", "E"):
        n /= 1000.0
        if n < 999.5 or unit == "E":
            s = f"{n:.3g}"
            if "e" in s:  # 999.7 -> '1e+03' at the boundary
                s = f"{n:.0f}"
            return f"{sign}{s}{unit}"
    raise AssertionError("unreachable")


def human_bytes(n: int | None) -> str:
    """Bytes as every size the tool prints (:func:`amp_compiler.sizes.format_bytes`: '512 B',
    '12.3 kB', '820 kB', '1.20 GB'); None as '-'."""
    return "-" if n is None else format_bytes(n)


def sci(x: float | None, digits: int = 1) -> str:
    """Compact scientific notation: 0.00123 -> '1.2e-3', 0 -> '0', None -> '-'."""
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)  # 'nan', 'inf', '-inf'
    if x == 0:
        return "0"
    mant, exp = f"{x:.{digits}e}".split("e")
    return f"{mant}e{int(exp)}"


def short_num(x: float | None, max_len: int | None = None) -> str:
    """A value in a few characters: 12.5, -0.031, 7130, 6.55e4, 1.2e-5 (trailing zeros dropped).

    With ``max_len``, fewer digits until it fits (an absmax column: 1.23e-3 -> 1.2e-3 -> 1e-3).
    """
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    ax = abs(x)
    if 1e-2 <= ax < 999.5:
        text = f"{x:.3g}"
    elif 999.5 <= ax < 9999.5:
        text = f"{x:.0f}"
    else:
        for digits in (2, 1, 0):
            mant, exp = sci(x, digits).split("e")
            if "." in mant:
                mant = mant.rstrip("0").rstrip(".")
            text = f"{mant}e{exp}"
            if max_len is None or len(text) <= max_len:
                break
    return text


def changed_share(share: float) -> str:
    """A share of changed values: '0.06%', '54.1%'; never rounded to 0% or 100% when it is not."""
    if share == 0 or share >= 1:
        return f"{share:.0%}"
    if share >= 0.999:
        return ">99.9%"
    if share >= 0.01:
        return f"{share:.1%}"
    return f"{share:.2%}" if share >= 0.0001 else "<0.01%"


def changed_text(changed: int, values: int) -> str:
    """An integer/bool output's changed values in words: '12 of 20000 values (0.06%)'."""
    share = changed_share(changed / values if values else 0.0)
    return f"{changed} of {values} value{'' if values == 1 else 's'} ({share})"


def pct(share: float) -> str:
    """A share as a percentage with one decimal that never rounds to 0% or 100% when it is not."""
    if share is None or not math.isfinite(share):
        return "-"
    s = f"{share * 100:.1f}%"
    if share < 1 and s == "100.0%":
        return ">99.9%"
    if share > 0 and s == "0.0%":
        return "<0.1%"
    return s


def cosine_str(c: float) -> str:
    """Enough digits to show how far a cosine is from 1: 0.999988 -> '0.999988', 0.93 -> '0.93'."""
    if c is None or not math.isfinite(c):
        return str(c)
    if c >= 1.0:
        return f"{c:.1f}" if c == 1.0 else f"{c:.6f}"
    digits = min(max(math.ceil(-math.log10(1.0 - c)) + 1, 3), 12)
    s = f"{c:.{digits}f}"
    while s.startswith("1.") and digits < 15:  # rounding up to 1 would hide the difference
        digits += 1
        s = f"{c:.{digits}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


# ---------------------------------------------------------------------------------------------- nodes
def _as_set(value: str | Iterable[str] | None) -> set[str] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    out = {str(v).strip().lower() for v in items if str(v).strip()}
    return out or None


def _bad(x: float | None) -> float:
    """Sort key for 'larger is worse' values: NaN counts as the worst, None as absent (-inf)."""
    if x is None:
        return -math.inf
    if math.isnan(x):
        return math.inf
    return x


def select_nodes(
    report: PrecisionReport,
    *,
    sort: str = "cost",
    op: str | Iterable[str] | None = None,
    precision: str | Iterable[str] | None = None,
) -> list[tuple[int, NodeReport]]:
    """(graph-order index, node) pairs, filtered and sorted.

    ``op``: op types (a list, or one comma-separated string; case-insensitive). ``precision``: precisions
    (fp8, fp16, bf16, fp32, mixed, none; ``low`` means fp8, fp16 or bf16, ``high`` means fp32). ``sort``: ``cost``
    (FLOPs, then bytes, largest first), ``error`` (error the node adds, then its relative L2 error,
    largest first; nodes without error data last), ``name`` or ``graph`` (graph order).
    """
    if sort not in SORTS:
        raise ValueError(f"unknown sort {sort!r}; expected one of {', '.join(SORTS)}")
    ops = _as_set(op)
    precs = _as_set(precision)
    if precs is not None:
        if "low" in precs:
            precs |= set(LOW_PRECISIONS)
        if "high" in precs:
            precs.add(HIGH_PRECISION)
    rows = [
        (i, n)
        for i, n in enumerate(report.nodes)
        if (ops is None or n.op_type.lower() in ops) and (precs is None or n.precision.lower() in precs)
    ]
    if sort == "cost":
        rows.sort(key=lambda r: (-(r[1].flops or 0), -(r[1].bytes or 0), r[0]))
    elif sort == "error":
        def key(r):
            e = r[1].error
            if e is None:
                return (1, 0.0, 0.0, r[0])
            return (0, -_bad(e.added), -_bad(e.rel_l2), r[0])

        rows.sort(key=key)
    elif sort == "name":
        rows.sort(key=lambda r: (r[1].name, r[1].graph, r[0]))
    return rows


def _as_text(value: str | Iterable[str]) -> str:
    return value if isinstance(value, str) else ",".join(str(v) for v in value)


def filter_note(op: str | Iterable[str] | None, precision: str | Iterable[str] | None, sort: str) -> str:
    """'op MatMul; precision fp32; sorted by cost'."""
    bits = []
    if op is not None and _as_set(op):
        bits.append("op " + clean(_as_text(op)))
    if precision is not None and _as_set(precision):
        bits.append("precision " + clean(_as_text(precision)))
    return "; ".join(bits + [f"sorted by {sort}"])


def flops_by_precision(report: PrecisionReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in report.nodes:
        out[n.precision] = out.get(n.precision, 0) + (n.flops or 0)
    return dict(sorted(out.items(), key=lambda kv: precision_rank(kv[0])))


def nodes_by_precision(report: PrecisionReport) -> dict[str, int]:
    counts = dict(report.summary.nodes_by_precision)
    if not counts:
        for n in report.nodes:
            counts[n.precision] = counts.get(n.precision, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: precision_rank(kv[0])))


def rows_note(report: PrecisionReport) -> str:
    """What the rows of a report are: '106 rows: 104 nodes of the model + 2 inserted Casts' (the
    header's node count is the model's; the table and the plots also show the Casts)."""
    inserted = sum(1 for n in report.nodes if n.inserted)
    rows = len(report.nodes)
    if not inserted:
        return f"{rows} nodes"
    return f"{rows} rows: {rows - inserted} nodes of the model + {inserted} inserted Cast{'s' if inserted > 1 else ''}"


def has_ranges(report: PrecisionReport) -> bool:
    return any(n.range is not None for n in report.nodes)


def has_errors(report: PrecisionReport) -> bool:
    return any(n.error is not None for n in report.nodes)


# ---------------------------------------------------------------------------------------------- summary
def worst_accuracy(
    report: PrecisionReport,
) -> tuple[OutputAccuracy | None, OutputAccuracy | None, list[OutputAccuracy]]:
    """(worst cosine output, worst max-abs-error output, non-finite outputs) of the float outputs, or Nones
    when none was measured (integer/bool outputs: :func:`worst_changed`)."""
    acc = [a for a in report.summary.accuracy if not a.exact]
    if not acc:
        return None, None, []
    worst_cos = min(acc, key=lambda a: (not math.isnan(a.cosine), a.cosine))
    worst_err = max(acc, key=lambda a: _bad(a.max_abs_error))
    return worst_cos, worst_err, [a for a in acc if not a.finite]


def worst_changed(report: PrecisionReport) -> OutputAccuracy | None:
    """The integer/bool output (a label, an index) with the largest share of values changed, or None."""
    exact = [a for a in report.summary.accuracy if a.exact]
    return max(exact, key=lambda a: a.changed_share or 0.0) if exact else None


def summary_parts(report: PrecisionReport) -> list[str]:
    """The summary as short phrases, most important first; renderers join and wrap them."""
    s = report.summary
    parts = []
    head = f"{s.target} on {s.provider}"
    parts.append(f"{report.model}: {head}" if report.model else head)
    counts = nodes_by_precision(report)
    parts.append(f"{counts.get(s.target, 0)}/{s.nodes} nodes {s.target}")
    if s.flops_total:
        parts.append(f"{pct(s.low_flops_share)} of FLOPs low precision")
    else:
        parts.append("no FLOP estimates")
    if s.untyped_nodes:
        parts.append(f"{s.untyped_nodes} node{'' if s.untyped_nodes == 1 else 's'} of unknown element type left as is")
    parts.append(f"{s.casts} cast{'' if s.casts == 1 else 's'} ({human_bytes(s.cast_bytes)})")
    parts.append(f"{human_bytes(s.size_before)} -> {human_bytes(s.size_after)}")
    worst_cos, worst_err, nonfinite = worst_accuracy(report)
    if nonfinite:
        names = ", ".join(a.name for a in nonfinite[:3]) + (", ..." if len(nonfinite) > 3 else "")
        parts.append(f"NON-FINITE output{'s' if len(nonfinite) > 1 else ''} {names}")
    for empty, why in ((False, "FP32's own values NaN/Inf"), (True, "empty in FP32")):
        unmeasured = [a.name for a in s.accuracy if a.finite and not a.measured and a.empty == empty]
        if unmeasured:
            names = ", ".join(clean(n) for n in unmeasured[:3]) + (", ..." if len(unmeasured) > 3 else "")
            parts.append(f"output{'s' if len(unmeasured) > 1 else ''} {names} not measured ({why})")
    if worst_cos is not None and worst_err is not None:
        parts.append(f"worst output cosine {cosine_str(worst_cos.cosine)}")
        on = s.accuracy_on.get(worst_err.name)
        parts.append(f"max abs error {sci(worst_err.max_abs_error)}" + (f" (on {clean(on)})" if on else ""))
    labels = worst_changed(report)
    if labels is not None and labels.changed is not None:
        on = s.accuracy_on.get(labels.name)
        parts.append(f"output {clean(labels.name)}: {changed_text(labels.changed, labels.values)} changed"
                     + (f" (on {clean(on)})" if on else ""))
    if not s.accuracy and s.accuracy_not_measured:
        parts.append("output accuracy not measured")
    if s.calibration_samples:
        parts.append(f"{s.calibration_samples} calibration sample{'' if s.calibration_samples == 1 else 's'}")
    if s.model_runs:
        parts.append(f"{s.model_runs} model run{'' if s.model_runs == 1 else 's'}")
    if s.pinned_by_tolerance:
        parts.append(f"{s.pinned_by_tolerance} pinned to fp32 by --tolerance")
    return parts


def clean(text: str) -> str:
    """Model-provided text made safe for a terminal or one CSV/HTML line: no control characters."""
    return "".join(c if c.isprintable() else "?" for c in str(text))
