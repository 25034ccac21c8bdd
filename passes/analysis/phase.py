"""Phase arguments: keep FP32 the linear path from raw positions or coordinates into a periodic op.

Rotary position embeddings as Hugging Face Llama computes them (``inv_freq[:, None] @ positions[None, :]``,
a MatMul with K = 1, then Transpose, Concat, Cos and Sin), sinusoidal tables and Fourier features
(``sin(2 pi x @ B)`` over raw coordinates) take the sine of an angle that grows with the position or
the coordinate. A periodic op's output error is its argument's absolute error, and storing an
argument of magnitude A in FP16 rounds it by up to A * 2^-11 (BF16: A * 2^-8): 0.5 rad at 2000 and
8 rad at 32000 in FP16, where a sine is meaningless. The Sin/Cos themselves are HIGH in the policy
table, but their argument was computed in FP16 all the same (the angle MatMul is ``policy.low``).
Measured under exact FP16 emulation on a Llama-style rotary block (an outer-product angle MatMul,
positions p..p+15): output error 0.08% of range at p = 16, 7.1% at 2000, 24% at 8000, 42% at 32000
with the angle in FP16; 0.03% at each with this pass (BF16: 0.4%, 37%, 41%, 65% before, 0.2-0.3%
after), every projection MatMul still low. Fourier features (2 pi x @ B, B ~ N(0, 10)): 1.3-1.5% in
FP16, 0.04% with this pass. The range probe cannot see it: it
feeds positions 0..127.

Found on the precision graph, backwards from every op the table marks ``periodic`` (Sin, Cos, Tan)
through ops that are linear in their input (the table's ``signal`` flag: data movement, Cast, Add,
Mul, Div; a LOW op such as MatMul, Gemm or Einsum only when every operand but one is a constant or
computed from constants alone, i.e. a projection with fixed frequencies) to *raw* values: a float
graph input (coordinates, time steps), a float computed from integers alone (a Cast of position
ids), or an op that counts (the table's ``positions``: Range) not computed from constants alone.
Paths that meet anything else (an activation, a normalization, attention) are learned features (a
SIREN's sine of a hidden layer), left to the range rules. The constant-derived operands of the path
(an Expand or Reshape of ``inv_freq``) stay FP32 too: a frequency rounded to FP16 moves the angle
by as much as a rounded angle. So does the periodic op itself where the table lets it follow its
neighbours (aten's sin and cos): low, it would round its argument at its own input.

The walk follows :func:`~amp_compiler.core.graph.dataflow`, not the tensor edges alone: an op whose
input and output lie in two vertices (a Cast or ``.to(float32)`` between float types) has no tensor
edge across it, and its output looked computed from nothing, i.e. raw. In a torch.export graph Llama's
``inv_freq[None, :, None].float()`` is such an op: the buffer then counted as a position, the angle
matmul had two variable operands, and nothing was pinned. The same Llama-style rotary block converted
with ``amp_compiler.fx`` to FP16: 3.6% of range at position 2000, 16% at 32000 before; 0.04-0.05% now.

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``), is DENY with rule ``policy.high.phase-argument`` and a reason that names the
periodic op, the raw value and the angle's absolute error the target's storage gives at 2000 and
32000 rad; nothing else changes. What it pins is tiny: outer products and elementwise ops on
[positions, dim/2], with K = 1 (rotary) or K = 2-3 (coordinates). On the catalog only llama-rope-long's
K = 1 angle MatMul is a Tensor Core op it pins (low-precision FLOPs 98.29% -> 98.10% of the model's);
the transformers Llama exports compute the angle with a Mul (Cast, Mul, Concat pinned, share unchanged).
On the FX catalog (ResNet-50, MobileNetV2, BERT, GPT-2, Llama small configs) the Tensor Core share is
unchanged: only transformers' Llama has angles, computed with a ``mul``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import ml_dtypes
import networkx as nx
import numpy as np

from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex, dataflow
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, paths_into, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.policy import Category

__all__ = [
    "PhaseArgumentPass", "angle_error", "constant_derived", "is_linear", "is_raw", "linear_paths", "phase_paths",
]

#: The angles (rad) whose storage error the reasons quote: position 2000 and 32000 at frequency 1.
_ANGLES = (2000.0, 32000.0)


def _is_input(vertex: Vertex) -> bool:
    return vertex.node is None and any(s.kind is SlotKind.GRAPH_IN for s in vertex.slots)


def constant_derived(graph: PrecisionGraph, digraph: nx.DiGraph) -> set[int]:
    """The vertices whose values are computed from constants alone: an op reading only constants, or
    only such vertices (an Expand of ``inv_freq``, a Mul of two constants); ``digraph``: the graph's
    :func:`~amp_compiler.core.graph.dataflow` (``inv_freq.float()`` is computed from ``inv_freq``)."""
    derived: set[int] = set()
    stack = [v.id for v in graph.vertices if v.node is not None and v.constants and not digraph.pred[v.id]]
    while stack:
        vid = stack.pop()
        if vid in derived:
            continue
        derived.add(vid)
        for w in digraph.succ[vid]:
            vertex = graph.vertices[w]
            if w not in derived and vertex.node is not None and all(p in derived for p in digraph.pred[w]):
                stack.append(w)
    return derived


def is_raw(vertex: Vertex, digraph: nx.DiGraph, derived: set[int]) -> bool:
    """A position or coordinate: a float graph input, a float computed from integers alone (a Cast of
    position ids: no float input, no constant), or a count (Range) not computed from constants."""
    if _is_input(vertex):
        return True
    if vertex.node is None or vertex.id in derived:
        return False
    policy = vertex.policy
    if policy is not None and policy.positions:
        return True
    return bool(policy is not None and policy.signal and not vertex.constants and not digraph.pred[vertex.id])


def is_linear(vertex: Vertex, digraph: nx.DiGraph, derived: set[int]) -> bool:
    """Linear in its input (the table's ``signal``); a LOW op only as a projection with fixed weights:
    every operand but one a constant or computed from constants alone."""
    policy = vertex.policy
    if vertex.node is None or policy is None or not policy.signal:
        return False
    if policy.category is not Category.LOW:
        return True
    preds = list(digraph.pred[vertex.id])
    variable = [p for p in preds if p not in derived]
    return len(variable) <= 1 and (bool(vertex.constants) or len(preds) > len(variable))


def linear_paths(
    graph: PrecisionGraph, digraph: nx.DiGraph, derived: set[int], is_sink: Callable[[Vertex], bool],
    is_source: Callable[[Vertex], bool],
) -> Iterator[tuple[Vertex, dict[int, Vertex]]]:
    """Per sink (``is_sink``), the vertices on paths into it from sources (``is_source``) through linear ops
    (:func:`is_linear`), each with its source, and the sink itself (low, it would round at its input what
    the path kept FP32), where there is any path; ``digraph``: :func:`~amp_compiler.core.graph.dataflow`,
    ``derived``: :func:`constant_derived`. The phase-argument and position-bias walks."""
    for sink in graph.vertices:
        if sink.node is None or sink.policy is None or not is_sink(sink):
            continue
        path = {vid: graph.vertices[src] for vid, src in paths_into(
            graph, sink, is_source, lambda v: is_linear(v, digraph, derived), digraph).items()}
        if path:
            path.setdefault(sink.id, min(path.values(), key=lambda v: v.id))
            yield sink, path


def phase_paths(graph: PrecisionGraph) -> dict[int, tuple[Vertex, Vertex]]:
    """Per vertex computing a periodic op's argument linearly from a raw value, and per constant-derived
    vertex feeding that computation: (the raw value's vertex, the periodic op's vertex). The periodic op
    reads its argument in FP32 too (aten's sin and cos FOLLOW their neighbours; ONNX's Sin and Cos are
    HIGH already)."""
    digraph = dataflow(graph)
    derived = constant_derived(graph, digraph)
    found: dict[int, tuple[Vertex, Vertex]] = {}
    for sink, path in linear_paths(graph, digraph, derived, lambda v: bool(v.policy and v.policy.periodic),
                                   lambda v: is_raw(v, digraph, derived)):
        # The constants the path reads through ops of its own (Expand, Unsqueeze of inv_freq).
        todo = [(p, origin) for vid, origin in path.items() for p in digraph.pred[vid] if p in derived]
        while todo:
            vid, origin = todo.pop()
            if vid in path:
                continue
            path[vid] = origin
            todo.extend((p, origin) for p in digraph.pred[vid] if p in derived)
        for vid, origin in path.items():
            found.setdefault(vid, (origin, sink))
    return found


def angle_error(dtype: np.dtype, angle: float) -> float:
    """The largest absolute error of storing ``angle`` in ``dtype`` (half its spacing there)."""
    bits = ml_dtypes.finfo(dtype).nmant
    return float(2.0 ** (np.floor(np.log2(angle)) - bits - 1))


@dataclasses.dataclass
class PhaseArgumentPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.PHASE_ARGUMENT}))
        ensure_pinned(self, graph, plan, phase_paths(graph), "computes a periodic op's argument from raw positions")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        name = graph.target.value.upper()
        low = ", ".join(f"{a:.0f} rad to within {angle_error(graph.target.numpy_dtype, a):g}" for a in _ANGLES)
        fp32 = ", ".join(f"{angle_error(np.dtype(np.float32), a):.2g}" for a in _ANGLES)
        for vid, (start, sink) in sorted(phase_paths(graph).items()):
            if not pinnable(plan, vid):
                continue
            op = sink.node.op_type if sink.node is not None else "op"
            what = (f"reads its argument, computed linearly from {start.describe()} (positions or coordinates), in FP32"
                    if vid == sink.id else f"computes the argument of {sink.describe()} linearly from "
                    f"{start.describe()} (positions or coordinates)")
            plan.set_role(
                vid, Role.DENY, Rule.PHASE_ARGUMENT,
                f"FP32: {what}: {name} stores an angle of {low} (FP32: {fp32}), an error the {op} passes on in full",
            )
