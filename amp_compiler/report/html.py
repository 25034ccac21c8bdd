"""The report as one self-contained HTML file: summary cards, inline SVG plots, the node table.

No network: no external scripts, fonts, stylesheets or images (a Content-Security-Policy in the page
forbids them), the plots are SVG (:mod:`amp_compiler.report.html_plots`). Every model-provided string
goes through html.escape (``e``). The table is sortable by clicking a header (a few lines of inline
JS); without JS it is a plain table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from amp_compiler.report.common import (
    cosine_str,
    filter_note,
    has_errors,
    has_ranges,
    human_bytes,
    human_count,
    nodes_by_precision,
    pct,
    sci,
    select_nodes,
    short_num,
    worst_accuracy,
)
from amp_compiler.report.html_plots import colour, e, graph_plot, ops_plot, share_plot
from amp_compiler.report.model import NodeReport, PrecisionReport
from amp_compiler.schemas import is_onnx_domain


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
    if worst_cos is None or worst_err is None:
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
        notes = [f"{s.model_runs} run(s) of the converted model"] if s.model_runs else []
        if s.pinned_by_tolerance:
            notes.append(f"{s.pinned_by_tolerance} node(s) pinned to fp32 by --tolerance")
        cards.append(_card("Calibration samples", str(s.calibration_samples), "; ".join(notes)))
    else:
        cards.append(_card("Calibration", "none", "ranges and per-node error need --calibration-data"))
    return '<section class="cards">' + "".join(cards) + "</section>"


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
            f'<td class="op">{_op_breaks(n.op_type)}'
            + ("" if is_onnx_domain(n.domain) else f' <span class="dom">{e(n.domain)}</span>') + "</td>",
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
                _num(r.min if r else None, f"{short_num(r.min)} &hellip; {short_num(r.max)}" if r else "-", "wrap"),
                _num(r.absmax if r else None, short_num(r.absmax) if r else "-"),
                _num(r.underflow_share if r else None, pct(r.underflow_share) if r else "-"),
            ]
        if errors:
            er = n.error
            cells += [
                _num(er.rel_l2 if er else None, sci(er.rel_l2) if er else "-"),
                _num(er.max_abs if er else None, sci(er.max_abs) if er else "-"),
                _num(er.added if er else None, sci(er.added) if er else "-"),
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
    share = share_plot(report)
    ops = ops_plot(report)
    graph_svg, graph_caption = graph_plot(report)
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
