"""Runtime hazards: no Cast where a runtime crashes on one, on the providers where it would sit there.

onnxruntime (1.22 and later, every provider that runs its ``MatmulTransposeFusion``: CPU, CUDA, DML,
ROCm) crashes with SIGSEGV while it creates a session of a model where a Cast sits between a
*batch-moving* Transpose and the MatMul it feeds, when the MatMul's other input has another rank.
The fusion (``onnxruntime/core/optimizer/matmul_transpose_fusion.cc``) first moves the Cast before
the Transpose (editing the graph), then finds it may not fuse a batch-moving Transpose with operands
of unequal ranks and gives up without saying the graph changed; the next optimizer walks a stale
node order. A batch-moving Transpose moves dim 0 behind the batch dims: ``perm[:-2] == [1, 2, ...,
rank-2]`` and the last two entries are ``{0, rank-1}`` (rank 3: ``[1,0,2]``, ``[1,2,0]``; rank 4:
``[1,2,0,3]``, ``[1,2,3,0]``). A batch-first RNN exported by PyTorch ends in exactly this, ``GRU ->
Squeeze -> Transpose(1,0,2) -> MatMul(2-D weight)``, and so does every ``nn.MultiheadAttention(...,
batch_first=True)`` (torchvision's ViT, ``nn.TransformerEncoder``): ``Transpose(1,0,2) -> MatMul``
of the in-projection.

Such a Cast gets there two ways, and the hazard's data (:class:`Hazard`) says which providers make
it themselves:

- the provider inserts it: onnxruntime's CPU provider has no FP16 MatMul kernel and casts an FP16
  MatMul's inputs to FP32 itself. There the MatMul cannot be low precision: the free vertices of
  both nodes become FIXED in FP32 (the Cast the boundary needs lands before the Transpose);
- the conversion puts it there, when the Transpose and the MatMul are decided differently. On the
  CUDA provider (an FP16 and BF16 MatMul kernel) and TensorRT (its own engine: onnxruntime's
  optimizers do not touch its nodes) only that can happen, so the Transpose takes the MatMul's
  precision: low precision with a low-precision MatMul (ALLOW), FP32 with an FP32 one (FIXED). The
  MatMul keeps its Tensor Core FLOPs low (torchvision's ViT-B/16 lost its 12 attention in-projections
  to FP32 when the rule applied everywhere).

Runs after every pass that sets roles, right before painting, on ONNX models, so the MatMul's role is
final: ALLOW is always painted low, DENY and FIXED keep theirs. Nodes tied to one another by several
patterns (a Transpose feeding two MatMuls) are decided together; where they disagree, or none of them
is decided yet, their free vertices stay FP32 as on the CPU provider.

Guarantees (checked by ``ensures``): only free vertices change, to FIXED (FP32) or, for a provider that
inserts no Cast, from INFER/CLEAR to ALLOW, with the rule ``runtime.ort-transpose-matmul`` and a
reason that names both nodes; afterwards no pattern is left with a free vertex that painting could
decide otherwise than its partner, and on a provider that inserts the Cast no pattern keeps a free
FP32 vertex.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, SlotKind, UnionFind
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.onnx.ir.slots import Slot
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_all, require, require_roles
from amp_compiler.policy import schemas
from amp_compiler.targets import Provider

__all__ = ["TRANSPOSE_MATMUL", "Hazard", "RuntimeHazardPass", "hazards", "moves_batch", "stand_in_skips"]

_FREE = frozenset({Role.ALLOW, Role.INFER, Role.CLEAR})
_OPEN = frozenset({Role.INFER, Role.CLEAR})


@dataclasses.dataclass(frozen=True)
class Hazard:
    """A pattern a runtime crashes on once a Cast sits inside it, and where that Cast comes from."""

    rule: Rule
    runtime: str  # which runtime crashes, and from which version
    optimizer: str  # the session optimizer that trips on it (a load check may turn it off)
    source: str  # where the fault is
    # Providers that put the Cast there themselves (around an op they have no low-precision kernel for):
    # there the pattern stays FP32. Elsewhere only a conversion's own Cast could sit there.
    inserts_cast: frozenset[Provider]


TRANSPOSE_MATMUL = Hazard(
    Rule.RUNTIME_TRANSPOSE_MATMUL, "onnxruntime >= 1.22", "MatmulTransposeFusion",
    "onnxruntime/core/optimizer/matmul_transpose_fusion.cc", frozenset({Provider.CPU}),
)


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


def stand_in_skips(model: ir.Model, provider: Provider, hazard: Hazard = TRANSPOSE_MATMUL) -> tuple[str, ...]:
    """The onnxruntime optimizers a load check of ``model``, converted for ``provider``, must turn off
    on the CPU provider it loads with: those that trip only on the Cast the CPU provider inserts (a
    pattern whose MatMul is low precision, for a provider that inserts none), not on the model as
    ``provider`` runs it."""
    if provider in hazard.inserts_cast:
        return ()
    low = (ir.DataType.FLOAT16, ir.DataType.BFLOAT16)
    if any(matmul.outputs[0].dtype in low for _, matmul in hazards(model)):
        return (hazard.optimizer,)
    return ()


def _vertices(graph: PrecisionGraph, *nodes: ir.Node) -> Iterator[int]:
    """The FP32 vertices of ``nodes`` (a vertex already in another type keeps it: nothing to pin)."""
    for node in nodes:
        for vid in graph.node_vertices.get(node, ()):
            if graph.vertices[vid].dtype == ir.DataType.FLOAT:
                yield vid


def _data_vertex(graph: PrecisionGraph, node: ir.Node, index: int) -> int | None:
    """The vertex of the node's input ``index`` (the tensor between the Transpose and the MatMul)."""
    return graph.slot_vertex.get(Slot(SlotKind.NODE_IN, node, index))


def _linked(graph: PrecisionGraph, pairs: list[tuple[ir.Node, ir.Node]]) -> list[list[int]]:
    """The vertices the patterns tie together (the Transpose's data and the MatMul's), in groups:
    a Transpose feeding two MatMuls ties all three."""
    uf: UnionFind[int] = UnionFind()
    for transpose, matmul in pairs:
        ends = [_data_vertex(graph, transpose, 0),
                _data_vertex(graph, matmul, next(k for k, v in enumerate(matmul.inputs) if v is transpose.outputs[0]))]
        present = [v for v in ends if v is not None]
        for v in present:
            uf.add(v)
        for v in present[1:]:
            uf.union(present[0], v)
    return [sorted(group) for group in uf.groups().values()]


def _outcome(graph: PrecisionGraph, plan: PrecisionPlan, vid: int) -> str:
    """What painting will make of a vertex: "low", "fp32", "open" (its choice), or "other"."""
    role, dtype = plan.roles[vid], graph.vertices[vid].dtype
    if role is Role.ALLOW or (role is Role.FIXED and dtype == graph.target.dtype):
        return "low"
    if role is Role.DENY or (role is Role.FIXED and dtype == ir.DataType.FLOAT):
        return "fp32"
    return "open" if role in _OPEN else "other"


@dataclasses.dataclass
class RuntimeHazardPass(AnalysisPass):
    provider: Provider = Provider.CUDA
    hazard: Hazard = TRANSPOSE_MATMUL

    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)
        require(isinstance(graph.model, ir.Model), self, "the patterns are read from an ONNX model")
        require(not plan.decisions, self, "runs before painting, once the roles are final")

    @property
    def inserts_cast(self) -> bool:
        return self.provider in self.hazard.inserts_cast

    def _reason(self, transpose: ir.Node, matmul: ir.Node, low: bool) -> str:
        perm = list(transpose.attributes["perm"].as_ints())
        h = self.hazard
        crash = (
            f"a Cast between Transpose {transpose.name!r} (perm {perm}) and MatMul {matmul.name!r}, whose other "
            f"input has another rank, crashes {h.runtime} while it creates a session ({h.optimizer}, {h.source})"
        )
        if self.inserts_cast:
            return (f"FP32: {crash}; the {self.provider.value} provider inserts that Cast around a low-precision "
                    "MatMul: both stay FP32, the Cast goes before the Transpose")
        return (f"{'low precision' if low else 'FP32'} with the MatMul: {crash}; the {self.provider.value} provider "
                "inserts none, so the Transpose takes the MatMul's precision and no Cast sits between them")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        pairs = list(hazards(graph.model))
        if self.inserts_cast:
            for transpose, matmul in pairs:
                reason = self._reason(transpose, matmul, low=False)
                for vid in _vertices(graph, transpose, matmul):
                    if plan.roles.get(vid) in _FREE:
                        plan.set_role(vid, Role.FIXED, self.hazard.rule, reason)
            return
        first: dict[int, tuple[ir.Node, ir.Node]] = {}  # per vertex, the pattern its reason names
        for transpose, matmul in pairs:
            for node in (transpose, matmul):
                for vid in graph.node_vertices.get(node, ()):
                    first.setdefault(vid, (transpose, matmul))
        for group in _linked(graph, pairs):
            outcomes = {_outcome(graph, plan, vid) for vid in group}
            low = outcomes <= {"low", "open"} and "low" in outcomes
            for vid in group:
                role = plan.roles[vid]
                if low and role in _OPEN:
                    plan.set_role(vid, Role.ALLOW, self.hazard.rule, self._reason(*first[vid], low=True))
                elif not low and role in _FREE and graph.vertices[vid].dtype == ir.DataType.FLOAT:
                    plan.set_role(vid, Role.FIXED, self.hazard.rule, self._reason(*first[vid], low=False))

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        rule = self.hazard.rule

        def kept_or_pinned(v) -> bool:
            vid = v.id
            if plan.roles[vid] is before.roles[vid] and plan.role_rules[vid] == before.role_rules[vid]:
                return True
            was, now = before.roles[vid], plan.roles[vid]
            pinned = was in _FREE and now is Role.FIXED
            raised = not self.inserts_cast and was in _OPEN and now is Role.ALLOW
            return (pinned or raised) and plan.role_rules[vid][0] is rule and bool(plan.role_rules[vid][1])

        ensure_all(self, graph.vertices, kept_or_pinned, f"changed role, where only {rule.value} may pin or raise")
        pairs = list(hazards(graph.model))
        if self.inserts_cast:
            at_risk = {vid for pair in pairs for vid in _vertices(graph, *pair)}
            ensure_all(
                self, (graph.vertices[vid] for vid in sorted(at_risk)),
                lambda v: plan.roles[v.id] not in _FREE,
                "is free in a Transpose -> MatMul pattern onnxruntime crashes on",
            )
            return
        for group in _linked(graph, pairs):
            outcomes = {_outcome(graph, plan, vid) for vid in group}
            if len(outcomes) == 1 and outcomes <= {"low", "fp32"}:
                continue  # one precision for all: no Cast between them
            ensure_all(
                self, (graph.vertices[vid] for vid in group), lambda v: plan.roles[v.id] not in _FREE,
                "may be decided apart from its partner in a Transpose -> MatMul pattern",
            )
