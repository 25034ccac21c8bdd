"""The HTML report's inline SVG plots, and the colours and escaping the page shares with them.

Three plots: the share of FLOPs per precision, FLOPs by op type, and FLOPs (or per-layer error)
along the graph.

Plots stay small for large graphs: per-node markers are binned to at most ``MAX_MARKS`` along the
graph and text labels are bounded (decades, ticks, the ten largest op types, the three worst nodes).
Every model-provided string goes through :func:`e` (html.escape).
"""

from __future__ import annotations

import html
import math

from amp_compiler.dtypes import precision_rank
from amp_compiler.report.common import (
    clean,
    flops_by_precision,
    has_errors,
    human_count,
    nodes_by_precision,
    pct,
    rows_note,
    sci,
)
from amp_compiler.report.model import NodeReport, PrecisionReport

__all__ = ["COLOURS", "MAX_MARKS", "colour", "e", "graph_plot", "ops_plot", "share_plot"]

MAX_MARKS = 600  # markers along the graph before nodes are binned
TOP_OPS = 10

COLOURS = {
    "fp16": "#2a9d8f",
    "bf16": "#3a86ff",
    "mixed": "#9b5de5",
    "fp32": "#f4a261",
    "none": "#adb5bd",
}
OTHER_COLOUR = "#6c757d"
BAD_COLOUR = "#d62828"


def e(text: object) -> str:
    """Text for HTML: control characters cleaned, then escaped (quotes too)."""
    return html.escape(clean(str(text)), quote=True)


def colour(precision: str) -> str:
    """The fill colour of a precision."""
    return COLOURS.get(precision, OTHER_COLOUR)


def _f(x: float) -> str:
    """SVG coordinate."""
    return f"{x:.1f}".rstrip("0").rstrip(".")



def _legend_swatch(x: float, y: float, precision: str, label: str) -> str:
    return (
        f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="11" height="11" rx="2" fill="{colour(precision)}"/>'
        f'<text x="{_f(x + 16)}" y="{_f(y)}">{label}</text>'
    )


def share_plot(report: PrecisionReport) -> str:
    """Two stacked bars, FLOPs and nodes by precision, with a 0-100% axis and a legend."""
    flops = flops_by_precision(report)
    counts = nodes_by_precision(report)
    total_flops = sum(flops.values())
    total_nodes = sum(counts.values())
    precisions = sorted(set(flops) | set(counts), key=precision_rank)
    bars = []
    if total_flops:
        bars.append(("FLOPs", {p: flops.get(p, 0) / total_flops for p in precisions}))
    if total_nodes:
        bars.append(("nodes", {p: counts.get(p, 0) / total_nodes for p in precisions}))
    W, x0, x1, bh, gap = 540, 64, 520, 30, 16
    out = []
    y = 14
    for label, shares in bars:
        out.append(f'<text x="{x0 - 8}" y="{_f(y + bh / 2 + 4)}" text-anchor="end" class="lbl">{label}</text>')
        x = float(x0)
        for p in precisions:
            w = shares[p] * (x1 - x0)
            if w <= 0:
                continue
            out.append(
                f'<rect x="{_f(x)}" y="{y}" width="{_f(max(w, 0.5))}" height="{bh}" fill="{colour(p)}">'
                f"<title>{e(p)}: {pct(shares[p])} of {label}</title></rect>"
            )
            if w >= 46:
                out.append(f'<text x="{_f(x + w / 2)}" y="{_f(y + bh / 2 + 4)}" text-anchor="middle" '
                           f'class="inbar">{pct(shares[p])}</text>')
            x += w
        y += bh + gap
    axis_y = y - gap + 6
    for k in range(5):
        x = x0 + k * (x1 - x0) / 4
        out.append(f'<line x1="{_f(x)}" y1="{axis_y}" x2="{_f(x)}" y2="{axis_y + 4}" class="tick"/>')
        out.append(f'<text x="{_f(x)}" y="{axis_y + 16}" text-anchor="middle" class="tl">{k * 25}%</text>')
    out.append(f'<line x1="{x0}" y1="{axis_y}" x2="{x1}" y2="{axis_y}" class="axis"/>')
    y = axis_y + 40
    for p in precisions:
        label = f"{e(p)}: "
        if total_flops:
            label += f"{pct(flops.get(p, 0) / total_flops)} of FLOPs ({human_count(flops.get(p, 0))}), "
        label += f"{counts.get(p, 0)} node(s)"
        out.append(_legend_swatch(x0, y, p, label))
        y += 19
    note = "" if total_flops else f'<text x="{x0}" y="{y + 4}" class="note">no FLOP estimates in this report</text>'
    H = y + (14 if total_flops else 24)
    return (
        f'<svg class="plot" id="plot-share" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="Share of FLOPs and nodes per precision">{"".join(out)}{note}</svg>'
    )


def ops_plot(report: PrecisionReport) -> str:
    """The op types with the most FLOPs, each bar split by precision."""
    by_op: dict[str, dict[str, int]] = {}
    for n in report.nodes:
        if n.flops:
            d = by_op.setdefault(n.op_type, {})
            d[n.precision] = d.get(n.precision, 0) + n.flops
    if not by_op:
        return ""
    ranked = sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))
    top = ranked[:TOP_OPS]
    rest = ranked[TOP_OPS:]
    if rest:
        merged: dict[str, int] = {}
        for _, d in rest:
            for p, v in d.items():
                merged[p] = merged.get(p, 0) + v
        top.append((f"{len(rest)} other op types", merged))
    biggest = max(sum(d.values()) for _, d in top)
    W, x0, x1, bh, gap = 540, 150, 470, 16, 6
    out = []
    y = 8
    for op_type, d in top:
        name = op_type if len(op_type) <= 22 else op_type[:21] + "…"
        out.append(f'<text x="{x0 - 8}" y="{y + bh - 4}" text-anchor="end" class="lbl">{e(name)}</text>')
        x = float(x0)
        total = sum(d.values())
        for p in sorted(d, key=precision_rank):
            w = d[p] / biggest * (x1 - x0)
            out.append(
                f'<rect x="{_f(x)}" y="{y}" width="{_f(max(w, 0.5))}" height="{bh}" fill="{colour(p)}">'
                f"<title>{e(op_type)} in {e(p)}: {human_count(d[p])} FLOPs</title></rect>"
            )
            x += w
        out.append(f'<text x="{_f(x + 5)}" y="{y + bh - 4}" class="tl">{human_count(total)}</text>')
        y += bh + gap
    out.append(f'<line x1="{x0}" y1="4" x2="{x0}" y2="{y - gap + 4}" class="axis"/>')
    y += 14
    precisions = sorted({p for _, d in top for p in d}, key=precision_rank)
    x = float(x0)
    for p in precisions:
        out.append(_legend_swatch(x, y, p, e(p)))
        x += 70
    H = y + 10
    return (
        f'<svg class="plot" id="plot-ops" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="FLOPs by op type and precision">{"".join(out)}</svg>'
    )


def _nice_step(span: float, target: int = 8) -> int:
    raw = max(span / target, 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return int(m * mag)
    return int(10 * mag)


def graph_plot(report: PrecisionReport) -> tuple[str, str]:
    """Per-node relative L2 error along the graph (log scale); without calibration data, per-node FLOPs.

    Returns (svg, caption html).
    """
    errors = has_errors(report)
    N = len(report.nodes)
    pts: list[tuple[int, float, NodeReport]] = []  # (index, value, node)
    for i, n in enumerate(report.nodes):
        if errors:
            if n.error is not None:
                pts.append((i, n.error.rel_l2, n))
        elif n.flops:
            pts.append((i, float(n.flops), n))
    W, H = 1160, 330
    L, R, T, B = 76, 20, 34, 52
    PW, PH = W - L - R, H - T - B
    what = "relative L2 error vs FP32" if errors else "estimated FLOPs"
    if not pts:
        svg = (
            f'<svg class="plot" id="plot-graph" viewBox="0 0 {W} 80" width="{W}" height="80" role="img" '
            f'aria-label="{what} along the graph"><text x="{L}" y="40" class="note">no '
            f'{"error" if errors else "FLOP"} data to plot</text></svg>'
        )
        return svg, ""
    finite_pos = [v for _, v, _ in pts if math.isfinite(v) and v > 0]
    if finite_pos:
        hi = math.ceil(math.log10(max(finite_pos)) + 1e-9)
        lo = math.floor(math.log10(min(finite_pos)))
    else:
        hi, lo = 0, -8
    lo = max(lo, hi - 12)
    if hi <= lo:
        hi = lo + 1
    floor_v = 10.0 ** lo

    def ypos(v: float) -> float:
        if not math.isfinite(v):
            return float(T)
        v = max(v, floor_v)
        return T + PH - (math.log10(v) - lo) / (hi - lo) * PH

    def xpos(i: float) -> float:
        return L + (i + 0.5) / max(N, 1) * PW

    out = []
    # Grid and y axis: one line per decade, labels thinned to at most ~8.
    dstep = max(1, math.ceil((hi - lo) / 8))
    for d in range(lo, hi + 1):
        y = ypos(10.0 ** d)
        out.append(f'<line x1="{L}" y1="{_f(y)}" x2="{L + PW}" y2="{_f(y)}" class="grid"/>')
        if (d - lo) % dstep == 0:
            out.append(f'<text x="{L - 6}" y="{_f(y + 4)}" text-anchor="end" class="tl">1e{d}</text>')
    # X axis ticks.
    step = _nice_step(N)
    for t in range(0, N, step):
        x = xpos(t)
        out.append(f'<line x1="{_f(x)}" y1="{T + PH}" x2="{_f(x)}" y2="{T + PH + 5}" class="tick"/>')
        out.append(f'<text x="{_f(x)}" y="{T + PH + 18}" text-anchor="middle" class="tl">{t}</text>')
    out.append(f'<line x1="{L}" y1="{T + PH}" x2="{L + PW}" y2="{T + PH}" class="axis"/>')
    out.append(f'<line x1="{L}" y1="{T}" x2="{L}" y2="{T + PH}" class="axis"/>')
    out.append(
        f'<text x="{L + PW / 2}" y="{H - 8}" text-anchor="middle" class="lbl">node index in graph order '
        f"({e(rows_note(report))})</text>"
    )
    out.append(
        f'<text transform="translate(16 {_f(T + PH / 2)}) rotate(-90)" text-anchor="middle" class="lbl">'
        f"{what} (log)</text>"
    )

    # Marks: one per node, or per bin of nodes when there are many (the largest value in the bin).
    nbins = min(N, MAX_MARKS)
    bins: dict[int, list[tuple[int, float, NodeReport]]] = {}
    for p in pts:
        bins.setdefault(p[0] * nbins // N, []).append(p)
    binned = N > MAX_MARKS
    bar_w = max(PW / nbins * 0.7, 1.0)
    for b, members in sorted(bins.items()):
        worst = max(members, key=lambda p: (math.isnan(p[1]) or math.isinf(p[1]), p[1]))
        i, v, n = worst
        x = xpos(i) if not binned else L + (b + 0.5) / nbins * PW
        y = ypos(v)
        bad = not math.isfinite(v)
        fill = BAD_COLOUR if bad else colour(n.precision)
        label = f"#{i} {e(n.name)} ({e(n.op_type)}, {e(n.precision)}): " + (
            f"rel L2 {sci(v)}" if errors else f"{human_count(v)} FLOPs"
        )
        if binned:
            first, last = -(-b * N // nbins), -(-(b + 1) * N // nbins) - 1  # i in bin b iff i*nbins//N == b
            label = f"nodes {first}-{last}, largest: " + label
        tip = f"<title>{label}</title>"
        if errors:
            if binned and len(members) > 1:
                ys = [ypos(p[1]) for p in members]
                out.append(f'<line x1="{_f(x)}" y1="{_f(min(ys))}" x2="{_f(x)}" y2="{_f(max(ys))}" class="span"/>')
            if bad:  # a square at the top
                out.append(f'<rect x="{_f(x - 3.5)}" y="{_f(y - 3.5)}" width="7" height="7" fill="{fill}">{tip}</rect>')
            else:
                r = 3 if N <= 200 else 2.2
                out.append(f'<circle cx="{_f(x)}" cy="{_f(y)}" r="{r}" fill="{fill}">{tip}</circle>')
        else:
            out.append(
                f'<rect x="{_f(x - bar_w / 2)}" y="{_f(y)}" width="{_f(bar_w)}" height="{_f(T + PH - y)}" '
                f'fill="{fill}">{tip}</rect>'
            )

    # The three worst nodes, numbered on the plot and named in the caption.
    caption = ""
    if errors:
        worst3 = sorted(pts, key=lambda p: (math.isnan(p[1]) or math.isinf(p[1]), p[1]), reverse=True)[:3]
        items = []
        for k, (i, v, n) in enumerate(worst3, 1):
            x = xpos(i)
            out.append(f'<text x="{_f(x + 5)}" y="{_f(ypos(v) - 5)}" class="mark">{k}</text>')
            items.append(f"<li>{k}. <code>{e(n.name)}</code> ({e(n.op_type)}, {e(n.precision)}): rel L2 {sci(v)}"
                         + (f", adds {sci(n.error.added)}" if n.error else "") + "</li>")
        caption = (
            "Relative L2 error of each node's first float output against FP32 on the calibration data."
            f" Values below 1e{lo} (including exact zeros) lie on the bottom line"
            + ("; each mark is the largest of a bin of consecutive nodes" if binned else "")
            + ". Largest:<ol class=\"worst\">" + "".join(items) + "</ol>"
        )
    else:
        caption = (
            "Per-layer error needs <code>--calibration-data</code>; showing the estimated FLOPs of each node "
            "along the graph instead, coloured by precision"
            + (" (each bar is the largest node of a bin of consecutive nodes)" if binned else "") + "."
        )
    # Legend (top right).
    present = sorted({n.precision for _, _, n in pts}, key=precision_rank)
    x = L + PW - 72 * len(present) - (90 if errors and any(not math.isfinite(v) for _, v, _ in pts) else 0)
    for prec in present:
        out.append(_legend_swatch(x, 18, prec, e(prec)))
        x += 72
    if errors and any(not math.isfinite(v) for _, v, _ in pts):
        out.append(f'<rect x="{_f(x)}" y="9" width="11" height="11" fill="{BAD_COLOUR}"/>'
                   f'<text x="{_f(x + 16)}" y="18">non-finite</text>')
    svg = (
        f'<svg class="plot" id="plot-graph" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{what} along the graph">{"".join(out)}</svg>'
    )
    return svg, caption
