"""A model comparison (:class:`amp_compiler.onnx.compare.Comparison`) as text: a terminal table or JSON.

The terminal text fits 80 columns: a header line saying what ran where and on which inputs, one row
per output (a float output's cosine, error and argmax; an integer or bool output's changed values), the
worst float output's error under the metric and the largest share of changed values, then the nodes
where the error grows most with the rule that decided each, the first NaN/Inf, where the rules came
from, and warnings. JSON is the whole comparison, with its
``schema_version``, for CI.
"""

from __future__ import annotations

import json
import textwrap

from amp_compiler.onnx.compare import Comparison, NodeComparison, OutputComparison
from amp_compiler.report.common import changed_share, changed_text, clean, cosine_str, pct, sci
from amp_compiler.report.terminal import fit_middle, fit_op, fit_path, fit_rule

__all__ = ["FORMATS", "render_comparison"]

FORMATS = ("terminal", "json")


def render_comparison(comparison: Comparison, fmt: str = "terminal") -> str:
    """The comparison as ``"terminal"`` text or ``"json"``."""
    if fmt == "json":
        return json.dumps(comparison.to_dict(), indent=1) + "\n"
    if fmt == "terminal":
        return "\n".join(_terminal(comparison)) + "\n"
    raise ValueError(f"unknown comparison format {fmt!r}; expected one of {', '.join(FORMATS)}")


def _terminal(c: Comparison) -> list[str]:
    how = "exact FP16/BF16 emulation" if c.emulated else "its kernels"
    if c.tf32:
        how += ", FP32 matrix products' operands as TF32"
    inputs = "generated inputs" if c.generated_inputs else f"{c.samples} sample(s)"
    lines = textwrap.wrap(
        f"{c.converted} vs {c.fp32}: {c.provider} ({how}), {inputs}, {c.tensors_compared} tensors compared",
        80, subsequent_indent="  ",
    )
    lines += [
        "",
        f"{'output':<24} {'cosine':>10} {'max err/range':>14} {'NaN/Inf':>8} {'argmax':>8} {'changed':>8}",
    ]
    lines += [_output_row(o) for o in c.outputs]
    lines += textwrap.wrap(_worst(c), 80, subsequent_indent="  ")
    if c.growth:
        lines += ["", "where the error grows most (relative L2 error; growth over the node's inputs):",
                  f"{'#':>3} {'node':<20} {'op':<9} {'prec':<4} {'rel L2':>7} {'growth':>7} {'err/rng':>7}  rule"]
        lines += [_row(e) for e in c.growth]
    if c.first_nonfinite is not None:
        e = c.first_nonfinite
        lines.append("")
        lines += textwrap.wrap(
            f"first NaN/Inf: {e.op_type} {e.node!r} ({e.precision}), {e.nonfinite} value(s)"
            + (f": {e.rule}: {e.reason}" if e.rule else ""), 80, subsequent_indent="  ",
        )
    lines.append("")
    for text in (c.decisions, *(f"warning: {w}" for w in c.warnings)):
        lines += textwrap.wrap(text, 80, subsequent_indent="  ")
    return lines


def _output_row(o: OutputComparison) -> str:
    """A float output's cosine, error, NaN/Inf and argmax agreement; an integer/bool output's share of
    changed values (its other columns '-': a label's cosine says nothing)."""
    if o.changed is not None:
        return f"{fit_middle(o.name, 24):<24} {'-':>10} {'-':>14} {'-':>8} {'-':>8} {changed_share(o.changed):>8}"
    argmax = pct(o.argmax_agreement) if o.argmax_agreement is not None else "-"
    return (f"{fit_middle(o.name, 24):<24} {cosine_str(o.cosine):>10} {pct(o.error_of_range):>14} "
            f"{o.nonfinite:>8} {argmax:>8} {'-':>8}")


def _worst(c: Comparison) -> str:
    """The worst float output's error under the metric ('-' when there is no float output) and, with
    integer/bool outputs, the one whose values changed most: never 0 when a label changed."""
    floats = any(o.changed is None for o in c.outputs)
    line = f"worst output error ({c.metric}): {sci(c.error) if floats else '- (no float output)'}"
    exact = [o for o in c.outputs if o.changed is not None]
    if exact:
        o = max(exact, key=lambda o: o.changed or 0.0)
        line += f"; integer output {clean(o.name)}: {changed_text(o.changed_values, o.values)} changed"
    return line


def _row(e: NodeComparison) -> str:
    return (
        f"{e.position:>3} {fit_path(e.node, 20):<20} {fit_op(e.op_type, 9):<9} {e.precision:<4} "
        f"{sci(e.rel_l2):>7} {sci(e.growth):>7} {pct(e.error_of_range):>7}  {fit_rule(e.rule or '-', 15)}"
    )
