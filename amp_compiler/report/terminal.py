"""The report as a terminal table: a summary first, then one line per node, readable in 80 columns.

Returns a string; colour (ANSI) only when asked for (the caller knows whether it writes to a TTY).
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from collections.abc import Callable, Iterable

from amp_compiler.dtypes import HIGH_PRECISION, LOW_PRECISIONS, MIXED, NO_FLOAT
from amp_compiler.policy.schemas import is_onnx_domain
from amp_compiler.report.common import (
    clean,
    filter_note,
    has_errors,
    has_ranges,
    human_bytes,
    human_count,
    pct,
    sci,
    select_nodes,
    short_num,
    summary_parts,
)
from amp_compiler.report.model import NodeReport, PrecisionReport

__all__ = ["fit_middle", "fit_op", "fit_path", "fit_rule", "render_terminal", "strip_ansi"]

DEFAULT_WIDTH = 80
ELLIPSIS = "…"

_RESET = "\x1b[0m"
_BOLD = "\x1b[1m"
_DIM = "\x1b[2m"
_RED = "\x1b[31m"
_GREEN = "\x1b[32m"
_YELLOW = "\x1b[33m"
_MAGENTA = "\x1b[35m"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# ---------------------------------------------------------------------------------------------- fitting
def fit_end(text: str, width: int) -> str:
    """Cut the end: 'SkipLayerNormalization' -> 'SkipLayerNo…'."""
    if len(text) <= width:
        return text
    return text[: max(width - 1, 0)] + ELLIPSIS if width > 0 else ""


def fit_middle(text: str, width: int) -> str:
    """Keep the start and (more of) the end, which tells nodes apart: 'encoder_layer_11_Add' -> 'enc…11_Add'."""
    if len(text) <= width:
        return text
    if width <= 1:
        return ELLIPSIS[:width]
    tail = (width - 1) * 2 // 3
    head = width - 1 - tail
    return text[:head] + ELLIPSIS + text[len(text) - tail :]


def _abbrev_segment(seg: str) -> str:
    """'layer.11' -> 'l11', 'attention' -> 'a', 'h_3_mlp' -> 'h3': the first character and the digits."""
    if not seg:
        return seg
    return seg[0] + "".join(re.findall(r"\d+", seg[1:]))


def fit_path(name: str, width: int) -> str:
    """Abbreviate a hierarchical node name, keeping its last part and the layer numbers.

    Parent segments shrink to their initial and digits, outermost first, then are elided:
    '/encoder/layer.0/attention/self/query/MatMul' at 22 -> '/e/l0/a/s/query/MatMul'.
    """
    if len(name) <= width:
        return name
    sep = "/" if "/" in name else ("." if name.count(".") >= 2 else "")
    if sep:
        segs = name.split(sep)
        lead = segs[0] == ""  # a leading separator
        body = segs[1:] if lead else segs
        if len(body) >= 2:
            def join(parts):
                return (sep if lead else "") + sep.join(parts)

            for j in range(len(body) - 1):
                body[j] = _abbrev_segment(body[j])
                if len(join(body)) <= width:
                    return join(body)
            for j in range(1, len(body)):
                cand = ELLIPSIS + sep + sep.join(body[j:])
                if len(cand) <= width:
                    return cand
            return fit_middle(body[-1], width)
    return fit_middle(name, width)


_OP_WORDS = (("Normalization", "Norm"), ("Average", "Avg"), ("Attention", "Attn"), ("Quantize", "Quant"))


def fit_op(op_type: str, width: int) -> str:
    """'LayerNormalization' -> 'LayerNorm', then cut the end."""
    if len(op_type) <= width:
        return op_type
    for long, short in _OP_WORDS:
        op_type = op_type.replace(long, short)
    return fit_end(op_type, width)


def fit_rule(rule: str, width: int) -> str:
    """Shorten leading segments of a dotted rule id to their initials: 'policy.high.arithmetic' ->
    'p.high.arithmetic' -> 'p.h.arithmetic', then cut the end."""
    if len(rule) <= width:
        return rule
    segs = rule.split(".")
    for i in range(len(segs) - 1):
        segs[i] = segs[i][:1]
        cand = ".".join(segs)
        if len(cand) <= width:
            return cand
    return fit_end(".".join(segs), width)


def _wrap(text: str, width: int, indent: str) -> list[str]:
    return textwrap.wrap(
        text, width=max(width, len(indent) + 10), initial_indent=indent, subsequent_indent=indent + "  ",
        break_on_hyphens=False,
    ) or [indent]


def _fill_parts(
    parts: Iterable[str], width: int, sep: str = ", ", indent: str = "  ", first: str = ""
) -> list[str]:
    """Join phrases with sep, starting a new (indented) line rather than splitting a phrase."""
    lines: list[str] = []
    cur = ""
    for p in parts:
        if not cur:
            cur = (indent if lines else first) + p
        elif len(cur) + len(sep) + len(p) <= width:
            cur += sep + p
        else:
            lines.append(cur + sep.rstrip())
            cur = indent + p
        while len(cur) > width:  # a single phrase longer than the line
            lines.append(cur[:width])
            cur = indent + cur[width:]
    if cur:
        lines.append(cur)
    return lines


# ---------------------------------------------------------------------------------------------- columns
@dataclasses.dataclass
class _Col:
    header: str
    get: Callable[[int, NodeReport], str]
    width: int = 0  # fixed width; 0 for a flexible column
    align: str = "<"
    fit: Callable[[str, int], str] = fit_end
    minimum: int = 0
    weight: float = 1.0
    colour: Callable[[NodeReport, str], str | None] | None = None


def _precision_colour(n: NodeReport, _text: str) -> str | None:
    if n.precision in LOW_PRECISIONS:
        return _GREEN
    return {HIGH_PRECISION: _YELLOW, MIXED: _MAGENTA, NO_FLOAT: _DIM}.get(n.precision)


def _error_colour(value: float | None) -> str | None:
    if value is None:
        return None
    if value != value or value >= 1e-2:  # NaN or large
        return _RED
    if value >= 1e-3:
        return _YELLOW
    return None


def _casts(n: NodeReport) -> str:
    if not n.casts_in and not n.casts_out:
        return "-"
    return f"{len(n.casts_in)}/{len(n.casts_out)}"


def _tc(n: NodeReport) -> str:
    return "-" if n.tensor_core is None else ("yes" if n.tensor_core else "no")


def _columns(report: PrecisionReport, width: int) -> list[_Col]:
    """Node, op, precision, rule, FLOPs, TC, casts, then calibration columns while they fit."""
    cols = [
        _Col("node", lambda i, n: clean(n.name) or f"#{i} {clean(n.op_type)}", fit=fit_path, minimum=20, weight=2.0),
        _Col("op", lambda i, n: clean(n.op_type), fit=fit_op, minimum=8, weight=1.0),
        _Col("prec", lambda i, n: clean(n.precision), width=5, colour=_precision_colour),
        _Col("rule", lambda i, n: clean(n.rule), fit=fit_rule, minimum=12, weight=1.3),
        _Col("FLOPs", lambda i, n: human_count(n.flops), width=5, align=">"),
        _Col("TC", lambda i, n: _tc(n), width=3, colour=lambda n, t: _GREEN if t == "yes" else None),
        _Col("casts", lambda i, n: _casts(n), width=5, align=">"),
    ]
    optional: list[_Col] = []
    if has_errors(report):
        optional.append(_Col(
            "err", lambda i, n: sci(n.error.rel_l2) if n.error else "-", width=7, align=">",
            colour=lambda n, t: _error_colour(n.error.rel_l2 if n.error else None),
        ))
    if has_ranges(report):
        absmax = _Col("absmax", lambda i, n: short_num(n.range.absmax, 6) if n.range else "-", width=6, align=">")
        optional.append(absmax)
    if has_errors(report):
        optional.append(_Col(
            "+err", lambda i, n: sci(n.error.added) if n.error else "-", width=7, align=">",
            colour=lambda n, t: _error_colour(n.error.added if n.error else None),
        ))
    optional.append(_Col("bytes", lambda i, n: human_count(n.bytes), width=5, align=">"))
    # Add optional columns (most useful first) while the flexible ones keep their minimum widths.
    for col in optional:
        trial = cols + [col]
        fixed = sum(c.width for c in trial if c.width) + len(trial) - 1
        if fixed + sum(c.minimum for c in trial if not c.width) <= width:
            cols = trial
        else:
            break
    return cols


def _layout(cols: list[_Col], cells: list[list[str]], width: int) -> list[int]:
    """Widths: fixed columns as given; flexible ones share what is left, up to their natural width."""
    widths = []
    natural = []
    for j, c in enumerate(cols):
        nat = max([len(c.header)] + [len(r[j]) for r in cells])
        natural.append(nat)
        widths.append(c.width or min(c.minimum, nat))
    left = width - (sum(widths) + len(cols) - 1)
    flex = [j for j, c in enumerate(cols) if not c.width]
    while left > 0:
        grow = [j for j in flex if widths[j] < natural[j]]
        if not grow:
            break
        j = min(grow, key=lambda j: widths[j] / cols[j].weight)
        widths[j] += 1
        left -= 1
    return widths


# ---------------------------------------------------------------------------------------------- details
def _details(i: int, n: NodeReport, width: int) -> list[str]:
    """The --verbose lines under a node: the rule and its reason, then dtypes, costs, casts, numerics."""
    ind = "    "
    lines = _wrap(f"{clean(n.rule)}: {clean(n.reason)}", width, ind)
    facts = [
        f"#{i} in graph {clean(n.graph)}" if n.graph else f"#{i}",
        f"{','.join(map(clean, n.input_dtypes)) or '-'} -> {','.join(map(clean, n.output_dtypes)) or '-'}",
    ]
    if not is_onnx_domain(n.domain):
        facts.append(f"domain {clean(n.domain)}")
    if n.bytes is not None:
        facts.append(f"{human_bytes(n.bytes)} moved")
    if n.tensor_core_note:
        facts.append(f"TC: {clean(n.tensor_core_note)}")
    if n.casts_in:
        facts.append("casts in: " + ", ".join(map(clean, n.casts_in)))
    if n.casts_out:
        facts.append("casts out: " + ", ".join(map(clean, n.casts_out)))
    if n.range is not None:
        r = n.range
        facts.append(
            f"range [{short_num(r.min)}, {short_num(r.max)}] absmax {short_num(r.absmax)}, "
            f"underflow {pct(r.underflow_share)}, subnormal {pct(r.subnormal_share)}"
            + (f" (moving it by {sci(r.underflow_error)} of its L2 norm)" if r.underflow_error else "")
        )
    if n.error is not None:
        e = n.error
        facts.append(f"error rel L2 {sci(e.rel_l2)}, max abs {sci(e.max_abs)}, added {sci(e.added)}")
    return lines + _fill_parts(facts, width, sep="; ", indent=ind, first=ind)


# ---------------------------------------------------------------------------------------------- render
def render_terminal(
    report: PrecisionReport,
    *,
    sort: str = "cost",
    op: str | Iterable[str] | None = None,
    precision: str | Iterable[str] | None = None,
    width: int | None = None,
    color: bool = False,
    verbose: bool = False,
    limit: int | None = None,
) -> str:
    """Summary line(s), warnings, the node table (sorted, filtered, at most ``limit`` rows), a footer.

    ``width``: line length (default 80; at least 60). ``color``: ANSI colours (only for a TTY).
    ``verbose``: each node gets indented lines with its rule's reason, dtypes, casts and numerics.
    """
    width = max(int(width or DEFAULT_WIDTH), 60)

    def paint(text: str, code: str | None) -> str:
        return f"{code}{text}{_RESET}" if color and code else text

    out: list[str] = []
    parts = [clean(p) for p in summary_parts(report)]
    summary = _fill_parts(parts, width)
    nonfinite = any("NON-FINITE" in p for p in parts)
    out += [paint(ln, _BOLD + (_RED if nonfinite else "")) for ln in summary]
    for warning in report.warnings:
        out += [paint(ln, _YELLOW) for ln in _wrap("warning: " + clean(warning), width, "")]

    rows = select_nodes(report, sort=sort, op=op, precision=precision)
    shown = rows if limit is None else rows[: max(limit, 0)]
    cols = _columns(report, width)
    cells = [[c.get(i, n) for c in cols] for i, n in shown]
    widths = _layout(cols, cells, width)

    out.append("")
    header = " ".join(f"{fit_end(c.header, w):{c.align}{w}}" for c, w in zip(cols, widths, strict=True)).rstrip()
    out.append(paint(header, _BOLD))
    out.append("-" * len(header))
    for (i, n), row in zip(shown, cells, strict=True):
        texts = []
        for c, w, text in zip(cols, widths, row, strict=True):
            cell = f"{(c.fit(text, w) if not c.width else fit_end(text, w)):{c.align}{w}}"
            texts.append(paint(cell, c.colour(n, text) if (c.colour and color) else None))
        line = " ".join(texts)
        out.append(line.rstrip() if not color else line)
        if verbose:
            out += [paint(ln, _DIM) for ln in _details(i, n, width)]

    foot = f"{len(shown)} of {len(report.nodes)} nodes shown"
    if len(shown) < len(rows):
        foot += f"; {len(rows) - len(shown)} more match"
    foot += f"; {filter_note(op, precision, sort)}"
    out.append("-" * len(header))
    out += _fill_parts(foot.split("; "), width, sep="; ")
    return "\n".join(out) + "\n"
