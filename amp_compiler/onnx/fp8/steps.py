"""The FP8 conversion's own steps around the FP16 pipeline: opset, per-layer choice, Q/DQ, decisions.

    FP32 model -> opset raised to 19, 22 with a BF16 fallback (amp_compiler.onnx.load.opset) -> FP8
    candidates (MatMul/Gemm/Conv) with their scales (amp_compiler.onnx.fp8.scales) -> statistics on the
    calibration samples -> choice per GEMM -> [the FP16 (BF16) pipeline runs] -> Q/DQ before the
    chosen GEMMs' inputs (passes/fp8.py) -> decisions say fp8 and why

Guarantees: a conversion to FP8 without calibration samples is refused (an :class:`OptionError`); a
model whose opset onnx's version converter cannot raise is refused with one line; every
candidate GEMM's decision carries its statistics (rule ``fp8.gemm`` or ``fp8.kept-fp16``), every
other Tensor Core op in the fallback precision says why it takes no FP8 inputs (``fp8.no-qdq``), and
every inserted Q/DQ node has its own decision (``fp8.qdq``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from amp_compiler.core.decision import NodeDecision
from amp_compiler.core.fp8_choice import LocalChoice
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import RANGE_ONLY_RULES, Rule
from amp_compiler.dtypes import short_name
from amp_compiler.errors import OptionError
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.onnx.fp8.budget import within_budget
from amp_compiler.onnx.fp8.scales import percentile_amax
from amp_compiler.onnx.fp8.stats import fp8_candidates, fp8_choice, measure_candidates
from amp_compiler.onnx.ir.walk import node_order
from amp_compiler.onnx.load.external_data import plan_external_reads, read_external
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.options import ConvertOptions, Fp8Calibration
from amp_compiler.passes.onnx.qdq import Fp8Candidate, QuantizeGemmInputsPass
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.runtime.runner import Runner, default_runner
from amp_compiler.sizes import format_bytes
from amp_compiler.targets import Target

_FALLBACKS = {short_name(Target.FP16.dtype), short_name(Target.BF16.dtype)}  # precisions of GEMMs kept out of FP8
_RANGE_RULES = frozenset(r.value for r in RANGE_ONLY_RULES)


__all__ = ["Fp8Plan", "fp8_decisions", "fp8_flop_share", "local_choice", "lower_fp8", "plan_fp8", "require_samples",
           "weights_in_memory"]


# Probe models are serialized whole to run: protobuf's limit, less room for the probes' own nodes.
_PROBE_LIMIT = 2**31 - 2**26


def weights_in_memory(model: onnx.ModelProto, origin: str) -> onnx.ModelProto:
    """A copy of ``model`` (whose external tensors lie in the folder of the model file ``origin``)
    with every weight read into it: the FP32 model the statistics' probes run. The conversion itself
    keeps reading the weights from disk. Refused with one line when the weights exceed what a
    probe can hold (protobuf's 2 GiB)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    pending, _ = plan_external_reads(out, Path(origin).parent, origin, itself=Path(origin))
    total = out.ByteSize() + sum(read.length for read in pending)
    if total > _PROBE_LIMIT:
        raise OptionError(
            f"fp8 runs the FP32 model on the calibration data with its weights in memory, serialized whole "
            f"(protobuf's 2 GiB limit): this model takes {format_bytes(total)}", option="target",
        )
    read_external(pending, origin)
    return out


def require_samples(samples: Sequence[dict[str, np.ndarray]] | None) -> list[dict[str, np.ndarray]]:
    """The calibration samples, or an :class:`OptionError`: FP8 scales cannot be chosen blind."""
    if not samples:
        raise OptionError(
            "an FP8 conversion needs calibration data: its scales and per-layer choice come from "
            "observed values", option="calibration_data",
        )
    return list(samples)


@dataclasses.dataclass
class Fp8Plan:
    """The per-layer choice, made on the FP32 model before the FP16 pipeline runs."""

    chosen: list[Fp8Candidate]
    reasons: dict[int, tuple[bool, str]]  # id(GEMM node) -> (FP8?, why)
    skipped: dict[int, str] = dataclasses.field(default_factory=dict)  # id(MatMul/Gemm/Conv) -> why no candidate


def plan_fp8(
    ir_model: ir.Model, proto: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    ranges: dict[str, TensorRange] | None, opts: ConvertOptions, runner: Runner | None,
) -> tuple[Fp8Plan, dict[str, TensorRange]]:
    """Candidates, their statistics on ``samples`` and the choice (see module doc); the ranges
    (collected from the samples unless given)."""
    runner, owned = default_runner(runner)
    try:
        ranges = ranges if ranges is not None else collect_ranges(proto, samples, runner=runner)
        skipped: dict[int, str] = {}
        if opts.fp8_nodes is not None:  # chosen by --tolerance (amp_compiler.onnx.tolerance.refine)
            candidates = _candidates(ir_model, proto, samples, ranges, opts, runner, skipped)
            position = {id(node): i for i, node in enumerate(node_order(ir_model))}
            given = dict(opts.fp8_nodes)
            chosen = [c for c in candidates if position[id(c.node)] in given]
            return Fp8Plan(chosen, {id(c.node): (True, given[position[id(c.node)]]) for c in chosen}, skipped), ranges
        passed, local = local_choice(ir_model, proto, samples, ranges, opts, runner, skipped)
        chosen, budgeted = within_budget(proto, passed, local, samples, runner, opts.fp8_budget,
                                         metric=opts.metric, holdout=opts.holdout)
    finally:
        if owned:
            runner.close()
    in_fp8 = {id(c.node) for c in chosen}
    reasons = {node: (node in in_fp8, budgeted.get(node, choice.reason)) for node, choice in local.items()}
    return Fp8Plan(chosen, reasons, skipped), ranges


def local_choice(
    ir_model: ir.Model, proto: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    ranges: dict[str, TensorRange], opts: ConvertOptions, runner: Runner, skipped: dict[int, str],
) -> tuple[list[Fp8Candidate], dict[int, LocalChoice]]:
    """The candidates whose local statistics allow FP8 inputs, and every candidate's choice by them
    (by ``id`` of its node); ``skipped`` receives why the other MatMul/Gemm/Conv nodes are no candidates."""
    candidates = _candidates(ir_model, proto, samples, ranges, opts, runner, skipped)
    stats = measure_candidates(proto, candidates, samples, runner)
    local = {id(c.node): fp8_choice(c, stat, opts.fp8_max_error, opts.fp8_max_subnormal)
             for c, stat in zip(candidates, stats, strict=True)}
    return [c for c in candidates if local[id(c.node)].allowed], local


def _candidates(
    ir_model: ir.Model, proto: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    ranges: dict[str, TensorRange], opts: ConvertOptions, runner: Runner, skipped: dict[int, str],
) -> list[Fp8Candidate]:
    """The candidates with their scales in the fallback type; with percentile calibration their
    activations' amax is that percentile of |x| (one more run per sample). ``skipped`` receives why
    the other main-graph MatMul/Gemm/Conv nodes are none."""
    low = opts.low_target
    candidates = fp8_candidates(ir_model, ranges, opts.fp8_margin, low=low, skipped=skipped)
    if Fp8Calibration.parse(opts.fp8_calibration) is not Fp8Calibration.PERCENTILE:
        return candidates
    names = sorted({i.name for c in candidates for i in c.inputs if i.weight is None})
    amax = percentile_amax(proto, names, samples, runner, opts.fp8_percentile, low)
    how = f"{opts.fp8_percentile:g}th percentile of |x|"
    return fp8_candidates(ir_model, ranges, opts.fp8_margin, low=low, amax=amax, calibration=how)


def lower_fp8(ir_model: ir.Model, plan: Fp8Plan) -> QuantizeGemmInputsPass:
    """Q/DQ before the chosen GEMMs (after the FP16 lowering); returns the pass, which knows what it did."""
    lowering = QuantizeGemmInputsPass(plan.chosen)
    lowering(ir_model)
    return lowering


def fp8_decisions(
    decisions: list[NodeDecision], ir_model: ir.Model, plan: Fp8Plan, lowering: QuantizeGemmInputsPass,
    policy: PolicyTable | None = None,
) -> list[NodeDecision]:
    """``decisions`` (one per node of the lowered model, in node order) with the FP8 GEMMs, the GEMMs
    kept in the fallback type by their statistics, the inserted Q/DQ nodes, and the other Tensor Core
    ops in the fallback type (rule ``fp8.no-qdq``: the policy table's ``fp8_reason``, or why a
    MatMul/Gemm/Conv was no candidate) explained."""
    policy = policy or default_table()
    quantized = {id(n) for n in lowering.quantized}
    order = node_order(ir_model)
    if len(order) != len(decisions):
        raise AssertionError(f"{len(decisions)} decisions for {len(order)} nodes")
    out = []
    for node, d in zip(order, decisions, strict=True):
        qdq = lowering.inserted.get(id(node))
        if qdq is not None:
            what = "weight stored in FP8, dequantized" if qdq.weight else "quantized to FP8 E4M3 and dequantized"
            d = dataclasses.replace(
                d, precision="fp8", rule=Rule.FP8_QDQ.value,
                reason=f"input {qdq.index} of {qdq.gemm.name or qdq.gemm.op_type}: {what} (Q/DQ for its FP8 inputs)",
            )
        elif id(node) in quantized:
            d = dataclasses.replace(d, precision="fp8", rule=Rule.FP8_GEMM.value, reason=plan.reasons[id(node)][1])
        elif d.rule in _RANGE_RULES:
            pass  # kept out of the fallback type by its range (BF16 or FP32 under --range-fallback): that rule says why
        elif id(node) in plan.reasons and not plan.reasons[id(node)][0] and d.precision in _FALLBACKS:
            d = dataclasses.replace(d, rule=Rule.FP8_KEPT.value, reason=plan.reasons[id(node)][1])
        elif d.precision in _FALLBACKS and id(node) not in plan.reasons:
            why = _not_fp8(node, policy, plan)
            if why is not None:
                d = dataclasses.replace(d, rule=Rule.FP8_NO_QDQ.value, reason=why)
        out.append(d)
    return out


def _not_fp8(node: ir.Node, policy: PolicyTable, plan: Fp8Plan) -> str | None:
    """Why a Tensor Core op in the fallback type takes no FP8 inputs (None: not a Tensor Core op)."""
    entry = policy.get(node.domain, node.op_type)
    if entry is None or not entry.tensor_core:
        return None
    if not entry.fp8_inputs:
        return entry.fp8_reason or "no FP8 inputs for this op: it runs in the fallback precision"
    why = plan.skipped.get(id(node))
    if why is None:
        why = "it is inside a subgraph (If, Loop or Scan body), and FP8 candidates are main-graph GEMMs"
    return f"no FP8 candidate: {why}; it runs in the fallback precision"


def fp8_flop_share(result: ConversionResult) -> float:
    """The share of the converted model's Tensor Core FLOPs (estimated at the sizes the options fix, else
    at the calibration data's: what ``--tolerance`` states its share at) that run on FP8 inputs."""
    costs = estimate(result.model, result.input_shapes or result.sample_shapes or None)
    policy = default_table()
    total = fp8 = 0
    for d, cost in zip(result.decisions, costs.nodes, strict=False):
        if policy.is_tensor_core(d.domain, d.op_type):
            total += cost.flops
            fp8 += cost.flops if d.precision == "fp8" else 0
    return fp8 / total if total else 0.0
