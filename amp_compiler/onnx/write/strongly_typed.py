"""What a strongly typed runtime needs of our output: every tensor's element type decided by the graph.

TensorRT's strongly typed networks (the only kind since TensorRT 11) take each tensor's type from the
ONNX file, so an output whose types only an optimiser could settle is not deployable there.
"""

from __future__ import annotations

import onnx
import onnx.shape_inference

from amp_compiler.onnx.load.proto_walk import iter_proto_graphs

__all__ = ["undecided_values"]


def undecided_values(model: onnx.ModelProto) -> list[str]:
    """Tensors of ``model`` (an ``onnx.ModelProto``) whose element type the graph does not fix.

    TensorRT 10's strongly typed networks take every tensor's type from the model, with no builder
    flag to pick precisions: each tensor must have a type that strict ONNX type inference derives
    from the graph inputs, initializers and the ops' attributes. Returns "graph/tensor" names of
    node outputs and graph inputs/outputs without one (empty for a model TensorRT can take as is).
    """
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    missing = []
    for graph in iter_proto_graphs(inferred.graph):
        typed = {
            v.name
            for v in list(graph.input) + list(graph.output) + list(graph.value_info)
            if v.type.WhichOneof("value") is not None
            and (not v.type.HasField("tensor_type") or v.type.tensor_type.elem_type != onnx.TensorProto.UNDEFINED)
        }
        typed.update(t.name for t in graph.initializer)
        typed.update(t.values.name for t in graph.sparse_initializer)
        names = [v.name for v in list(graph.input) + list(graph.output)]
        names += [o for node in graph.node for o in node.output if o]
        missing += [f"{graph.name}/{n}" for n in names if n not in typed]
    return missing
