"""The converted IR as the output ModelProto: the input's IR version, only the value_info it described.

:class:`DeferredOutput` keeps a conversion whose unconverted weights are still on disk (from a model
with external data) until it is written (with its weights in a data file) or asked for in memory.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import onnx
import onnx_ir as ir

from amp_compiler.onnx.ir.walk import iter_graphs
from amp_compiler.onnx.load.files import PROTOBUF_LIMIT
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.onnx.write.check_pieces import stands_in
from amp_compiler.onnx.write.inline_output import inline_chunks, placeholders
from amp_compiler.onnx.write.save import OutputPath, Verify
from amp_compiler.passes.onnx import ConvertedConstant

__all__ = ["DeferredOutput", "keep_declared_shapes", "output_proto"]


def output_proto(ir_model: ir.Model, original: onnx.ModelProto) -> onnx.ModelProto:
    """The converted IR model as a ModelProto with the input's IR version and only the value_info
    entries the input had (see :func:`keep_value_info_of`). Consumes ``ir_model``: the types of
    tensors the input did not describe are dropped before serializing rather than serialized and then
    deleted (the same bytes, in a third of the time)."""
    described = described_names(original)
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
    keep_value_info_of(original, out, described)
    keep_declared_shapes(original, out)
    return out


def keep_declared_shapes(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    """Give every graph output (each graph's and subgraph's, by position) and every value_info entry (by
    name) of ``out`` the dims ``original`` declares for it where it declares them symbolic or unknown, and
    no shape where it declares none (:func:`_declared_shape`): the conversion changes element types, not
    shapes. Shape inference, which typed the conversion's IR, merges a declared shape with what it
    infers, and inside subgraphs what it infers can be one size where the model takes many: the merged
    decoder of an Optimum T5 export declares its If's ``present.0.encoder.key`` as ``[batch_size, 4,
    encoder_sequence_length, 16]``, inference with data propagation made it ``[1, 4, 4, 16]``, and
    onnxruntime, which allocates an If's outputs as their branch declares them, refused every other
    size. A declared size that inference contradicts (a stale value_info entry) stays corrected.
    Graphs are paired in order (the conversion adds no subgraph), and left alone where the two models'
    graphs do not pair."""
    pairs = list(zip(iter_proto_graphs(original.graph), iter_proto_graphs(out.graph), strict=False))
    if len(pairs) != sum(1 for _ in iter_proto_graphs(out.graph)) or any(
        a.name != b.name or len(a.output) != len(b.output) for a, b in pairs
    ):
        return
    for declared, written in pairs:
        for before, after in zip(declared.output, written.output, strict=True):
            _declared_shape(before, after)
        kept = {v.name: v for v in declared.value_info}
        for after in written.value_info:
            if after.name in kept:
                _declared_shape(kept[after.name], after)


def _declared_shape(before: onnx.ValueInfoProto, after: onnx.ValueInfoProto) -> None:
    """``after``'s tensor shape as ``before`` declares it: none where it declares none; its symbolic and
    unknown dims where the ranks agree (a size both give stays ``after``'s: inference's correction
    of a stale one); ``after``'s where the ranks differ (inference corrected the declaration)."""
    if before.type.WhichOneof("value") != "tensor_type" or after.type.WhichOneof("value") != "tensor_type":
        return
    declared, written = before.type.tensor_type, after.type.tensor_type
    if not declared.HasField("shape"):
        written.ClearField("shape")
    elif not written.HasField("shape"):
        written.shape.CopyFrom(declared.shape)
    elif len(declared.shape.dim) == len(written.shape.dim):
        for was, now in zip(declared.shape.dim, written.shape.dim, strict=True):
            if not (was.HasField("dim_value") and now.HasField("dim_value")):
                now.CopyFrom(was)


def described_names(model: onnx.ModelProto) -> set[str]:
    """The names of the tensors a model's value_info entries describe, in every graph."""
    return {v.name for g in iter_proto_graphs(model.graph) for v in g.value_info}


def keep_value_info_of(original: onnx.ModelProto, out: onnx.ModelProto, described: set[str] | None = None) -> None:
    """Keep value_info entries only for the tensors the input model described (with their new types).

    Types inferred for the analysis are not written out: the output describes what the input
    described, so converting a converted model gives back the same bytes.
    """
    if described is None:
        described = described_names(original)
    for g in iter_proto_graphs(out.graph):
        kept = [v for v in g.value_info if v.name in described]
        if len(kept) != len(g.value_info):
            del g.value_info[:]
            g.value_info.extend(kept)


def _stand_in(tensor: ir.TensorProtocol) -> bool:
    return stands_in(int(tensor.dtype), tensor.nbytes)


@dataclasses.dataclass(eq=False)
class DeferredOutput:
    """A conversion's IR whose unconverted weights are still on disk (DeferredTensor)."""

    ir_model: ir.Model
    original: onnx.ModelProto  # the input (weights deferred): its IR version and value_info names
    inline: bool = False  # the input held its weights in the model file: the output holds them too

    def to_proto(self, model: ir.Model | None = None) -> onnx.ModelProto:
        """:func:`output_proto` of ``model`` (by default the conversion's IR), weights left as they are."""
        return output_proto(model or self.ir_model, self.original)

    def skeleton(self) -> onnx.ModelProto:
        """The output's ModelProto without its large weights' data: each weight of the main graph still
        on disk or still to convert that the load check's pieces take a stand-in for
        (:func:`~amp_compiler.onnx.write.check_pieces.stands_in`) is a placeholder (its name, type and shape);
        other tensors on disk are read. What the load check makes its pieces of before the output is
        written."""
        with placeholders(self.ir_model, _stand_in):
            return self.to_proto()

    def materialize(self) -> onnx.ModelProto:
        """The ModelProto with every weight read into it (as the in-memory path builds it)."""
        with placeholders(self.ir_model, lambda tensor: False):  # no placeholder: every weight on disk read
            return self.to_proto()

    def write(self, output: OutputPath, verify: Verify | None = None) -> Path | None:
        """Write the conversion to ``output``, its large weights in ``<output>.data`` (one at a time;
        ``verify`` as :meth:`OutputPath.write_ir_model` has it); an ``inline`` one as one file.
        Returns the data file, or None when no weight needed one."""
        if self.inline:  # one file, its large weights streamed into it (inline_output.py)
            output.write_chunks(inline_chunks(self.ir_model, self.to_proto), verify, limit=PROTOBUF_LIMIT)
            return None
        return output.write_ir_model(self.ir_model, self.to_proto, verify=verify)
