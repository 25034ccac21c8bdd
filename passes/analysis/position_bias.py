"""Position biases: keep FP32 the linear path from positions into a Softmax's logits (ALiBi).

ALiBi attention (BLOOM, Falcon-ALiBi, MPT) adds to the attention scores a bias linear in the key (or
query-key) positions, ``slope_h * position``, built from integers: BLOOM's ``cumsum(mask) - 1`` cast to
float, MPT's ``arange(1 - S, 1)``. It reaches ``slope * S`` logits: 1024 at 2048 tokens, 8192 at 16384
for slope 0.5. A softmax is shift-invariant per row but reads the absolute differences of its logits,
and FP16 stores a bias of magnitude B, and the sum ``scores + bias``, to within B * 2^-11 (0.5 logits at
1024, 4 at 8192): a probability moves by a factor up to e^4. Painting put the position Cast, the slope
Mul and the score Add in FP16 (between the score and value MatMuls), and the Softmax too where its kernel
takes FP16 (onnxruntime CUDA). Measured under exact FP16 emulation on one BLOOM attention (8 heads,
``build_alibi_tensor``, the last query's probabilities): 16.9% of range at 2048 tokens, 33.6% at 4096,
48.8% at 16384 with the path FP16, the block output 6.1%, 11.7%, 18.9%; with this pass 0.02-0.06% and
0.03-0.04% at 128-16384 tokens, the 6 MatMuls still FP16 (a 2-layer BLOOM export: 13/13 Tensor Core ops
low). The range probe cannot see it: nothing overflows, and it runs at 128 tokens.

Found on the precision graph, backwards from every op the table marks ``logit_differences`` (Softmax,
LogSoftmax) through ops linear in their input (:func:`~amp_compiler.passes.analysis.phase.is_linear`,
the phase-argument walk) to *positions*: an op that counts (the table's ``positions``: Range, CumSum)
not computed from constants alone, or an op computing a float from integers such a count produced
(:attr:`~amp_compiler.core.graph.PrecisionGraph.counted`: BLOOM's Cast, FX's mixed-type ``slopes *
arange``), or from the integers of a graph input that holds positions
(:func:`~amp_compiler.core.positions.is_position_input`: subtracted from itself, ``p_i - p_j``, or named like
``position_ids``/``cache_position``/``positions``, never like a mask). A decoder given its positions as
an input casts them to float at the positions of a long prompt or a KV-cache step: FP16 holds integers
exactly only up to 2048 and rounds 3000-8000 to multiples of 2 and 4. Measured under exact FP16
emulation (sweep S): Cast(position_ids), |p_i - p_j|, x slope, + x @ x^T, Softmax, @ x: 3.7% of range at
positions 2040.., 7.6% at 8000.. with that path FP16, 0.03-0.04% with it FP32; a 1-layer ALiBi LM with
``position_ids`` explicit: 23.4% and 39% of argmax tokens flipped at 3000.., 41.6% and 59% at 8000.., now
0.03% and none, its 4 MatMuls still FP16. Not positions: a raw float graph input (a classifier's features
into one Linear and a Softmax), a Cast of another integer graph input (an attention mask: ``(1 - mask) *
-10000`` is two-valued, 0 and a value whose exponential is 0, exact in FP16: pinning it saves nothing), a
comparison of positions (a causal mask)
and a Gather of a learned table by position buckets (T5's relative bias: learned values, small). The
path includes the Add that combines the bias with the scores and the Softmax itself; the scores'
MatMul stays low (two variable operands), so the Cast to FP32 the Softmax needs moves before that Add.
The slopes, an initializer the pinned Mul reads, stay FP32 with it; other constant-derived operands are
not followed (see :func:`position_bias_paths`).

An op that adds only some of its inputs to its logits (the table's ``logit_inputs``: aten
``scaled_dot_product_attention``'s ``attn_mask``, added to ``q @ k^T`` inside) is walked from the producers of
those inputs alone, and is not pinned itself: its products stay low and the bias, computed in FP32, is cast
to FP16 at its input (FP16 SDPA takes an FP16 mask). In FX the bias was painted FP16 between the attention
products: an ALiBi attention (4 heads, slopes 2^-2..2^-8) over ``keys.float()`` (integer positions, counted
by ``fx/graph/integer_flow.py``) into SDPA was off by 8.7% of its output's range at positions 2040-3000 and
10.4% at 5000-8000 in FP16; 0.04% with the Cast, distance, slope Mul and mask Add FP32, every product FP16.

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``), is DENY with rule ``policy.high.position-bias`` and a reason that names the softmax,
the position source and the bias's storage error at 2048 and 16384 positions x slope 0.5; nothing else
changes. No Tensor Core op is pinned unless it is a projection with fixed weights of the positions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex, dataflow
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, paths_into, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.passes.analysis.phase import angle_error, constant_derived, is_linear, linear_paths

__all__ = ["PositionBiasPass", "position_bias_paths"]

#: The biases (logits) whose storage error the reasons quote: slope 0.5 x 2048 and x 16384 positions.
_BIASES = (1024.0, 8192.0)


def _is_position(vertex: Vertex, graph: PrecisionGraph, derived: set[int]) -> bool:
    """A count (Range, CumSum) not computed from constants alone, or a float computed from such a count's integers
    or from an integer graph input's that holds positions (``graph.counted``)."""
    if vertex.node is None:
        return False  # a float graph input: features as often as positions (integer ones: their Casts, counted)
    if vertex.node in graph.counted:
        return True
    policy = vertex.policy
    return vertex.id not in derived and policy is not None and policy.positions


def position_bias_paths(graph: PrecisionGraph) -> dict[int, tuple[Vertex, Vertex]]:
    """Per vertex adding a bias computed linearly from positions to a ``logit_differences`` op's logits (the
    op itself included): (the position's vertex, the op's vertex). Unlike the phase-argument walk, the
    constant-derived operands of the path are not added: ``constant_derived`` counts as constant what a Gather
    computes from a constant table and integer inputs it cannot see (the token embedding, so every hidden
    state of a BLOOM), and a bias's slopes are initializers its pinned Mul reads in FP32 anyway."""
    digraph = dataflow(graph)
    derived = constant_derived(graph, digraph)
    found: dict[int, tuple[Vertex, Vertex]] = {}
    for sink, path in linear_paths(graph, digraph, derived, lambda v: bool(v.policy and v.policy.logit_differences
                                                                               and not v.policy.logit_inputs),
                                   lambda v: _is_position(v, graph, derived)):
        for vid, origin in path.items():
            found.setdefault(vid, (origin, sink))
    # An op adding some of its inputs to its logits (attention's attn_mask): the walk starts from the producers of
    # those inputs, and the op itself stays as it is (its mask is cast at its input; its products stay low).
    for sink in graph.vertices:
        if sink.node is None or sink.policy is None or not sink.policy.logit_differences:
            continue
        starts = _producers(graph, sink, sink.policy.logit_inputs)
        if not starts:
            continue
        for vid, src in paths_into(graph, sink, lambda v: _is_position(v, graph, derived),
                                   lambda v: is_linear(v, digraph, derived), digraph, starts).items():
            found.setdefault(vid, (graph.vertices[src], sink))
    return found


def _producers(graph: PrecisionGraph, sink: Vertex, inputs: tuple[int, ...]) -> list[int]:
    """The vertices defining the tensors ``sink``'s op reads at ``inputs`` (none when ``inputs`` is empty)."""
    values = [s.value for s in sink.slots if s.kind is SlotKind.NODE_IN and s.index in inputs and s.value is not None]
    return [p for p in graph.digraph.pred[sink.id]
            if any(any(v is w for w in values) for v in graph.digraph.edges[p, sink.id]["values"])]


@dataclasses.dataclass
class PositionBiasPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        paths = position_bias_paths(graph)
        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.POSITION_BIAS}), paths)
        ensure_pinned(self, graph, plan, paths, "adds a bias computed from positions to a softmax's logits")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        name = graph.target.value.upper()
        low = ", ".join(f"{b:.0f} to within {angle_error(graph.target.numpy_dtype, b):g}" for b in _BIASES)
        fp32 = ", ".join(f"{angle_error(np.dtype(np.float32), b):.2g}" for b in _BIASES)
        for vid, (start, sink) in sorted(position_bias_paths(graph).items()):
            if not pinnable(plan, vid):
                continue
            op = sink.node.op_type if sink.node is not None else "op"
            what = (f"reads logits biased linearly by {start.describe()} (positions) in FP32" if vid == sink.id
                    else f"adds a bias computed linearly from {start.describe()} (positions) to the logits of "
                    f"{sink.describe()}")
            plan.set_role(
                vid, Role.DENY, Rule.POSITION_BIAS,
                f"FP32: {what}: {name} stores a bias of {low} logits (slope 0.5 x 2048 and 16384 positions; "
                f"FP32: {fp32}), an error the {op} passes on to its probabilities as a factor e^error",
            )
