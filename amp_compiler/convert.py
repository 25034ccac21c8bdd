"""The ONNX conversion, :func:`convert`: the pipeline from an FP32 model to a mixed-precision one.

    load -> check and type the IR (shape inference) -> precision graph -> analysis (classify, kernel
    coverage, constant and calibration ranges, paint, min-cut: amp_compiler.pipeline) -> lower (casts,
    constants) -> cleanup -> Tensor Core padding (opt-in) -> per-node decisions
"""

from __future__ import annotations

import dataclasses
import os
import sys

import onnx
import onnx_ir as ir
from onnx_ir import serde

from amp_compiler import native_checks
from amp_compiler.costs import check_input_shapes, element_counts
from amp_compiler.decisions import NodeDecision, node_decisions
from amp_compiler.errors import ModelLoadError
from amp_compiler.gc_pause import gc_paused
from amp_compiler.onnx.ir_walk import iter_graphs, node_order
from amp_compiler.onnx.precision_graph import build_precision_graph
from amp_compiler.onnx_io import (
    DeferredModel,
    DeferredTensor,
    check_model_contents,
    checker_input,
    checker_verdict,
    defer_ir_tensors,
    iter_proto_graphs,
    load_model_deferred,
)
from amp_compiler.options import ConvertOptions, check_block_ops, resolve_options
from amp_compiler.passes import (
    ConvertedConstant,
    LowerPlanPass,
    PadTensorCoresPass,
    RemoveCancellingCastsPass,
    compile_patterns,
)
from amp_compiler.pipeline import AnalysisSettings, check_placement, plan_precisions
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.report.model import TensorRange
from amp_compiler.result import ConversionResult

__all__ = ["ConversionResult", "ConvertOptions", "NodeDecision", "convert"]


@gc_paused
def convert(
    model: onnx.ModelProto | str | os.PathLike | DeferredModel,
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
    # Options, checked before the model is read.
    opts = resolve_options(options, overrides)
    policy = policy or default_table()
    check_block_ops(opts.block_ops, policy)
    patterns = compile_patterns(opts.block_nodes)
    check_placement(opts.placement)

    # Load, check the model and type its IR; weights of external-data models stay on disk.
    proto, locations, checked, origin = _read(model)
    if opts.input_shapes:
        check_input_shapes(proto, dict(opts.input_shapes))
    ir_model = _checked_typed_ir(proto, origin, deferred=bool(locations), check=not checked)
    if locations:
        defer_ir_tensors(ir_model, locations)

    # Analysis: the precision graph, then the plan (amp_compiler.pipeline).
    graph = build_precision_graph(ir_model, opts.target, policy, keep_io_types=opts.keep_io_types)
    nodes = node_order(ir_model)
    settings = AnalysisSettings(
        opts.target, opts.provider, opts.block_ops, patterns,
        pinned={nodes[i]: why for i, why in opts.pinned_nodes if i < len(nodes)},
        ranges=ranges,
        placement=opts.placement,
        elements=element_counts(proto, dict(opts.input_shapes)) if opts.input_shapes and opts.placement == "mincut"
        else None,
    )
    plan = plan_precisions(graph, settings)

    # Lowering: the plan applied to the IR, then cleanup and the opt-in Tensor Core padding.
    lower = LowerPlanPass(graph, plan)
    lower(ir_model)
    RemoveCancellingCastsPass()(ir_model)
    pad = PadTensorCoresPass() if opts.pad_tensor_cores else None
    if pad is not None:
        pad(ir_model)

    # Decisions, one per node of the output (positions of the input's nodes), and the result.
    decisions = node_decisions(graph, plan, ir_model, lower.casts, nodes)
    if pad is not None:
        pad.explain(decisions, node_order(ir_model))
    casts_added = sum(d.op_type == "Cast" for d in decisions) - sum(n.op_type == "Cast" for n in nodes)
    output = _DeferredOutput(ir_model, proto) if locations else None
    return ConversionResult(
        None if output else _output_proto(ir_model, proto), decisions, casts_added,  # type: ignore[arg-type]
        len(lower.converted_constants), opts, plan.cast_bytes_painting, plan.cast_bytes_final, output,
    )


def _read(
    model: onnx.ModelProto | str | os.PathLike | DeferredModel,
) -> tuple[onnx.ModelProto, dict, bool, str]:
    """(the ModelProto, where its deferred weights are, whether it was checked, its origin for
    messages): a path is read with its large weights left on disk, unchecked (the conversion checks
    it while it builds the IR)."""
    deferred = load_model_deferred(model, check=False) if isinstance(model, (str, os.PathLike)) else model
    if isinstance(deferred, DeferredModel):
        return deferred.model, deferred.locations, deferred.checked, str(deferred.files[0])
    if not isinstance(deferred, onnx.ModelProto):
        raise TypeError(f"expected an onnx.ModelProto or a path, got {type(deferred).__name__}")
    return deferred, {}, False, "model"


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
