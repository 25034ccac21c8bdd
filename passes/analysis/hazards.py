"""Runtime hazards: keep in FP32 the op patterns that a runtime crashes on once a Cast sits inside them.

onnxruntime (1.22 and later, every provider that runs its ``MatmulTransposeFusion``: CPU, CUDA, DML,
ROCm) crashes with SIGSEGV while it creates a session of a model where a Cast sits between a
*batch-moving* Transpose and the MatMul it feeds, when the MatMul's other input has another rank.
The fusion (``onnxruntime/core/optimizer/matmul_transpose_fusion.cc``) first moves the Cast before
the Transpose (editing the graph), then finds it may not fuse a batch-moving Transpose with operands
of unequal ranks and gives up without saying the graph changed; the next optimizer walks a stale
node order. A batch-moving Transpose moves dim 0 behind the batch dims: ``perm[:-2] == [1, 2, ...,
rank-2]`` and the last two entries are ``{0, rank-1}`` (rank 3: ``[1,0,2]``, ``[1,2,0]``; rank 4:
``[1,2,0,3]``, ``[1,2,3,0]``). A batch-first RNN exported by PyTorch ends in exactly this, ``GRU ->
Squeeze -> Transpose(1,0,2) -> MatMul(2-D weight)``, so every FP16 conversion of such a model crashed
onnxruntime: the CPU provider, which has no FP16 MatMul kernel, inserts that Cast itself.

Runs after classification, on ONNX models. For every MatMul input made by such a Transpose, with the
other input of another or unknown rank, the MatMul's and the Transpose's free vertices (ALLOW, INFER,
CLEAR) in FP32 become FIXED there (rule ``runtime.ort-transpose-matmul``), on every provider and target:
no Cast can sit between them, and none is needed by any provider; the Cast the boundary needs lands
before the Transpose, on the same bytes. FIXED, not DENY: nothing spreads from them to their
neighbours. It costs one small MatMul per RNN output projection.

Guarantees (checked by ``ensures``): only free vertices change, to FIXED with that rule and a reason
that names both nodes; every such pattern has no free vertex left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, ensure_only_pinned, require, require_roles
from amp_compiler.policy import schemas

__all__ = ["RuntimeHazardPass", "moves_batch"]

_FREE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})


def moves_batch(perm: list[int]) -> bool:
    """True for a Transpose perm that moves dim 0 behind the batch dims (onnxruntime's "trans batch")."""
    rank = len(perm)
    return rank >= 3 and perm[: rank - 2] == list(range(1, rank - 1)) and set(perm[rank - 2:]) == {0, rank - 1}


def _rank(value: ir.Value | None) -> int | None:
    if value is None or value.shape is None:
        return None
    return len(value.shape)


def hazards(model: ir.Model) -> Iterator[tuple[ir.Node, ir.Node]]:
    """(Transpose, MatMul) pairs of every graph of ``model`` that a Cast between them would crash
    onnxruntime on (see the module doc)."""
    for graph in model.graphs():
        for node in graph:
            if node.op_type != "MatMul" or not schemas.is_onnx_domain(node.domain) or len(node.inputs) != 2:
                continue
            for k, value in enumerate(node.inputs):
                producer = value.producer() if value is not None else None
                if producer is None or producer.op_type != "Transpose" or not schemas.is_onnx_domain(producer.domain):
                    continue
                perm = producer.attributes.get("perm")
                if perm is None or not moves_batch(list(perm.as_ints())):
                    continue
                rank, other = _rank(value), _rank(node.inputs[1 - k])
                if rank is None or other is None or rank != other:
                    yield producer, node


def _vertices(graph: PrecisionGraph, *nodes: ir.Node) -> Iterator[int]:
    """The FP32 vertices of ``nodes`` (a vertex already in another type keeps it: nothing to pin)."""
    for node in nodes:
        for vid in graph.node_vertices.get(node, ()):
            if graph.vertices[vid].dtype == ir.DataType.FLOAT:
                yield vid


@dataclasses.dataclass
class RuntimeHazardPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(isinstance(graph.model, ir.Model), self, "the patterns are read from an ONNX model")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        for transpose, matmul in hazards(graph.model):
            perm = list(transpose.attributes["perm"].as_ints())
            reason = (
                f"FP32: a Cast between Transpose {transpose.name!r} (perm {perm}) and MatMul {matmul.name!r}, "
                "whose other input has another rank, crashes onnxruntime >= 1.22 while it creates a session "
                "(MatmulTransposeFusion, onnxruntime/core/optimizer/matmul_transpose_fusion.cc; its CPU "
                "provider inserts that Cast around an FP16 MatMul): both stay FP32, the Cast goes before the Transpose"
            )
            for vid in _vertices(graph, transpose, matmul):
                if plan.roles.get(vid) in _FREE:
                    plan.set_role(vid, Role.FIXED, Rule.RUNTIME_TRANSPOSE_MATMUL, reason)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        rules = frozenset({Rule.RUNTIME_TRANSPOSE_MATMUL})
        ensure_only_pinned(self, graph, plan, before, _FREE, Role.FIXED, rules)
        at_risk = {vid for pair in hazards(graph.model) for vid in _vertices(graph, *pair)}
        ensure_all(
            self, (graph.vertices[vid] for vid in sorted(at_risk)),
            lambda v: plan.roles[v.id] not in _FREE, "is free in a Transpose -> MatMul pattern onnxruntime crashes on",
        )
