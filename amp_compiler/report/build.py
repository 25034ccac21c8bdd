"""Build a :class:`PrecisionReport` from a conversion and what was measured around it."""

from __future__ import annotations

import dataclasses
from collections import Counter

import onnx

from amp_compiler.core.decision import untyped_message
from amp_compiler.core.plan import INSERTED_RULES, Rule
from amp_compiler.dtypes import LOW_PRECISIONS
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.policy import PolicyTable
from amp_compiler.report.model import (
    NodeError,
    NodeReport,
    OutputAccuracy,
    PrecisionReport,
    Summary,
    TensorRange,
)

__all__ = ["build_report"]

CAST_RULE = Rule.LOWERING_CAST.value
_INSERTED = frozenset(rule.value for rule in INSERTED_RULES)


def _first_float_output(node: onnx.NodeProto, ranges: dict[str, TensorRange]) -> TensorRange | None:
    """The range of the node's first output that has one, as the report shows it: without the histogram
    and the channel peaks range scaling chose from (what it chose is in the reasons)."""
    for name in node.output:
        if name in ranges:
            return dataclasses.replace(ranges[name], binades=(), channel_peaks=None)
    return None


def build_report(
    fp32: onnx.ModelProto,
    result: ConversionResult,
    *,
    model_name: str,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    ranges: dict[str, TensorRange] | None = None,
    node_errors: dict[int, NodeError] | None = None,
    accuracy: list[OutputAccuracy] | None = None,
    samples: int = 0,
    model_runs: int = 0,
    pinned: int = 0,
    tolerance: float | None = None,
    warnings: list[str] | None = None,
    policy: PolicyTable | None = None,
    accuracy_not_measured: str = "",
    generated_dims: dict[str, int] | None = None,
    accuracy_on: dict[str, str] | None = None,
) -> PrecisionReport:
    """One NodeReport per node of the converted model, with costs, casts, ranges and errors
    (``policy``: the table the conversion used, which says which ops are Tensor Core ops).
    ``accuracy_not_measured``: why there is no accuracy ("" when measured); ``generated_dims``: the
    values the random inputs' dynamic dims took; ``accuracy_on``: per output, the kind of generated
    sample its accuracy is from (the range probe's image models)."""
    costs = estimate(result.model, input_shapes, policy)
    ranges = ranges or {}
    node_errors = node_errors or {}
    fp32_main = list(fp32.graph.node)
    decisions = result.decisions

    # Which Casts were inserted, and whom they feed / read from (by output and input names).
    cast_names = {}
    produced_by_cast: dict[str, str] = {}
    final_nodes = [n for g in iter_proto_graphs(result.model.graph) for n in g.node]
    for d, node in zip(decisions, final_nodes, strict=False):
        if d.rule == CAST_RULE:
            cast_names[id(node)] = node.name
            produced_by_cast[node.output[0]] = node.name
    read_by_cast: dict[str, list[str]] = {}
    for node in final_nodes:
        if id(node) in cast_names:
            read_by_cast.setdefault(node.input[0], []).append(node.name)

    reports: list[NodeReport] = []
    for d, node, cost in zip(decisions, final_nodes, costs.nodes, strict=False):
        original = fp32_main[d.index] if d.index is not None and d.index < len(fp32_main) else None
        reports.append(
            NodeReport(
                graph=d.graph,
                name=d.node,
                op_type=d.op_type,
                domain=d.domain,
                precision=d.precision,
                rule=d.rule,
                reason=d.reason,
                input_dtypes=d.input_dtypes,
                output_dtypes=d.output_dtypes,
                flops=cost.flops,
                bytes=cost.bytes,
                tensor_core=cost.tensor_core,
                tensor_core_note=cost.tensor_core_note,
                casts_in=[
                    produced_by_cast[i] for i in node.input if i in produced_by_cast and id(node) not in cast_names
                ],
                casts_out=[c for o in node.output for c in read_by_cast.get(o, []) if id(node) not in cast_names],
                range=_first_float_output(original, ranges) if original is not None else None,
                error=node_errors.get(d.index) if d.index is not None else None,
                inserted=d.rule in _INSERTED,
            )
        )

    low = result.options.target.value
    compute = [r for r in reports if not r.inserted]
    casts = [r for r in reports if r.rule == CAST_RULE]
    summary = Summary(
        target=low,
        provider=result.options.provider.value,
        nodes=len(compute),
        nodes_by_precision=dict(sorted(Counter(r.precision for r in compute).items())),
        flops_total=sum(r.flops or 0 for r in compute),
        # every low precision (an FP8 conversion's FP16 GEMMs, an FP16 one's BF16 range fallbacks), as the FX report's
        flops_low=sum(r.flops or 0 for r in compute if r.precision in LOW_PRECISIONS),
        casts=len(casts),
        cast_bytes=sum(r.bytes or 0 for r in casts),
        size_before=fp32.ByteSize(),
        size_after=result.model.ByteSize(),
        accuracy=list(accuracy or []),
        calibration_samples=samples,
        model_runs=model_runs,
        pinned_by_tolerance=pinned,
        tolerance=tolerance,
        untyped_nodes=len(result.untyped_nodes),
        accuracy_not_measured=accuracy_not_measured,
        accuracy_on=dict(accuracy_on or {}),
        generated_dims=dict(generated_dims or {}),
    )
    notes = list(warnings or []) + list(result.provider_warnings)
    if result.fused_split:
        notes.append(result.fused_split)
    if result.untyped_nodes:
        notes.append(untyped_message(result.untyped_nodes))
    if costs.assumed:
        notes.append(
            "dynamic dims taken as 1 for cost estimates: " + ", ".join(costs.assumed)
            + " (fix them with --input-shape NAME:DIMxDIM...)"
            + (f"; and {costs.underived} dim(s) inside the graph that onnx's shape inference could not derive from them"
               if costs.underived else "")
        )
    elif costs.underived:
        notes.append(f"{costs.underived} dim(s) inside the graph taken as 1 for cost estimates: onnx's shape "
                     "inference could not derive them from the inputs'")
    unknown = sorted({r.op_type for r in reports if r.rule == Rule.UNKNOWN_OP.value})
    if unknown:
        notes.append("ops unknown to the policy table, kept FP32 with casts: " + ", ".join(unknown))
    return PrecisionReport(model=model_name, summary=summary, nodes=reports, warnings=notes)
