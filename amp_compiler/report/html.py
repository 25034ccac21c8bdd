"""The report as one self-contained HTML file: summary cards, inline SVG plots, the node table.

No network: no external scripts, fonts, stylesheets or images (a Content-Security-Policy in the page
forbids them), the plots are SVG written here. Every model-provided string goes through html.escape.
Plots stay small for large graphs: per-node markers are binned to at most ``MAX_MARKS`` along the
graph and text labels are bounded (decades, ticks, the ten largest op types, the three worst nodes).
The table is sortable by clicking a header (a few lines of inline JS); without JS it is a plain table.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable

from amp_compiler.report.common import (
    clean,
    cosine_str,
    filter_note,
    flops_by_precision,
    has_errors,
    has_ranges,
    human_bytes,
    human_count,
    nodes_by_precision,
    pct,
    precision_rank,
    sci,
    select_nodes,
    short_num,
    worst_accuracy,
)
from amp_compiler.report.model import NodeReport, PrecisionReport

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
    return html.escape(clean(str(text)), quote=True)


def colour(precision: str) -> str:
    return COLOURS.get(precision, OTHER_COLOUR)


def _f(x: float) -> str:
    """SVG coordinate."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------------------------------------- cards
def _nb(text: str) -> str:
    """No line break inside '0.82 MB'."""
    return text.replace(" ", "&nbsp;")


def _card(title: str, value: str, sub: str = "", cls: str = "") -> str:
    return (
        f'<div class="card {cls}"><div class="card-title">{title}</div>'
        f'<div class="card-value">{value}</div><div class="card-sub">{sub}</div></div>'
    )


def _cards(report: PrecisionReport) -> str:
    s = report.summary
    counts = nodes_by_precision(report)
    cards = [_card("Target", e(s.target), f"for the {e(s.provider)} execution provider")]
    if s.flops_total:
        cards.append(_card(
            "Low-precision FLOPs", pct(s.low_flops_share),
            f"{human_count(s.flops_low)} of {human_count(s.flops_total)} FLOPs in {e(s.target)}",
        ))
    else:
        cards.append(_card("Low-precision FLOPs", "-", "no FLOP estimates"))
    others = ", ".join(f"{e(p)} {c}" for p, c in counts.items() if p != s.target)
    cards.append(_card(
        "Nodes", f"{counts.get(s.target, 0)} / {s.nodes}", f"in {e(s.target)}" + (f"; {others}" if others else "")
    ))
    tc = [n for n in report.nodes if n.tensor_core is not None]
    if tc:
        cards.append(_card(
            "Tensor Core", f"{sum(1 for n in tc if n.tensor_core)} / {len(tc)}",
            "MatMul/Gemm/Conv nodes eligible (low precision, dims multiple of 8)",
        ))
    cards.append(_card("Casts", str(s.casts), f"{human_bytes(s.cast_bytes)} moved per run"))
    change = f"{(s.size_after - s.size_before) / s.size_before:+.0%}" if s.size_before else ""
    cards.append(_card(
        "Model size", f"{_nb(human_bytes(s.size_before))} &rarr; {_nb(human_bytes(s.size_after))}", change, "small"
    ))
    worst_cos, worst_err, nonfinite = worst_accuracy(report)
    if worst_cos is None:
        cards.append(_card("Output accuracy", "-", "not measured"))
    else:
        sub = f"max abs error {sci(worst_err.max_abs_error)} ({e(worst_err.name)}), " \
              f"{sci(worst_err.error_of_range)} of its range; {len(s.accuracy)} output(s)"
        if nonfinite:
            sub = "non-finite values in " + ", ".join(e(a.name) for a in nonfinite) + "; " + sub
        cards.append(_card(
            "Worst output cosine", cosine_str(worst_cos.cosine), sub, "bad" if nonfinite else "",
        ))
    if s.calibration_samples or s.model_runs:
        sub = [f"{s.model_runs} run(s) of the converted model"] if s.model_runs else []
        if s.pinned_by_tolerance:
            sub.append(f"{s.pinned_by_tolerance} node(s) pinned to fp32 by --tolerance")
        cards.append(_card("Calibration samples", str(s.calibration_samples), "; ".join(sub)))
    else:
        cards.append(_card("Calibration", "none", "ranges and per-node error need --calibration-data"))
    return '<section class="cards">' + "".join(cards) + "</section>"


# ---------------------------------------------------------------------------------------------- plots
def _legend_swatch(x: float, y: float, precision: str, label: str) -> str:
    return (
        f'<rect x="{_f(x)}" y="{_f(y - 9)}" width="11" height="11" rx="2" fill="{colour(precision)}"/>'
        f'<text x="{_f(x + 16)}" y="{_f(y)}">{label}</text>'
    )


def _share_plot(report: PrecisionReport) -> str:
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


def _ops_plot(report: PrecisionReport) -> str:
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


def _graph_plot(report: PrecisionReport) -> tuple[str, str]:
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
        f"({N} nodes)</text>"
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
    for p in present:
        out.append(_legend_swatch(x, 18, p, e(p)))
        x += 72
    if errors and any(not math.isfinite(v) for _, v, _ in pts):
        out.append(f'<rect x="{_f(x)}" y="9" width="11" height="11" fill="{BAD_COLOUR}"/>'
                   f'<text x="{_f(x + 16)}" y="18">non-finite</text>')
    svg = (
        f'<svg class="plot" id="plot-graph" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
        f'aria-label="{what} along the graph">{"".join(out)}</svg>'
    )
    return svg, caption


# ---------------------------------------------------------------------------------------------- table
def _num(v: float | None, text: str, cls: str = "") -> str:
    dv = "" if v is None else (repr(float(v)) if isinstance(v, float) else str(v))
    return f'<td class="n {cls}" data-v="{dv}">{text}</td>'


_SHORT_DTYPES = {"float16": "f16", "bfloat16": "bf16", "float32": "f32", "float": "f32", "float64": "f64",
                 "double": "f64", "int64": "i64", "int32": "i32", "int8": "i8", "uint8": "u8"}


def _dtypes(dtypes: list[str]) -> str:
    """'float16, float16' -> 'f16 f16' (the full names are in the cell's title)."""
    return " ".join(e(_SHORT_DTYPES.get(d.lower(), d)) for d in dtypes) or "-"


def _op_breaks(op_type: str) -> str:
    """Long CamelCase op names may break between words: 'Layer<wbr>Normalization'."""
    text = e(op_type)
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "<wbr>", text) if len(op_type) > 12 else text


def _table(report: PrecisionReport, rows: list[tuple[int, NodeReport]]) -> str:
    graphs = len({n.graph for n in report.nodes}) > 1
    ranges, errors = has_ranges(report), has_errors(report)
    heads = [("#", "num")] + ([("graph", "str")] if graphs else []) + [
        ("node", "str"), ("op", "str"), ("precision", "str"), ("rule and reason", "str"),
        ("dtypes", "str"), ("FLOPs", "num"), ("bytes", "num"), ("TC", "str"),
        ("casts", "num"),
    ]
    if ranges:
        heads += [("range", "num"), ("absmax", "num"), ("underflow", "num")]
    if errors:
        heads += [("rel L2", "num"), ("max abs", "num"), ("added", "num")]
    out = ['<table id="nodes"><thead><tr>']
    out += [f'<th data-type="{t}">{h}</th>' for h, t in heads]
    out.append("</tr></thead><tbody>")
    for i, n in rows:
        cells = [_num(i, str(i))]
        if graphs:
            cells.append(f"<td>{e(n.graph)}</td>")
        tc = "" if n.tensor_core is None else ("yes" if n.tensor_core else "no")
        casts = len(n.casts_in) + len(n.casts_out)
        dtypes = ", ".join(n.input_dtypes) + " -> " + ", ".join(n.output_dtypes)
        cast_names = "; ".join([f"in: {c}" for c in n.casts_in] + [f"out: {c}" for c in n.casts_out])
        cells += [
            f'<td class="name">{e(n.name)}</td>',
            f'<td class="op">{_op_breaks(n.op_type)}' + (f' <span class="dom">{e(n.domain)}</span>' if n.domain not in ("", "ai.onnx") else "") + "</td>",
            f'<td><span class="badge" style="background:{colour(n.precision)}">{e(n.precision)}</span></td>',
            f'<td class="rule"><code>{e(n.rule)}</code><div class="reason">{e(n.reason)}</div></td>',
            f'<td class="dt" title="{e(dtypes)}">{_dtypes(n.input_dtypes)} &rarr; {_dtypes(n.output_dtypes)}</td>',
            _num(n.flops, human_count(n.flops)),
            _num(n.bytes, human_bytes(n.bytes)),
            f'<td title="{e(n.tensor_core_note)}">{tc or "-"}</td>',
            f'<td class="n" data-v="{casts}" title="{e(cast_names)}">'
            + (f"{len(n.casts_in)} / {len(n.casts_out)}" if casts else "-") + "</td>",
        ]
        if ranges:
            r = n.range
            cells += [
                _num(r and r.min, f"{short_num(r.min)} &hellip; {short_num(r.max)}" if r else "-", "wrap"),
                _num(r and r.absmax, short_num(r.absmax) if r else "-"),
                _num(r and r.underflow_share, pct(r.underflow_share) if r else "-"),
            ]
        if errors:
            er = n.error
            cells += [
                _num(er and er.rel_l2, sci(er.rel_l2) if er else "-"),
                _num(er and er.max_abs, sci(er.max_abs) if er else "-"),
                _num(er and er.added, sci(er.added) if er else "-"),
            ]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


# ---------------------------------------------------------------------------------------------- page
_CSS = """
:root{--fg:#1d2433;--muted:#5b6475;--line:#e3e6ec;--card:#f6f7f9}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);
 margin:0 auto;padding:20px 20px 40px;max-width:1400px}
h1{font-size:22px;margin:0 0 2px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:var(--muted);margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px}
.card-title{font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:var(--muted)}
.card-value{font-size:23px;font-weight:600;margin:2px 0;overflow-wrap:anywhere}
.card-sub{font-size:12.5px;color:var(--muted);overflow-wrap:break-word}
.card.small .card-value{font-size:19px;line-height:30px}
.card.bad{border-color:#d62828;background:#fdecec}.card.bad .card-value{color:#d62828}
.warnings{background:#fff6e0;border:1px solid #f0d28a;border-radius:8px;padding:8px 14px;margin-top:12px}
.plots{display:flex;flex-wrap:wrap;gap:16px;margin-top:8px}
figure{margin:0;border:1px solid var(--line);border-radius:8px;padding:10px 12px;flex:1 1 540px;min-width:0}
figure.wide{flex-basis:100%}
figcaption{font-size:12.5px;color:var(--muted);margin-top:4px;max-width:1140px}
figure h3{font-size:14px;margin:0 0 6px}
svg.plot{display:block;max-width:100%;height:auto;font-size:12px;fill:var(--fg)}
svg .grid{stroke:#eceef2;stroke-width:1}svg .axis,svg .tick{stroke:#8a93a3;stroke-width:1}
svg .span{stroke:#c5cad3;stroke-width:1}svg .tl{fill:var(--muted);font-size:11px}
svg .lbl{font-size:12px}svg .inbar{fill:#fff;font-size:11.5px;font-weight:600}
svg .note{fill:var(--muted);font-style:italic}svg .mark{font-size:11px;font-weight:700}
ol.worst{margin:4px 0 0;padding-left:0;list-style:none}
.tablewrap{overflow-x:auto;border:1px solid var(--line);border-radius:8px}
table{border-collapse:collapse;font-size:12px;width:100%}
th,td{padding:4px 5px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:var(--card);position:sticky;top:0;white-space:nowrap}
.js th{cursor:pointer}.js th:hover{background:#e9ecf1}
th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
td.n{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}td.wrap{white-space:normal;min-width:5em}
td.name{min-width:11em;max-width:24em;overflow-wrap:anywhere}td.rule{min-width:10em;max-width:17em}.reason{color:var(--muted);font-size:11.5px}
td.dt{white-space:nowrap}td.op{overflow-wrap:break-word;max-width:10em}.dom{color:var(--muted);font-size:11px}
.badge{color:#fff;border-radius:4px;padding:0 6px;font-weight:600;font-size:11.5px}
code{font-size:12px}#filter{margin:0 0 8px;padding:4px 8px;width:320px;font:inherit}
.jsonly{display:none}.js .jsonly{display:inline}
footer{color:var(--muted);font-size:12px;margin-top:18px}
"""

_JS = """
document.body.classList.add('js');
(function(){
 var t=document.getElementById('nodes'),f=document.getElementById('filter');if(!t)return;
 var tb=t.tBodies[0];f.hidden=false;
 f.addEventListener('input',function(){var q=f.value.toLowerCase();
  for(var r of tb.rows){r.hidden=q&&r.textContent.toLowerCase().indexOf(q)<0;}});
 t.tHead.rows[0].addEventListener('click',function(ev){
  var th=ev.target.closest('th');if(!th)return;var c=th.cellIndex,num=th.dataset.type==='num';
  var dir=th.classList.contains('desc')?1:-1;if(!num&&!th.classList.length)dir=1;
  for(var h of t.tHead.rows[0].cells)h.classList.remove('asc','desc');th.classList.add(dir>0?'asc':'desc');
  function key(r){var d=r.cells[c],v=d.dataset.v;if(!num)return d.textContent;
   if(v===undefined||v==='')return -Infinity;v=parseFloat(v);return isNaN(v)?Infinity:v;}
  var rows=Array.from(tb.rows).map(function(r){return [key(r),r];});
  rows.sort(function(a,b){return a[0]<b[0]?-dir:a[0]>b[0]?dir:0;});
  for(var p of rows)tb.appendChild(p[1]);});
})();
"""

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def render_html(
    report: PrecisionReport,
    *,
    sort: str = "cost",
    op: str | Iterable[str] | None = None,
    precision: str | Iterable[str] | None = None,
) -> str:
    """The page. The cards and plots describe the whole model; sort/op/precision order and select the
    rows of the node table."""
    s = report.summary
    rows = select_nodes(report, sort=sort, op=op, precision=precision)
    share = _share_plot(report)
    ops = _ops_plot(report)
    graph_svg, graph_caption = _graph_plot(report)
    title = f"Precision report: {report.model}" if report.model else "Precision report"
    warnings = ""
    if report.warnings:
        warnings = '<section class="warnings"><strong>Warnings</strong><ul>' + "".join(
            f"<li>{e(w)}</li>" for w in report.warnings
        ) + "</ul></section>"
    along = "Per-layer error along the graph" if has_errors(report) else "FLOPs along the graph"
    table_note = f"{len(rows)} of {len(report.nodes)} nodes; {e(filter_note(op, precision, sort))}."
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{e(title)}</h1>",
        f'<p class="sub">{e(s.target)} for {e(s.provider)} &middot; {s.nodes} nodes &middot; '
        f"report schema version {report.schema_version}</p></header>",
        _cards(report),
        warnings,
        "<h2>Where the FLOPs run</h2>",
        '<section class="plots">',
        f"<figure><h3>Share of FLOPs per precision</h3>{share}</figure>",
        f"<figure><h3>FLOPs by op type</h3>{ops}</figure>" if ops else "",
        f'<figure class="wide"><h3>{along}</h3>{graph_svg}<figcaption>{graph_caption}</figcaption></figure>',
        "</section>",
        "<h2>Nodes</h2>",
        f'<p class="sub">{table_note}<span class="jsonly"> Click a column header to sort.</span></p>',
        '<input id="filter" type="search" placeholder="filter rows (node, op, rule, ...)" hidden>',
        f'<div class="tablewrap">{_table(report, rows)}</div>',
        f"<footer>amp-compiler precision report &middot; schema version {report.schema_version}</footer>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
