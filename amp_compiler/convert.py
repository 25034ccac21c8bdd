"""The ONNX conversion pipeline and its public entry point, :func:`convert`.

    frontend (types, precision graph) -> classify -> constant ranges -> paint -> lower -> cleanup
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import onnx
import onnx.shape_inference
import onnx_ir as ir
from onnx_ir import serde

from amp_compiler import schemas
from amp_compiler.errors import OptionError
from amp_compiler.graph import SlotKind
from amp_compiler.onnx.precision_graph import OnnxPrecisionGraph, build_precision_graph
from amp_compiler.onnx.slots import Slot
from amp_compiler.onnx.walk import is_constant, iter_graphs
from amp_compiler import native_checks
from amp_compiler.costs import element_counts
from amp_compiler.dtypes import FLOAT_TYPES, short_name
from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx_io import (
    DeferredModel,
    DeferredTensor,
    check_model_contents,
    checker_input,
    checker_verdict,
    check_output_path,
    defer_ir_tensors,
    iter_proto_graphs,
    load_model_deferred,
    save_ir_model,
    save_model,
)
from amp_compiler.passes import (
    ConvertedConstant,
    compile_patterns,
    LowerPlanPass,
    PadTensorCoresPass,
    RemoveCancellingCastsPass,
)
from amp_compiler.pipeline import AnalysisSettings, check_placement, plan_precisions
from amp_compiler.plan import PrecisionPlan, Rule
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.report.model import TensorRange
from amp_compiler.targets import Provider, Target

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


@dataclasses.dataclass(eq=False)
class _DeferredOutput:
    """A conversion's IR whose unconverted weights are still on disk (DeferredTensor)."""

    ir_model: ir.Model
    original: onnx.ModelProto  # the input (weights deferred): its IR version and value_info names

    def to_proto(self, model: ir.Model | None = None) -> onnx.ModelProto:
        return _output_proto(model or self.ir_model, self.original)

    def materialize(self) -> onnx.ModelProto:
        """The ModelProto with every weight read into it (as the in-memory path builds it)."""
        swapped = []
        for g in self.ir_model.graphs():
            for value in g.initializers.values():
                tensor = value.const_value
                if isinstance(tensor, DeferredTensor):
                    swapped.append((value, tensor))
                    value.const_value = ir.Tensor(tensor.numpy(), name=tensor.name, doc_string=tensor.doc_string)
        try:
            return self.to_proto()
        finally:
            for value, tensor in swapped:
                value.const_value = tensor


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

    ``model`` is an ``onnx.ModelProto``, a path, or a :class:`~amp_compiler.onnx_io.DeferredModel`.
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
    check_placement(opts.placement)
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
    nodes = node_order(ir_model)
    pinned = {nodes[i]: why for i, why in opts.pinned_nodes if i < len(nodes)}
    elements = _element_counts(proto, opts.input_shapes) if opts.placement == "mincut" else None
    settings = AnalysisSettings(
        opts.target, opts.provider, opts.block_ops, patterns, pinned, ranges, opts.placement, elements
    )
    plan = plan_precisions(graph, settings)
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
    return element_counts(proto, dict(input_shapes))


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
        raise OptionError(f"unknown op type(s): {', '.join(unknown)}", option="block_ops")


def _checked_typed_ir(proto: onnx.ModelProto, origin: str, *, deferred: bool, check: bool) -> ir.Model:
    """The model as IR with every tensor's type inferred, after checking it (unless ``check`` is
    False: it was checked already) as :func:`~amp_compiler.onnx_io.check_model_valid` does.

    For models of ``CHILD_MIN_NODES`` nodes or more, onnx's checker and shape inference (C++, about
    a second each at 100,000 nodes) run in a child process (:mod:`amp_compiler.native_checks`) while
    this one checks the rest and deserializes the IR; the IR is used only once every check passed.
    Smaller models do the same steps in this process. A model onnx_ir cannot deserialize gets the
    checker's verdict first, which names the fault.
    """
    to_check = checker_input(proto, deferred) if check else None
    native = None
    if len(proto.graph.node) >= native_checks.CHILD_MIN_NODES and sys.executable:
        try:
            native = native_checks.NativeChecks(to_check, proto)
        except OSError:  # no child process here: do it all in this one
            native = None
    try:
        if check:
            check_model_contents(proto, origin, deferred=deferred)
        try:
            model = ir.from_proto(proto)
        except Exception:
            _native_result(native, proto, origin, to_check)  # raises for an invalid model
            raise
    except BaseException:
        if native is not None:
            native.cancel()
        raise
    return _typed_ir(proto, model, _native_result(native, proto, origin, to_check))


def _native_result(
    native: native_checks.NativeChecks | None, proto: onnx.ModelProto, origin: str, to_check: onnx.ModelProto | None
) -> native_checks.InferredTypes | None:
    """The checker's verdict (raised when it refuses the model) and shape inference's types: from the
    child process, or computed here (no child, or a child that failed for reasons of its own)."""
    if native is not None:
        result = native.result()
        if result.crashed:
            raise ModelLoadError(
                f"{origin}: onnx's checker or shape inference stopped on this model ({result.crashed})"
            )
        if not result.failed:
            if to_check is not None:
                checker_verdict(proto, origin, result.checker_error)
            return result.types
    if to_check is not None:
        checker_verdict(proto, origin, native_checks.check(to_check))
    return native_checks.inferred_types(proto)


def _typed_ir(proto: onnx.ModelProto, model: ir.Model, types: native_checks.InferredTypes | None) -> ir.Model:
    """``model`` (``ir.from_proto(proto)``) with the types shape inference found (``types``; None:
    it failed, and the model keeps the types it declares).

    Faster than ``ir.from_proto`` of the inferred model: each distinct inferred entry is decoded
    once, and plain tensor types share one frozen Shape. Anything unusual (a doc string or metadata
    on an inferred entry, a non-tensor type) takes onnx_ir's own path, and so does the whole model
    when inference changed a function or the graphs do not match.
    """
    if types is None:
        return model
    ir_graphs = list(iter_graphs(model.graph))
    if types.functions_changed or len(ir_graphs) != len(types.graphs) or any(
        (g.name or "") != t.name or len(g) != t.nodes for g, t in zip(ir_graphs, types.graphs)
    ):
        typed = native_checks.infer(proto)
        return model if typed is None else ir.from_proto(typed)
    entries = [_Entry(data) for data in types.table]
    for g, t in zip(ir_graphs, types.graphs):
        for value, k in zip(g.inputs, t.inputs):
            serde.deserialize_value_info_proto(entries[k].info, value)
        lookup = t.value_info
        if lookup:
            for value in g.initializers.values():
                if not value.is_graph_input() and value.name in lookup:
                    entries[lookup[value.name]].apply(value)
            get = lookup.get
            for node in g:
                for value in node.outputs:
                    name = value.name
                    k = get(name) if name else None
                    if k is not None:
                        entries[k].apply(value)
        for value, k in zip(g.outputs, t.outputs):
            serde.deserialize_value_info_proto(entries[k].info, value)
    return model


class _Entry:
    """One distinct inferred ValueInfoProto (its name cleared), decoded on first use."""

    __slots__ = ("data", "_info", "_plain")

    def __init__(self, data: bytes):
        self.data = data
        self._info: onnx.ValueInfoProto | None = None
        self._plain: tuple[ir.Shape | None, ir.DataType | None] | None | bool = None

    @property
    def info(self) -> onnx.ValueInfoProto:
        if self._info is None:
            self._info = onnx.ValueInfoProto.FromString(self.data)
        return self._info

    def apply(self, value: ir.Value) -> None:
        """``serde.deserialize_value_info_proto(self.info, value)``, decoded once for plain tensor types."""
        if self._plain is None:
            info = self.info
            type_proto = info.type
            plain = (
                type_proto.WhichOneof("value") == "tensor_type" and not type_proto.denotation
                and not info.doc_string and not len(info.metadata_props)
            )
            if plain:
                tensor_type = serde.deserialize_type_proto_for_type(type_proto)
                self._plain = (serde.deserialize_type_proto_for_shape(type_proto), tensor_type and tensor_type.dtype)
            else:
                self._plain = False
        if self._plain is False:
            serde.deserialize_value_info_proto(self.info, value)
            return
        shape, dtype = self._plain
        value.shape = shape  # frozen: safe to share
        value.type = None if dtype is None else ir.TensorType(dtype)
        value.doc_string = None


def _output_proto(ir_model: ir.Model, original: onnx.ModelProto) -> onnx.ModelProto:
    """The converted IR model as a ModelProto with the input's IR version and only the value_info
    entries the input had (see :func:`_keep_value_info_of`). Consumes ``ir_model``: the types of
    tensors the input did not describe are dropped before serializing rather than serialized and then
    deleted (the same bytes, in a third of the time)."""
    described = _described_names(original)
    ConvertedConstant.convert_together(
        v.const_value for g in iter_graphs(ir_model.graph) for v in g.initializers.values()
        if isinstance(v.const_value, ConvertedConstant)
    )
    for g in iter_graphs(ir_model.graph):
        values = [v for v in g.initializers.values() if not v.is_graph_input()]
        values.extend(v for node in g for v in node.outputs)
        for v in values:
            if v.name not in described and not v.is_graph_output():
                v.type = None
                v.shape = None
    out = ir.to_proto(ir_model)
    out.ir_version = original.ir_version
    _keep_value_info_of(original, out, described)
    return out


def _described_names(model: onnx.ModelProto) -> set[str]:
    return {v.name for g in iter_proto_graphs(model.graph) for v in g.value_info}


def _keep_value_info_of(original: onnx.ModelProto, out: onnx.ModelProto, described: set[str] | None = None) -> None:
    """Keep value_info entries only for the tensors the input model described (with their new types).

    Types inferred for the analysis are not written out: the output describes what the input
    described, so converting a converted model gives back the same bytes.
    """
    if described is None:
        described = _described_names(original)
    for g in iter_proto_graphs(out.graph):
        kept = [v for v in g.value_info if v.name in described]
        if len(kept) != len(g.value_info):
            del g.value_info[:]
            g.value_info.extend(kept)


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
            names.append(short_name(vtype.dtype))
        else:
            names.append(str(vtype))
    return names


def _user_name(slot) -> str:
    if slot.kind is SlotKind.GRAPH_OUT:
        return f"graph output {slot.index}"
    return slot.owner.name or slot.owner.op_type


def _node_decisions(
    graph: OnnxPrecisionGraph, plan: PrecisionPlan, model: ir.Model, inserted: dict, positions: dict
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
                        short_name(cast.to),
                        Rule.LOWERING_CAST.value,
                        f"Cast inserted: {users} need(s) {cast.source.name!r} as {short_name(cast.to)}",
                    )
                elif node.op_type == "Constant" and node.outputs and is_constant(node.outputs[0]):
                    dtype = node.outputs[0].dtype
                    precision, rule, reason = (
                        short_name(dtype) if dtype in FLOAT_TYPES else "none",
                        Rule.CONSTANT.value,
                        "constant: converted offline for the precision its users need",
                    )
                else:
                    precision, rule, reason = "none", Rule.NONFLOAT.value, "no float inputs or outputs"
            else:
                decision = decisions[main]
                if len(vids) == 1 or len({decisions[v].dtype for v in vids}) == 1:
                    precision = short_name(decision.dtype)
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
