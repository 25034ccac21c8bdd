"""The ONNX conversion pipeline and its public entry point, :func:`convert`.

    frontend (types, precision graph) -> classify -> constant ranges -> paint -> lower -> cleanup
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
from collections.abc import Iterable
from pathlib import Path

import onnx
import onnx.shape_inference
import onnx_ir as ir

from amp_compiler import schemas
from amp_compiler.errors import OptionError
from amp_compiler.graph import (
    PrecisionGraph,
    Slot,
    SlotKind,
    build_precision_graph,
    is_constant,
    iter_graphs,
)
from amp_compiler.costs import element_counts
from amp_compiler.onnx.deferred import DeferredModel, defer_ir_tensors
from amp_compiler.onnx.files import load_model_deferred
from amp_compiler.onnx.output import DeferredOutput as _DeferredOutput
from amp_compiler.onnx.output import output_proto as _output_proto
from amp_compiler.onnx.save import check_output_path, save_ir_model, save_model
from amp_compiler.onnx.typing import checked_typed_ir as _checked_typed_ir
from amp_compiler.passes import (
    CalibrationRangePass,
    compile_patterns,
    ClassifyPass,
    ConstantRangePass,
    KernelCoveragePass,
    LowerPlanPass,
    MinCutPlacementPass,
    PadTensorCoresPass,
    PaintPass,
    RemoveCancellingCastsPass,
)
from amp_compiler.plan import PrecisionPlan, Rule
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.report.model import TensorRange
from amp_compiler.targets import Provider, Target

_SHORT = {
    ir.DataType.FLOAT: "fp32",
    ir.DataType.FLOAT16: "fp16",
    ir.DataType.BFLOAT16: "bf16",
    ir.DataType.DOUBLE: "fp64",
}


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """What to convert to and what to leave alone.

    ``block_ops``: op types kept in FP32. ``block_nodes``: regular expressions searched in node
    names; matching nodes are kept in FP32. A blocked node wins over the policy table; a dtype fixed
    by the schema or the model wins over both.
    """

    target: Target = Target.FP16
    provider: Provider = Provider.CUDA
    keep_io_types: bool = True
    block_ops: frozenset[str] = frozenset()
    block_nodes: tuple[str, ...] = ()
    # Nodes kept FP32 by the --tolerance refinement: (position in node_order(), reason).
    pinned_nodes: tuple[tuple[int, str], ...] = ()
    # "mincut": re-decide painting's free choices to move the fewest cast bytes; "paint": painting only.
    placement: str = "mincut"
    # Pad low-precision MatMul/Gemm/Conv weights to multiples of 8 with zeros and Slice back (exact).
    pad_tensor_cores: bool = False
    # Graph input shapes for the cast-cost model, where the model's dims are dynamic (--input-shape):
    # ((name, (dim, ...)), ...). The output keeps its dynamic dims.
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()


@dataclasses.dataclass(slots=True)  # no __dict__: a conversion makes one per node
class NodeDecision:
    """The precision decided for one node, and why."""

    graph: str  # "main" or the path of the subgraph ("If_0/then_branch")
    node: str
    op_type: str
    domain: str
    precision: str  # "fp16", "bf16", "fp32", "mixed", or "none" for nodes without float data
    rule: str  # stable rule id, e.g. "policy.low"
    reason: str
    input_dtypes: list[str]
    output_dtypes: list[str]
    index: int | None = None  # position in the input model's node order; None for inserted Casts


@dataclasses.dataclass
class ConversionResult:
    model: onnx.ModelProto
    decisions: list[NodeDecision]
    casts_inserted: int
    constants_converted: int
    options: ConvertOptions
    cast_bytes_painting: int | None = None  # bytes Casts would move as painted (shapes as inferred)
    cast_bytes: int | None = None  # bytes the placed Casts move

    # Set when the input kept its large weights on disk (a path or a DeferredModel with external
    # data): the converted IR, written by save() with its weights in a data file; ``model`` builds
    # the ModelProto, with every weight inside it, only when it is asked for.
    output: _DeferredOutput | None = dataclasses.field(default=None, repr=False, compare=False)

    def decisions_by_rule(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for d in self.decisions:
            counts[d.rule] = counts.get(d.rule, 0) + 1
        return counts

    def save(
        self, path: str | os.PathLike, *, input_files: Iterable[str | os.PathLike] = (), force: bool = False
    ) -> Path | None:
        """Write the converted model to ``path``, refusing to overwrite ``input_files`` (the input
        model, then its external data; ``force`` allows the model file itself).

        A model converted from one with external data is written the same way: its initializers of
        1 KiB or more go to ``<path>.data`` beside it, one tensor at a time (weights never all in
        memory, and no 2 GiB protobuf limit). Returns that data file, or None for a single file.
        """
        files = [Path(f) for f in input_files]
        if self.output is not None:
            return save_ir_model(
                self.output.ir_model, path, self.output.to_proto, input_files=files, force=force
            )
        check_output_path(path, files, force=force)
        save_model(self.model, path, input_path=None if force or not files else files[0])
        return None



def _result_model(self: ConversionResult) -> onnx.ModelProto:
    if self._model is None and self.output is not None:
        self._model = self.output.materialize()
    return self._model


def _set_result_model(self: ConversionResult, model: onnx.ModelProto | None) -> None:
    self._model = model


# ``model`` is a field (positional first argument, in repr and ==) read through a property, so that
# a deferred conversion builds its ModelProto only when asked.
ConversionResult.model = property(_result_model, _set_result_model, doc="The converted ModelProto.")


def _gc_paused(func):
    """Run ``func`` with Python's cyclic garbage collector paused (and restored after).

    A conversion allocates millions of long-lived objects (the IR, the precision graph); each full
    collection walks all of them, which made converting a 100,000-node graph twice as slow. What a
    conversion leaves behind is freed by reference counting, or by the next collection after it.
    """

    @functools.wraps(func)
    def paused(*args, **kwargs):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return paused


@_gc_paused
def convert(
    model: onnx.ModelProto | str | os.PathLike,
    options: ConvertOptions | None = None,
    *,
    policy: PolicyTable | None = None,
    ranges: dict[str, TensorRange] | None = None,
    **overrides,
) -> ConversionResult:
    """Convert an FP32 ONNX model to mixed precision.

    ``model`` is an ``onnx.ModelProto``, a path, or a :class:`~amp_compiler.onnx.deferred.DeferredModel`.
    A model file with external data is read lazily: its large weights stay on disk and are read one
    at a time when needed, and :meth:`ConversionResult.save` writes the result with external data.
    ``options`` (or keyword overrides of its fields, e.g. ``target="bf16"``) choose the target,
    provider and user overrides. ``ranges`` (from :func:`amp_compiler.calibrate.collect_ranges`) adds
    the calibration rules. Returns the converted model with the per-node decisions. The input model
    is not modified.
    """
    opts = _options(options, overrides)
    policy = policy or default_table()
    _check_block_ops(opts.block_ops, policy)
    patterns = compile_patterns(opts.block_nodes)
    deferred = load_model_deferred(model, check=False) if isinstance(model, (str, os.PathLike)) else model
    if isinstance(deferred, DeferredModel):
        proto, locations, checked, origin = deferred.model, deferred.locations, deferred.checked, str(deferred.files[0])
    else:
        proto, locations, checked, origin = deferred, {}, False, "model"
        if not isinstance(proto, onnx.ModelProto):
            raise TypeError(f"expected an onnx.ModelProto or a path, got {type(proto).__name__}")

    ir_model = _checked_typed_ir(proto, origin, deferred=bool(locations), check=not checked)
    if locations:
        defer_ir_tensors(ir_model, locations)
    graph = build_precision_graph(ir_model, opts.target, policy, keep_io_types=opts.keep_io_types)
    plan = PrecisionPlan()
    nodes = node_order(ir_model)
    pinned = {nodes[i]: why for i, why in opts.pinned_nodes if i < len(nodes)}
    analyses = [ClassifyPass(opts.provider, opts.block_ops, patterns, pinned), ConstantRangePass(opts.target)]
    analyses.insert(1, KernelCoveragePass(opts.provider))  # right after classification
    if ranges:
        analyses.append(CalibrationRangePass(ranges, opts.target))
    analyses.append(PaintPass())
    if opts.placement == "mincut":
        analyses.append(MinCutPlacementPass(_element_counts(proto, opts.input_shapes)))
    elif opts.placement != "paint":
        raise OptionError(f"unknown placement {opts.placement!r}: expected mincut or paint")
    for analysis in analyses:
        analysis(graph, plan)
    lower = LowerPlanPass(graph, plan)
    lower(ir_model)
    RemoveCancellingCastsPass()(ir_model)
    pad = PadTensorCoresPass() if opts.pad_tensor_cores else None
    if pad is not None:
        pad(ir_model)
    positions = {id(node): i for i, node in enumerate(nodes)}
    decisions = _node_decisions(graph, plan, ir_model, {id(c.node): c for c in lower.casts}, positions)
    if pad is not None:
        pad.explain(decisions, node_order(ir_model))
    # decisions: one per node of the output; nodes: of the input
    n_casts = sum(1 for d in decisions if d.op_type == "Cast") - sum(1 for n in nodes if n.op_type == "Cast")
    output = _DeferredOutput(ir_model, proto) if locations else None
    return ConversionResult(
        None if output else _output_proto(ir_model, proto), decisions, n_casts,
        len(lower.converted_constants), opts, plan.cast_bytes_painting, plan.cast_bytes_final, output,
    )


def node_order(model: ir.Model) -> list[ir.Node]:
    """Every node of every graph, in the order decisions are reported (and ``pinned_nodes`` counts)."""
    return [node for g in iter_graphs(model.graph) for node in g]


def _element_counts(proto: onnx.ModelProto, input_shapes) -> dict[str, int] | None:
    if not input_shapes:
        return None
    try:
        return element_counts(proto, dict(input_shapes))
    except ValueError as exc:
        raise OptionError(str(exc)) from None


def _options(options: ConvertOptions | None, overrides: dict) -> ConvertOptions:
    opts = options or ConvertOptions()
    if not overrides:
        return opts
    fields = {f.name for f in dataclasses.fields(ConvertOptions)}
    unknown = set(overrides) - fields
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    if isinstance(overrides.get("target"), str):
        overrides["target"] = Target.parse(overrides["target"])
    if isinstance(overrides.get("provider"), str):
        overrides["provider"] = Provider.parse(overrides["provider"])
    for key in ("block_ops",):
        if key in overrides:
            overrides[key] = frozenset(overrides[key])
    for key in ("block_nodes", "pinned_nodes"):
        if key in overrides:
            overrides[key] = tuple(overrides[key])
    if isinstance(overrides.get("input_shapes"), dict):
        overrides["input_shapes"] = tuple((k, tuple(v)) for k, v in overrides["input_shapes"].items())
    return dataclasses.replace(opts, **overrides)


def _check_block_ops(ops: Iterable[str], policy: PolicyTable) -> None:
    known = policy.op_names()
    unknown = sorted(op for op in ops if op not in known and not schemas.lookup("", op, 100))
    if unknown:
        raise OptionError(f"--block-op: unknown op type(s): {', '.join(unknown)}")



def _dtype_names(values) -> list[str]:
    """Per value: "fp16", "int64", ... ("" for an absent optional value, "?" for an unknown type)."""
    names = []
    for value in values:
        if value is None:
            names.append("")
            continue
        vtype = value.type
        if vtype is None:
            names.append("?")
        elif isinstance(vtype, ir.TensorType):
            dtype = vtype.dtype
            short = _SHORT.get(dtype)
            names.append(short if short is not None else dtype.name.lower())
        else:
            names.append(str(vtype))
    return names


def _user_name(slot) -> str:
    if slot.kind is SlotKind.GRAPH_OUT:
        return f"graph output {slot.index}"
    return slot.owner.name or slot.owner.op_type


def _node_decisions(
    graph: PrecisionGraph, plan: PrecisionPlan, model: ir.Model, inserted: dict, positions: dict
) -> list[NodeDecision]:
    paths = {id(model.graph): "main"}
    out: list[NodeDecision] = []
    decisions, notes = plan.decisions, plan.notes
    rule_ids = {rule: rule.value for rule in Rule}
    for g in iter_graphs(model.graph):
        gpath = paths.get(id(g), "?")
        node_vertices, slot_vertex = graph.node_vertices, graph.slot_vertex
        for node in g:
            attributes = node.attributes.data  # the dict under the UserDict: iterates at C speed
            for name, attr in attributes.items() if attributes else ():
                subs = [attr.value] if attr.type == ir.AttributeType.GRAPH else (
                    list(attr.value) if attr.type == ir.AttributeType.GRAPHS else []
                )
                for k, sub in enumerate(subs):
                    suffix = f"{name}" if len(subs) == 1 else f"{name}[{k}]"
                    paths[id(sub)] = f"{gpath}/{node.name or node.op_type}/{suffix}"
            vids = node_vertices.get(node)
            main = None
            if vids and len(vids) == 1:
                main = vids[0]
            elif vids:  # a node without vertices has no slots
                for kind, values in ((SlotKind.NODE_OUT, node.outputs), (SlotKind.NODE_IN, node.inputs)):
                    for i in range(len(values)):
                        vid = slot_vertex.get(Slot(kind, node, i))
                        if vid is not None:
                            main = vid
                            break
                    if main is not None:
                        break
            if main is None:
                if id(node) in inserted:
                    cast = inserted[id(node)]
                    users = ", ".join(sorted({_user_name(s) for s in cast.users}))
                    precision, rule, reason = (
                        _SHORT.get(cast.to, cast.to.name.lower()),
                        "lowering.cast",
                        f"Cast inserted: {users} need(s) {cast.source.name!r} as {_SHORT.get(cast.to)}",
                    )
                elif node.op_type == "Constant" and node.outputs and is_constant(node.outputs[0]):
                    dtype = node.outputs[0].dtype
                    precision, rule, reason = (
                        _SHORT[dtype] if dtype in _SHORT else "none",
                        "constant",
                        "constant: converted offline for the precision its users need",
                    )
                else:
                    precision, rule, reason = "none", "nonfloat", "no float inputs or outputs"
            else:
                decision = decisions[main]
                if len(vids) == 1 or len({decisions[v].dtype for v in vids}) == 1:
                    precision = _SHORT.get(decision.dtype) or decision.dtype.name.lower()
                else:
                    precision = "mixed"
                rule, reason = rule_ids[decision.rule], decision.reason
                if main in notes:
                    reason = f"{reason}; {notes[main]}"
            out.append(
                NodeDecision(
                    gpath, node.name or "", node.op_type, node.domain or "ai.onnx", precision, rule, reason,
                    _dtype_names(node.inputs), _dtype_names(node.outputs), positions.get(id(node)),
                )
            )
    return out
