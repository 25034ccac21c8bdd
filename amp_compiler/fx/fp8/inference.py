"""``target="fp8"`` for inference on the FX path: FP8 E4M3 inputs for the matrix products whose
statistics allow it, everything else the FP16 path's.

    capture (FP32) -> candidates (fx/fp8_candidates.py) -> statistics and choice on the calibration
    samples (fx/fp8_stats.py) -> the FP16 pipeline (fx/convert.transform) -> the chosen GEMMs
    lowered to FP8 (fx/fp8_lower.py) -> decisions and report

Guarantees: without calibration samples, or with samples unlike the example inputs, one
:class:`OptionError`; every candidate's decision carries its statistics (rule ``fp8.gemm`` or
``fp8.kept-fp16``), every other Tensor Core op in FP16 the policy table's reason it is not FP8
(``fp8.kept-fp16``), every inserted quantizer ``fp8.qdq``; the report lists every node of the
returned graph, in order, with FLOPs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
import torch.fx._pytree as fx_pytree

from amp_compiler.core.decision import NodeDecision
from amp_compiler.core.plan import Rule
from amp_compiler.errors import OptionError
from amp_compiler.fx.fp8.candidates import FALLBACK, find_candidates
from amp_compiler.fx.fp8.lower import Fp8Lowering, lower_fp8
from amp_compiler.fx.fp8.numerics import fp8_gemm
from amp_compiler.fx.fp8.stats import Fp8Choice, choose
from amp_compiler.fx.graph.flops import graph_flops
from amp_compiler.fx.graph.lower import short
from amp_compiler.fx.graph.pipeline import REPORT_KEY, capture_for_inference, refresh_meta, transform
from amp_compiler.fx.graph.policy import AtenPolicy, default_policy, op_name, policy_name
from amp_compiler.fx.graph.ranges import calibration_ranges
from amp_compiler.fx.graph.report import FxReport, node_dtypes, state_bytes
from amp_compiler.options import ConvertOptions, check_fp8_options
from amp_compiler.passes.analysis import compile_patterns
from amp_compiler.sizes import format_bytes
from amp_compiler.targets import Target

__all__ = [
    "calibration_samples", "convert_fp8", "fp8_decisions", "fp8_options", "fp8_report", "graph_inputs", "redecide",
    "table_kept",
]


def _sample(s: Any, example: tuple, example_kwargs: dict) -> tuple[tuple, dict]:
    """A calibration sample as (args, kwargs): a tensor, a tuple of positional inputs, or an
    ``(args, kwargs)`` pair (a tuple and a dict, unless the example's own inputs are those)."""
    pair = isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], tuple) and isinstance(s[1], dict)
    example_pair = len(example) == 2 and isinstance(example[1], dict)
    if pair and not example_pair:
        return s[0], s[1]
    return (s if isinstance(s, tuple) else (s,)), {}


def _check_input(k: int, label: str, s: Any, e: Any, same_shapes: bool) -> None:
    if not isinstance(e, torch.Tensor):
        return
    if not isinstance(s, torch.Tensor) or s.dtype != e.dtype or s.ndim != e.ndim:
        got = f"{s.dtype} of rank {s.ndim}" if isinstance(s, torch.Tensor) else type(s).__name__
        raise OptionError(f"calibration sample {k}: {label} is {got}, the example's {e.dtype} of rank {e.ndim}",
                          option="calibration")
    if same_shapes and s.shape != e.shape:
        raise OptionError(f"calibration sample {k}: {label} has shape {tuple(s.shape)}, the example "
                          f"{tuple(e.shape)} (or capture with dynamic_shapes)", option="calibration")


def calibration_samples(
    calibration: Iterable[Any] | None, example: tuple, example_kwargs: dict | None = None, *, same_shapes: bool,
) -> list[tuple[tuple, dict]]:
    """The samples as ``(args, kwargs)`` pairs, given as the example was: a tuple of positional inputs
    (or one tensor), or an ``(args, kwargs)`` pair when the example has keyword inputs. Each is checked
    against the example (count, keywords, dtype, rank, and shape unless the capture has dynamic
    shapes); an :class:`OptionError` otherwise."""
    example_kwargs = example_kwargs or {}
    samples = [_sample(s, example, example_kwargs) for s in (calibration or ())]
    if not samples:
        raise OptionError(
            "an FP8 conversion needs calibration samples: its scales and per-layer choice come from observed "
            "values (calibration=[inputs, ...], each like example_inputs)", option="calibration",
        )
    for k, (args, kwargs) in enumerate(samples):
        if len(args) != len(example):
            raise OptionError(f"calibration sample {k} has {len(args)} inputs, the example {len(example)}",
                              option="calibration")
        if set(kwargs) != set(example_kwargs):
            want = ", ".join(sorted(example_kwargs)) or "none"
            raise OptionError(
                f"calibration sample {k} has keyword inputs {', '.join(sorted(kwargs)) or 'none'}, the example "
                f"{want} (give each sample as (args, kwargs), like example_inputs and example_kwargs)",
                option="calibration",
            )
        for i, (s, e) in enumerate(zip(args, example, strict=True)):
            _check_input(k, f"input {i}", s, e, same_shapes)
        for name, e in example_kwargs.items():
            _check_input(k, f"input {name!r}", kwargs[name], e, same_shapes)
    return samples


def graph_inputs(gm: fx.GraphModule, args: tuple, kwargs: dict) -> tuple:
    """``args`` and ``kwargs`` flattened to the graph's placeholders, as the module's own ``forward``
    flattens them (its pytree spec orders the keywords)."""
    info = getattr(gm.graph._codegen, "pytree_info", None)
    if info is None or info.in_spec is None:
        return (*args, *kwargs.values())
    return tuple(fx_pytree.tree_flatten_spec((args, kwargs), info.in_spec))


def fp8_options(margin: int, budget: float, max_error: float, max_subnormal: float) -> ConvertOptions:
    """The FP8 settings, checked as the ONNX path checks them (one :class:`OptionError` each)."""
    opts = ConvertOptions(target=Target.FP8, fp8_margin=margin, fp8_budget=budget, fp8_max_error=max_error,
                          fp8_max_subnormal=max_subnormal)
    check_fp8_options(opts)
    return opts


def convert_fp8(
    model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None, *, calibration: Iterable[Any] | None,
    opts: ConvertOptions, block_ops: Iterable[str] = (), block_nodes: Iterable[str] = (), dynamic_shapes: Any = None,
    fold_bn: bool = True, placement: str = "mincut", policy: AtenPolicy | None = None,
) -> fx.GraphModule:
    """:func:`amp_compiler.fx.convert` with ``target="fp8"`` (see module doc)."""
    policy = policy or default_policy()
    given = calibration_samples(calibration, example_inputs, example_kwargs, same_shapes=dynamic_shapes is None)
    block_ops, patterns = frozenset(block_ops), compile_patterns(block_nodes)
    captured = capture_for_inference(model, example_inputs, example_kwargs, dynamic_shapes=dynamic_shapes,
                                     fold_bn=fold_bn)
    gm = captured.gm
    samples = [graph_inputs(gm, args, kwargs) for args, kwargs in given]

    def blocked(node: fx.Node) -> bool:
        name = op_name(node.target)
        return (name is not None and policy_name(name) in block_ops) or any(p.search(node.name) for p in patterns)

    candidates = find_candidates(gm, policy, exclude=[n for n in gm.graph.nodes if blocked(n)])
    flops = graph_flops(gm, policy)
    tensor_core = sum(flops[n.name] for n in gm.graph.nodes if _is_tensor_core(n, policy))
    choice = choose(gm, candidates, samples, opts, tensor_core)
    # The FP16 rest's ranges, on the same samples: a GEMM they keep FP32 is not lowered to FP8 (skipped).
    observed = calibration_ranges(gm, samples)
    transform(gm, Target.FP16, mode="inference", block_ops=block_ops, block_nodes=block_nodes, policy=policy,
              parameter_bytes_before=captured.bytes_before, notes=captured.notes, placement=placement,
              observed=observed)
    lowering = lower_fp8(gm, choice.chosen)
    refresh_meta(gm)
    base: FxReport = gm.meta[REPORT_KEY]
    gm.meta[REPORT_KEY] = fp8_report(gm, base, choice, lowering, policy, opts)
    return gm


def redecide(node: fx.Node, old: NodeDecision | None, **changes: Any) -> NodeDecision:
    """``old`` (a new node's decision when None) with ``changes`` and the node's dtypes as they are now."""
    if old is None:
        old = NodeDecision(graph="main", node=node.name, op_type=str(node.target), domain="fx", precision="none",
                           rule=Rule.NONFLOAT.value, reason="", input_dtypes=[], output_dtypes=[], index=None)
    return dataclasses.replace(old, input_dtypes=node_dtypes(node, False), output_dtypes=node_dtypes(node, True),
                               **changes)


def fp8_decisions(gm: fx.GraphModule, base: FxReport, choice: Fp8Choice, lowering: Fp8Lowering,
                  policy: AtenPolicy, margin: int) -> list[NodeDecision]:
    """One decision per node of the lowered graph (see module doc)."""
    old = {d.node: d for d in base.decisions}
    out = []
    for node in gm.graph.nodes:
        d = old.get(node.name)
        if node in lowering.gemms:
            d = redecide(node, d, precision="fp8", rule=Rule.FP8_GEMM.value, reason=choice.reasons[node],
                          op_type="amp_compiler.fx.fp8_gemm")
        elif node in lowering.quantizers:
            cand, op = lowering.quantizers[node]
            d = redecide(node, d, op_type="amp_compiler.fx.quantize", domain="fx", precision="fp8",
                          rule=Rule.FP8_QDQ.value, reason=(
                              f"{op.arg} of {cand.node.name} quantized to FP8 E4M3: scale {float(op.scale):.3g} "
                              f"per tensor, its calibration amax {op.amax:.3g} times 2^{margin} over 448"))
        elif node in lowering.weights:
            cand, op = lowering.weights[node]
            how = "one scale per output channel" if op.axis is not None else "one scale per tensor"
            size = format_bytes(op.quantized.numel() if op.quantized is not None else 0)
            d = redecide(node, d, op_type="get_attr", domain="fx", precision="fp8",
                          rule=Rule.CONSTANT_STORED_LOW.value, reason=(
                              f"{op.arg} of {cand.node.name} stored in FP8 E4M3 "
                              f"({size}), quantized from its FP32 values with {how} "
                              "(amax / 448)"))
        elif node in lowering.scales:
            cand, op = lowering.scales[node]
            d = redecide(node, d, op_type="get_attr", domain="fx", precision="fp32", rule=Rule.CONSTANT.value,
                          reason=f"the FP32 scale(s) of {cand.node.name}'s FP8 {op.arg}")
        elif d is not None and d.precision == short(FALLBACK) and node in choice.reasons:
            d = redecide(node, d, rule=Rule.FP8_KEPT.value, reason=choice.reasons[node])
        elif d is not None and d.precision == short(FALLBACK) and (kept := table_kept(node, policy)):
            d = redecide(node, d, rule=Rule.FP8_KEPT.value, reason=f"{d.reason}; {kept}")
        else:
            d = redecide(node, d)
        out.append(d)
    return out


def table_kept(node: fx.Node, policy: AtenPolicy) -> str | None:
    """The policy table's reason an op stays in the fallback precision for fp8 (``fp8_kept``), if any."""
    name = op_name(node.target) if node.op == "call_function" else None
    return policy.info_of(policy_name(name)).fp8_kept if name is not None else None


def fp8_report(gm: fx.GraphModule, base: FxReport, choice: Fp8Choice, lowering: Fp8Lowering, policy: AtenPolicy,
               opts: ConvertOptions) -> FxReport:
    """The FP16 pipeline's report of ``gm`` with the FP8 lowering's changes."""
    stored = {k: v for k, v in base.stored_low.items() if k not in lowering.removed_attrs}
    stored.update({str(n.target): "fp8" for n in lowering.weights})
    return dataclasses.replace(
        base, target=Target.FP8.value, decisions=fp8_decisions(gm, base, choice, lowering, policy, opts.fp8_margin),
        stored_low=stored, parameter_bytes_after=state_bytes(gm), flops=graph_flops(gm, policy, gemms=(fp8_gemm,)),
        fp8_error=choice.total_error, fp8_budget=opts.fp8_budget, fp8_runs=choice.runs,
    )


def _is_tensor_core(node: fx.Node, policy: AtenPolicy) -> bool:
    """Whether ``node`` is an ATen op the policy marks a Tensor Core op."""
    name = op_name(node.target) if node.op == "call_function" else None
    entry = policy.get(policy_name(name)) if name is not None else None
    return entry is not None and entry.tensor_core
