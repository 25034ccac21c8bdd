"""Cleanup: remove Casts that change nothing, and Cast pairs that cancel exactly.

Guarantees: a Cast to the dtype its input already has (a model's ``Cast(to=fp16)`` after an op that
now computes in FP16) is bypassed. A Cast whose input comes from a lossless widening Cast of a tensor already in the
requested dtype (``x:fp16 -> Cast(fp32) -> Cast(fp16)``) is bypassed: its users read ``x`` directly.
Lossy pairs (``fp32 -> fp16 -> fp32``) are kept: they change values. Graph outputs are never bypassed
(their names are part of the model's interface). A widening Cast left without users by a bypass is
removed; no other node is.
"""

from __future__ import annotations

from typing import TypeGuard

import onnx_ir as ir

from amp_compiler.onnx.ir.walk import iter_graphs
from amp_compiler.policy.schemas import is_onnx_domain

__all__ = ["RemoveCancellingCastsPass"]

# (narrow, wide): widening narrow -> wide and back is exact.
_LOSSLESS: set[tuple[ir.DataType | None, ir.DataType | None]] = {
    (ir.DataType.FLOAT16, ir.DataType.FLOAT),
    (ir.DataType.BFLOAT16, ir.DataType.FLOAT),
    (ir.DataType.FLOAT16, ir.DataType.DOUBLE),
    (ir.DataType.BFLOAT16, ir.DataType.DOUBLE),
    (ir.DataType.FLOAT, ir.DataType.DOUBLE),
}


def _is_cast(node: ir.Node | None) -> TypeGuard[ir.Node]:
    return node is not None and node.op_type == "Cast" and is_onnx_domain(node.domain)


class RemoveCancellingCastsPass(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for graph in list(iter_graphs(model.graph)):
            for node in list(graph):
                if not _is_cast(node):
                    continue
                out = node.outputs[0]
                src = node.inputs[0]
                if src is not None and src.dtype is not None and src.dtype == out.dtype and not out.is_graph_output():
                    out.replace_all_uses_with(src)
                    graph.remove(node, safe=True)
                    modified = True
                    continue
                inner = node.inputs[0].producer() if node.inputs[0] is not None else None
                if not _is_cast(inner) or inner.inputs[0] is None:
                    continue
                origin = inner.inputs[0]
                if origin.dtype != out.dtype or out.is_graph_output():
                    continue
                if (origin.dtype, inner.outputs[0].dtype) not in _LOSSLESS:
                    continue
                out.replace_all_uses_with(origin)
                graph.remove(node, safe=True)
                widened, home = inner.outputs[0], inner.graph
                if not widened.uses() and not widened.is_graph_output() and home is not None:
                    home.remove(inner, safe=True)
                modified = True
        return ir.passes.PassResult(model, modified)
