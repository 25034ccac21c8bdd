"""The FX pipeline: capture with torch.export, analyse with the shared passes, lower casts into the graph.

    capture (torch.export, in-place ops made functional) -> observed ranges (the FP32 graph on the
    example inputs or calibration samples: fx/graph/ranges.py; convert) -> precision graph -> analysis
    (classify, constant and observed ranges, paint, min-cut: amp_compiler.passes.analysis.pipeline)
    -> lower (cast nodes, parameter storage) -> fake-tensor check -> report (with the overflow and
    weight-scale warnings)

The entries (:func:`amp_compiler.fx.convert`, ``prepare_training``, the compile backend, FP8) run
these steps; the report a conversion attaches to its GraphModule is read back with :func:`report`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx as fx
from torch._dispatch.python import enable_python_dispatcher
from torch._guards import detect_fake_mode
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from amp_compiler.core.graph import SlotKind
from amp_compiler.core.plan import PrecisionPlan
from amp_compiler.errors import OptionError
from amp_compiler.fx.graph.flops import graph_flops
from amp_compiler.fx.graph.input_scale import weight_scale_warnings
from amp_compiler.fx.graph.lower import lower_plan, short
from amp_compiler.fx.graph.policy import AtenPolicy, default_policy
from amp_compiler.fx.graph.precision_graph import FxPrecisionGraph, build_fx_precision_graph
from amp_compiler.fx.graph.ranges import ObservedRanges, overflow_warnings
from amp_compiler.fx.graph.report import FxReport, node_decisions, state_bytes
from amp_compiler.fx.graph.rewrite import fold_batchnorm, functionalize_inplace, own_written_state
from amp_compiler.fx.graph.views import is_float
from amp_compiler.passes.analysis import compile_patterns
from amp_compiler.passes.analysis.pipeline import AnalysisSettings, check_placement, plan_precisions
from amp_compiler.passes.analysis.raw_offsets import raw_offset_warnings
from amp_compiler.targets import Provider, Target

__all__ = [
    "FX_RANGE_FALLBACKS", "REPORT_KEY", "AmpInternalError", "Captured", "capture", "capture_for_inference",
    "refresh_meta", "report", "transform",
]

REPORT_KEY = "amp_compiler"
#: What an FX conversion may give the Tensor Core ops only FP16's range keeps out of FP16 (``transform``).
FX_RANGE_FALLBACKS = ("bf16", "fp32")


class AmpInternalError(RuntimeError):
    """The converted graph does not compute in the precisions the plan chose (a bug in amp-compiler)."""


def capture(
    model: torch.nn.Module,
    example_inputs: tuple,
    example_kwargs: dict | None = None,
    *,
    dynamic_shapes: Any = None,
    strict: bool = False,
) -> fx.GraphModule:
    """The model as an ATen-level GraphModule (``torch.export``), with in-place ops made functional
    where that is safe, in the mode ``model`` was captured in (``training``). Parameters and buffers
    are shared with ``model`` (capturing does not modify it; running the graph writes the buffers its
    forward writes, as the model would: a training step updates the model's batch-norm statistics)."""
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    ep = torch.export.export(model, example_inputs, example_kwargs, dynamic_shapes=dynamic_shapes, strict=strict)
    gm = ep.module()
    # ExportedProgram.module() says "training" whatever the model's mode (and refuses train()/eval():
    # the graph is fixed): the flags say the mode the graph was captured in.
    for module in gm.modules():
        module.training = model.training
    functionalize_inplace(gm)
    return gm


@dataclasses.dataclass
class Captured:
    """A model captured for inference: the graph, its parameters' bytes before conversion, and a
    sentence per node rewritten on the way (the convolutions a batch norm was folded into)."""

    gm: fx.GraphModule
    bytes_before: int
    notes: dict[str, str]


def capture_for_inference(
    model: torch.nn.Module, example_inputs: tuple, example_kwargs: dict | None, *, dynamic_shapes: Any, fold_bn: bool,
) -> Captured:
    """:func:`capture`, with its own copies of the parameters and buffers its forward writes (the
    converted module never changes ``model``; the rest stays shared), then (with ``fold_bn``)
    eval-mode batch norms folded into the convolutions they read, in FP32, as ``torch.onnx.export``
    does."""
    gm = capture(model, example_inputs, example_kwargs, dynamic_shapes=dynamic_shapes)
    own_written_state(gm)
    before = state_bytes(gm)
    folded = fold_batchnorm(gm) if fold_bn else []
    notes = {f.conv: f"batch_norm {f.batch_norm!r} was folded into its weight and bias (in FP32)" for f in folded}
    return Captured(gm, before, notes)


def _fake_inputs(gm: fx.GraphModule) -> list:
    return [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]


def transform(
    gm: fx.GraphModule,
    target: Target | str = Target.FP16,
    *,
    mode: str = "inference",
    block_ops: Iterable[str] = (),
    block_nodes: Iterable[str] = (),
    policy: AtenPolicy | None = None,
    constant_sources: dict | None = None,
    unchecked_constants: Iterable[fx.Node] = (),
    fake_inputs: list | None = None,
    parameter_bytes_before: int | None = None,
    notes: dict[str, str] | None = None,
    placement: str = "mincut",
    observed: ObservedRanges | None = None,
    range_fallback: str = "fp32",
) -> FxReport:
    """Convert ``gm`` in place to mixed precision and return the report.

    ``mode``: ``"inference"`` stores parameters in low precision where every use is low precision;
    ``"training"`` and ``"compile"`` keep parameters as they are and cast them at use.
    ``constant_sources``: nodes holding parameters/buffers (default: the float ``get_attr`` nodes).
    ``notes``: node name -> a sentence appended to that node's reason (rewrites made before).
    ``placement``: ``"mincut"`` re-decides painting's free choices to move the fewest cast bytes
    (the ONNX path's default), ``"paint"`` keeps painting's answer.
    ``observed``: the FP32 graph's activation ranges (:mod:`amp_compiler.fx.graph.ranges`), which keep
    FP32 what overflows or underflows the target (the ONNX path's probe and calibration rules); with
    none observed (``observed.skipped``), a warning says the ranges were not checked.
    ``range_fallback``: ``"bf16"`` runs the matrix products and convolutions only FP16's range keeps out
    of FP16 (a range rule pinned them) in BF16, not FP32 (:class:`~amp_compiler.passes.analysis.RangeFallbackPass`);
    ``"fp32"`` keeps them FP32.
    """
    target = Target.parse(target) if isinstance(target, str) else target
    if target is Target.FP8:
        raise OptionError(
            "target fp8 chooses its FP8 layers from calibration samples: use convert(model, inputs, "
            "target='fp8', calibration=[...]) for inference or prepare_training(..., target='fp8')",
            option="target",
        )
    policy = policy or default_policy()
    block_ops = frozenset(block_ops)
    unknown = sorted(op for op in block_ops if policy.get(op) is None and not hasattr(torch.ops.aten, op))
    if unknown:
        raise OptionError(f"unknown ATen op(s): {', '.join(unknown)}", option="block_ops")
    patterns = compile_patterns(block_nodes)
    check_placement(placement)
    if range_fallback not in FX_RANGE_FALLBACKS:
        raise OptionError(f"unknown range fallback {range_fallback!r}: expected bf16 or fp32", option="range_fallback")

    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    output_names: list[str] = []  # as captured, before casts feed the outputs
    fx.node.map_arg(gm.graph.output_node().args, lambda n: output_names.append(n.name))
    bytes_before = state_bytes(gm) if parameter_bytes_before is None else parameter_bytes_before
    sources = dict(constant_sources) if constant_sources is not None else None
    fxg = build_fx_precision_graph(
        gm,
        target,
        policy,
        constant_sources=sources,
        unchecked_constants=set(unchecked_constants),
        table_lookups=(mode == "inference"),
    )
    # The ONNX path's analysis; no kernel coverage nor runtime hazards (they read ONNX ops).
    seen = observed if observed is not None and observed.ranges else None  # ranges to read, if any
    settings = AnalysisSettings(
        target, Provider.CUDA, block_ops, patterns, placement=placement, kernel_coverage=False, runtime_hazards=False,
        ranges=seen.ranges if seen else None, ranges_generated=seen.generated if seen else False,
        ranges_seen=seen.seen if seen else "", range_fallback=range_fallback,
    )
    plan = plan_precisions(fxg.graph, settings)
    scale_warnings = _scale_warnings(gm, fxg, plan, target, observed, sources)  # before lowering swaps weights
    lowering = lower_plan(gm, fxg, plan, store_low=(mode == "inference"))
    fake = fake_inputs if fake_inputs is not None else _fake_inputs(gm)
    _check(gm, fxg, lowering, fake)
    decisions = node_decisions(
        gm, fxg, plan, lowering, order, training=(mode == "training"),
        weight_placeholders={n for n in (sources or ()) if n.op == "placeholder"},
    )
    for d in decisions:
        if notes and d.node in notes:
            d.reason = f"{d.reason}; {notes[d.node]}"
    warnings = [
        f"{op.name}: {op.op_type} is not in the ATen policy table; it stays FP32"
        for op in fxg.graph.unknown_ops
        if op.domain == "aten" and op in fxg.graph.node_vertices
    ]
    warnings[:0] = scale_warnings
    if seen is not None:
        warnings.extend(overflow_warnings(fxg, plan, lowering.slot_dtypes, seen))
    if observed is not None and observed.skipped:
        warnings.append(
            f"activation ranges were not checked ({observed.skipped}): a tensor beyond {target.value.upper()}'s "
            "range becomes inf or NaN with no rule keeping it FP32; pass calibration=[samples] to observe them"
        )
    report = FxReport(
        target=target.value,
        mode=mode,
        decisions=decisions,
        casts_inserted=len(lowering.casts),
        stored_low={k: short(v.after) for k, v in lowering.stored.items()},
        parameter_bytes_before=bytes_before,
        parameter_bytes_after=state_bytes(gm),
        warnings=warnings,
        output_names=output_names,
        flops=graph_flops(gm, policy),
        ranges_from=seen.seen if seen else "",
        range_runs=seen.runs if seen else 0,
    )
    gm.meta[REPORT_KEY] = report
    return report


def _scale_warnings(gm: fx.GraphModule, fxg: FxPrecisionGraph, plan: PrecisionPlan, target: Target,
                    observed: ObservedRanges | None, sources: dict | None) -> list[str]:
    """The ONNX path's weight-scale and raw-offset warnings (:mod:`amp_compiler.fx.graph.input_scale`,
    :func:`~amp_compiler.passes.analysis.raw_offsets.raw_offset_warnings`) where no value
    of the user's data was seen (ranges from the example inputs, or none), as the ONNX path gives them
    with the range probe's ranges or none; none for the graph-level entries (``observed`` not given)."""
    if observed is None or (observed.ranges and not observed.generated):
        return []
    low = {node for node, vid in fxg.main_vertex.items() if plan.decisions[vid].dtype == target.dtype}
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder" and is_float(n) and n not in (sources or {})]
    offsets = raw_offset_warnings(fxg.graph, plan, {n.name for n in inputs})  # an offset a first bias may cancel
    return [*offsets, *weight_scale_warnings(gm, inputs, target.max, low.__contains__)]


class _FakeProp(FakeTensorProp):
    """FakeTensorProp that also reads parameters and buffers as fake tensors, so in-place ops in the
    graph (a BatchNorm's ``num_batches_tracked += 1``) never touch the real ones.

    They are faked with static shapes, as ``torch.export`` traced them: a fake mode with the export's
    shape environment otherwise gives every dim of a parameter a fresh symbol (an Embedding's weight
    became ``(s93, s70)``), and a kernel that reads a parameter's size (``aten.lstm``'s ``numel()``
    of its flat weights) then refused the symbolic sizes: a BF16 Embedding -> LSTM model crashed."""

    def get_attr(self, target, args, kwargs):
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
            cache = self.__dict__.setdefault("_fakes", {})
            if target not in cache:
                cache[target] = self._mode.from_tensor(value, static_shapes=True)
            return cache[target]
        return value


def refresh_meta(gm: fx.GraphModule, fake: list | None = None) -> bool:
    """Re-run the graph on fake tensors (default: its placeholders' traced values), refreshing every
    node's ``meta["val"]``; False when there are no fake inputs to run it on.

    It runs under the Python dispatcher, as ``torch.export`` traced the graph: composite ops then take
    their symbolic-aware decompositions (``aten.lstm``'s C++ kernel calls ``numel()`` on its input,
    which a symbolic batch refuses: a BF16 LSTM converted with a dynamic batch crashed here)."""
    fake = fake if fake is not None else _fake_inputs(gm)
    if not fake or any(v is None for v in fake):
        return False
    mode = detect_fake_mode(fake)
    if mode is None:
        return False
    with enable_python_dispatcher():
        _FakeProp(gm, mode).propagate_dont_convert_inputs(*fake)
    return True


def _check(gm: fx.GraphModule, fxg: FxPrecisionGraph, lowering, fake: list) -> None:
    """Re-run the graph on fake tensors (refreshing ``meta["val"]``) and check every tensor a node
    produces has the dtype the plan gave it."""
    if not refresh_meta(gm, fake):
        return
    wrong = []
    for slot in fxg.slots:
        if slot.kind is not SlotKind.NODE_OUT:
            continue
        want = lowering.slot_dtypes[slot]
        val = slot.tensor.meta.get("val")
        got = val.dtype if isinstance(val, torch.Tensor) else None
        if got is not None and got != want:
            wrong.append(f"{slot.tensor.name}: planned {short(want)}, computes {short(got)}")
    if wrong:
        raise AmpInternalError("converted graph differs from the plan: " + "; ".join(wrong[:10]))


def report(gm: fx.GraphModule) -> FxReport:
    """The report :func:`convert` (or a training step, or the compile backend) attached to ``gm``."""
    rep = getattr(gm, "meta", {}).get(REPORT_KEY)
    if rep is None:
        raise ValueError("this GraphModule was not converted by amp_compiler.fx")
    return rep
