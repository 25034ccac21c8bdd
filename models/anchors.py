"""What a deployment graph's conversion is compared with its anchor on: FP16 nodes, Casts, I/O types.

The anchors (models/deployment.py) are the FP16 graphs each deployment flow ships: onnxruntime's
transformer optimizer ``--float16``, onnxruntime-genai's builder ``-p fp16 -e cuda``. Counts are read
from the element types onnxruntime's symbolic shape inference gives each node's first output (an
independent reading: the converted model's own value_info describes only what its input described).

- *fused*: onnxruntime's fused ops (``com.microsoft``, and SimplifiedLayerNormalization in the
  default domain); *matmul*: MatMul, Gemm, MatMulNBits, FusedMatMul;
- *casts*: every Cast node of the graph, the model's own included;
- *low I/O*: graph inputs and outputs of a low-precision type.
"""

from __future__ import annotations

import dataclasses

import onnx

from amp_compiler.onnx.load.symbolic_shapes import symbolic_infos

FUSED_DOMAINS = ("com.microsoft",)
DEFAULT_DOMAIN_FUSED = ("SimplifiedLayerNormalization",)
MATMUL_OPS = ("MatMul", "Gemm", "MatMulNBits", "FusedMatMul")
LOW_TYPES = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


@dataclasses.dataclass(frozen=True)
class Counts:
    fused: int
    fused_low: int
    matmul: int
    matmul_low: int
    casts: int
    low_io: frozenset[str]  # graph inputs and outputs of a low-precision type

    def row(self) -> str:
        return f"{self.fused_low}/{self.fused} fused, {self.matmul_low}/{self.matmul} MatMul, {self.casts} Casts"


def is_fused(node: onnx.NodeProto) -> bool:
    return node.domain in FUSED_DOMAINS or (node.domain in ("", "ai.onnx") and node.op_type in DEFAULT_DOMAIN_FUSED)


def counts(model: onnx.ModelProto) -> Counts:
    """The counts of the module docstring for ``model``'s main graph."""
    infos = symbolic_infos(model)
    declared = {v.name: v.type.tensor_type.elem_type for v in [*model.graph.value_info, *model.graph.output]}

    def low(node: onnx.NodeProto) -> bool:
        name = node.output[0]
        info = infos.get(name)
        elem = info.elem_type if info is not None and info.elem_type else declared.get(name, 0)
        return elem in LOW_TYPES

    fused = [n for n in model.graph.node if is_fused(n)]
    matmul = [n for n in model.graph.node if n.op_type in MATMUL_OPS]
    io = [*model.graph.input, *model.graph.output]
    return Counts(
        fused=len(fused),
        fused_low=sum(map(low, fused)),
        matmul=len(matmul),
        matmul_low=sum(map(low, matmul)),
        casts=sum(n.op_type == "Cast" for n in model.graph.node),
        low_io=frozenset(v.name for v in io if v.type.tensor_type.elem_type in LOW_TYPES),
    )


def cast_allowance(ours: onnx.ModelProto, anchor: Counts) -> int:
    """The most Casts a conversion may have against ``anchor``: the anchor's, plus one per graph input
    or output the anchor makes low precision and ``ours`` keeps FP32 (a Cast at that boundary)."""
    kept = {v.name for v in [*ours.graph.input, *ours.graph.output]
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    return anchor.casts + len(anchor.low_io & kept)


def io_types(model: onnx.ModelProto, prefixes: tuple[str, ...] = ("past_key_values.", "present.")) -> dict[str, int]:
    """Element types of the graph inputs and outputs whose names start with ``prefixes`` (the KV cache)."""
    return {v.name: v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]
            if v.name.startswith(prefixes)}

