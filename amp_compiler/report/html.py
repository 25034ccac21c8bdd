"""The report as one self-contained HTML file: summary cards, inline SVG plots, the rules, the node table.

No network: no external scripts, fonts, stylesheets or images (a Content-Security-Policy in the page
forbids them), the plots are SVG (:mod:`amp_compiler.report.html_plots`). Every model-provided string
goes through html.escape (``e``). The table is sortable by clicking a header (a few lines of inline
JS); without JS it is a plain table. A reason shared by several rows is written once, under its
rule in the "Rules" section; a row shows its rule id (a link there) and only a reason of its own.
Below 700 px (a phone) each row is a block (node, op, precision, rule) and the numbers sit behind a
checkbox; plots keep their size and scroll sideways instead of shrinking their text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from amp_compiler.policy.schemas import is_onnx_domain
from amp_compiler.report.common import (
    changed_share,
    changed_text,
    cosine_str,
    filter_note,
    has_errors,
    has_ranges,
    human_bytes,
    human_count,
    nodes_by_precision,
    pct,
    rows_note,
    sci,
    select_nodes,
    short_num,
    worst_accuracy,
    worst_changed,
)
from amp_compiler.report.html_plots import colour, e, graph_plot, ops_plot, share_plot
from amp_compiler.report.model import NodeReport, PrecisionReport

__all__ = ["render_html"]


# ---------------------------------------------------------------------------------------------- cards
def _sizes(before: int, after: int) -> str:
    """'820 &rarr; 540 kB' when both sizes have one unit, else '820 kB &rarr; 1.20 MB'."""
    a, b = human_bytes(before), human_bytes(after)
    (na, _, ua), (nb, _, ub) = a.partition(" "), b.partition(" ")
    if ua == ub:
        return f"{na} &rarr; {nb}&nbsp;{ub}"
    return f"{a.replace(' ', '&nbsp;')} &rarr; {b.replace(' ', '&nbsp;')}"


def _card(title: str, value: str, sub: str = "", cls: str = "") -> str:
    """One summary card; its value never wraps (a narrow card shows it shortened, whole in its tooltip)."""
    plain = re.sub(r"<[^>]+>", "", value).replace("&nbsp;", " ").replace("&rarr;", "->")
    return (
        f'<div class="card {cls}"><div class="card-title">{title}</div>'
        f'<div class="card-value" title="{plain}">{value}</div><div class="card-sub">{sub}</div></div>'
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
    inserted = sum(1 for n in report.nodes if n.inserted)
    cards.append(_card(
        "Nodes", f"{counts.get(s.target, 0)} / {s.nodes}",
        f"of the model's nodes in {e(s.target)}" + (f"; {others}" if others else "")
        + (f" (and {inserted} inserted Cast{'s' if inserted > 1 else ''})" if inserted else ""),
    ))
    tc = [n for n in report.nodes if n.tensor_core is not None]
    if tc:
        cards.append(_card(
            "Tensor Core", f"{sum(1 for n in tc if n.tensor_core)} / {len(tc)}",
            "MatMul/Gemm/Conv nodes eligible (low precision, dims multiple of 8)",
        ))
    cards.append(_card("Casts", str(s.casts), f"{human_bytes(s.cast_bytes)} moved per run"))
    change = f"{(s.size_after - s.size_before) / s.size_before:+.0%}" if s.size_before else ""
    cards.append(_card("Model size", _sizes(s.size_before, s.size_after), change, "small"))
    worst_cos, worst_err, nonfinite = worst_accuracy(report)
    labels = worst_changed(report)
    if labels is not None and labels.changed is not None:
        from amp_compiler.onnx.measure.output_error import misses

        exact = sum(1 for a in s.accuracy if a.exact)
        cards.append(_card("Changed labels", changed_share(labels.changed_share or 0.0),
                           f"{e(labels.name)}: {changed_text(labels.changed, labels.values)} differ from FP32; "
                           f"{exact} integer output(s)", "bad" if misses(labels) else ""))
    if (worst_cos is None or worst_err is None) and labels is None:
        cards.append(_card("Output accuracy", "-", "not measured" + (
            f": {e(s.accuracy_not_measured)}" if s.accuracy_not_measured else "")))
    elif worst_cos is not None and worst_err is not None:
        sub = f"max abs error {sci(worst_err.max_abs_error)} ({e(worst_err.name)}), " \
              f"{sci(worst_err.error_of_range)} of its range; {len(s.accuracy)} output(s)"
        if nonfinite:
            sub = "non-finite values in " + ", ".join(e(a.name) for a in nonfinite) + "; " + sub
        cards.append(_card("Worst cosine", cosine_str(worst_cos.cosine), sub, "bad" if nonfinite else ""))
    if s.calibration_samples or s.model_runs:
        notes = [f"{s.model_runs} run(s) of the converted model"] if s.model_runs else []
        if s.pinned_by_tolerance:
            notes.append(f"{s.pinned_by_tolerance} node(s) pinned to fp32 by --tolerance")
        samples = f"{s.calibration_samples} sample{'s' if s.calibration_samples != 1 else ''}"
        cards.append(_card("Calibration", samples, "; ".join(notes)))
    else:
        cards.append(_card("Calibration", "none", "ranges and per-node error need --calibration-data"))
    return '<section class="cards">' + "".join(cards) + "</section>"


# ---------------------------------------------------------------------------------------------- table
def _num(v: float | None, text: str, cls: str = "") -> str:
    dv = "" if v is None else (repr(float(v)) if isinstance(v, float) else str(v))
    return f'<td class="n {cls}" data-v="{dv}">{text}</td>'


def _dtypes(dtypes: list[str]) -> str:
    """The element types as the decisions name them (:func:`amp_compiler.dtypes.short_name`: 'fp16 int64')."""
    return " ".join(e(d) for d in dtypes) or "-"


def _op_breaks(op_type: str) -> str:
    """Op names stay on one line ('LayerNormalization'); only very long ones may break between
    words ('SkipSimplified<wbr>LayerNormalization')."""
    text = e(op_type)
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "<wbr>", text) if len(op_type) > 24 else text


def _anchor(rule: str) -> str:
    return "rule-" + re.sub(r"[^A-Za-z0-9_.-]", "_", rule)


def shared_reasons(report: PrecisionReport) -> dict[str, list[tuple[str, int]]]:
    """Per rule id (most rows first), the reasons two or more rows share, with how many rows each."""
    counts: dict[str, dict[str, int]] = {}
    for n in report.nodes:
        by_reason = counts.setdefault(n.rule, {})
        by_reason[n.reason] = by_reason.get(n.reason, 0) + 1
    order = sorted(counts, key=lambda r: (-sum(counts[r].values()), r))
    return {r: sorted(((t, k) for t, k in counts[r].items() if k > 1), key=lambda x: -x[1]) for r in order}


def _rules(report: PrecisionReport, shared: dict[str, list[tuple[str, int]]]) -> str:
    out = ['<section class="rules"><dl>']
    for rule, reasons in shared.items():
        rows = sum(1 for n in report.nodes if n.rule == rule)
        out.append(f'<dt id="{_anchor(rule)}"><code>{e(rule)}</code> <span class="count">{rows} row(s)</span></dt>')
        if reasons:
            out += [f"<dd>{e(text)}" + (f' <span class="count">({k} rows)</span>' if len(reasons) > 1 else "") + "</dd>"
                    for text, k in reasons]
        else:
            out.append('<dd class="own">each row gives its own reason</dd>')
    out.append("</dl></section>")
    return "".join(out)


_NUMBER_COLUMNS = frozenset(
    {"FLOPs", "bytes", "TC", "casts", "range", "absmax", "underflow", "rel L2", "max abs", "added"}
)
Shared = dict[str, list[tuple[str, int]]]


def _table(report: PrecisionReport, rows: list[tuple[int, NodeReport]], shared: Shared) -> str:
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
    labels = [h for h, _ in heads]
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
            f'<td class="rule"><a href="#{_anchor(n.rule)}"><code>{e(n.rule)}</code></a>'
            + ("" if n.reason in {t for t, _ in shared.get(n.rule, ())} else f'<div class="reason">{e(n.reason)}</div>')
            + "</td>",
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
        out.append("<tr>" + "".join(_labelled(c, h) for c, h in zip(cells, labels, strict=True)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _labelled(cell: str, label: str) -> str:
    """A cell with its column's name (shown before it when rows are blocks, on a phone) and, for a
    number column, the class that the numbers checkbox shows or hides."""
    extra = f' data-label="{e(label)}"' + (' data-num="1"' if label in _NUMBER_COLUMNS else "")
    return cell.replace("<td", "<td" + extra, 1)


# ---------------------------------------------------------------------------------------------- page
_CSS = """
:root{--fg:#1d2433;--muted:#5b6475;--line:#e3e6ec;--card:#f6f7f9}
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;color:var(--fg);
 margin:0 auto;padding:20px 20px 40px;max-width:1400px}
h1{font-size:22px;margin:0 0 2px}h2{font-size:17px;margin:28px 0 8px}
.sub{color:var(--muted);margin:0 0 16px}
.cards{display:grid;grid-template-columns:repeat(8,1fr);gap:10px}
@media (max-width:1380px){.cards{grid-template-columns:repeat(4,1fr)}}
@media (max-width:700px){.cards{grid-template-columns:repeat(2,1fr);gap:8px}}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px;min-width:0}
.card-title{font-size:11.5px;text-transform:uppercase;letter-spacing:.03em;color:var(--muted);white-space:nowrap;
 overflow:hidden;text-overflow:ellipsis}
.card-value{font-size:21px;font-weight:600;margin:2px 0;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.card-sub{font-size:12.5px;color:var(--muted);overflow-wrap:anywhere}
.card.small .card-value{font-size:18px;line-height:29px}
.card.bad{border-color:#d62828;background:#fdecec}.card.bad .card-value{color:#d62828}
.warnings{background:#fff6e0;border:1px solid #f0d28a;border-radius:8px;padding:8px 14px;margin-top:12px}
.plots{display:flex;flex-wrap:wrap;gap:16px;margin-top:8px}
figure{margin:0;border:1px solid var(--line);border-radius:8px;padding:10px 12px;flex:1 1 440px;min-width:0;
 overflow-x:auto}
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
td.name{min-width:11em;max-width:24em;overflow-wrap:anywhere}td.rule{min-width:10em;max-width:20em}
.reason{color:var(--muted);font-size:11.5px;overflow-wrap:anywhere}td.rule a{color:inherit}
td.dt{white-space:nowrap}td.op{white-space:nowrap}.dom{color:var(--muted);font-size:11px}
.rules dl{margin:0;columns:2 480px;column-gap:24px}.rules dt{margin-top:6px;break-after:avoid}
.rules dd{margin:0 0 2px 14px;color:var(--muted);font-size:12.5px;overflow-wrap:anywhere;break-inside:avoid}
.count{color:var(--muted);font-size:11.5px}#shownums,label.nums{display:none}
.badge{color:#fff;border-radius:4px;padding:0 6px;font-weight:600;font-size:11.5px}
code{font-size:12px}#filter{margin:0 0 8px;padding:4px 8px;width:320px;font:inherit}
.jsonly{display:none}.js .jsonly{display:inline}
footer{color:var(--muted);font-size:12px;margin-top:18px}
@media (max-width:700px){
 body{padding:12px 10px 30px}
 figure{flex-basis:100%}svg.plot{max-width:none}
 #shownums{display:inline;margin:0 0 8px}label.nums{display:inline}
 #nodes thead{display:none}#nodes,#nodes tbody,#nodes tr{display:block}
 #nodes tr{padding:6px 8px;border-bottom:1px solid var(--line)}
 #nodes td{display:inline;border:0;padding:0 6px 0 0;min-width:0;max-width:none}
 #nodes td.rule{display:block}#nodes td[data-num]{display:none}
 #shownums:checked~.tablewrap #nodes td[data-num]{display:inline-block;white-space:nowrap}
 #nodes td[data-num]::before{content:attr(data-label) ": ";color:var(--muted)}
 #filter{display:block;width:100%}
}
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
    table_note = f"{len(rows)} of {e(rows_note(report))}; {e(filter_note(op, precision, sort))}."
    shared = shared_reasons(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<header><h1>{e(title)}</h1>",
        f'<p class="sub">{e(s.target)} for {e(s.provider)} &middot; {s.nodes} nodes'
        + (f" (+ {s.casts} inserted Cast{'s' if s.casts != 1 else ''})" if s.casts else "")
        + f" &middot; report schema version {report.schema_version}</p></header>",
        _cards(report),
        warnings,
        "<h2>Where the FLOPs run</h2>",
        '<section class="plots">',
        f"<figure><h3>Share of FLOPs per precision</h3>{share}</figure>",
        f"<figure><h3>FLOPs by op type</h3>{ops}</figure>" if ops else "",
        f'<figure class="wide"><h3>{along}</h3>{graph_svg}<figcaption>{graph_caption}</figcaption></figure>',
        "</section>",
        "<h2>Rules</h2>",
        '<p class="sub">Why nodes got their precision: each rule once, with the reasons its rows share '
        "(a row shows a reason only when it is its own).</p>",
        _rules(report, shared),
        "<h2>Nodes</h2>",
        f'<p class="sub">{table_note}<span class="jsonly"> Click a column header to sort.</span></p>',
        '<input type="checkbox" id="shownums"><label class="nums" for="shownums"> show the numbers</label>',
        '<input id="filter" type="search" placeholder="filter rows (node, op, rule, ...)" hidden>',
        f'<div class="tablewrap">{_table(report, rows, shared)}</div>',
        f"<footer>amp-compiler precision report &middot; schema version {report.schema_version}</footer>",
        f"<script>{_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p) + "\n"
