"""Signal paths: keep FP32 the linear path from a raw graph input into an op that reads its dynamic range.

An audio front end computes a spectrum with filters over the raw samples (an STFT or a constant-Q
transform as convolutions, a mel filterbank as a MatMul), takes its magnitude or power, then its
Log. Storing the signal, or any linear transform of it, in FP16 adds rounding noise about
6.02 * 11 + 1.76 = 68 dB below its peak (50 dB in BF16): white noise that leaks into every
frequency bin, so quiet bins (tens of dB below the loudest) read the noise floor instead of their
value, and the Log shows it at full scale. Measured on a music-transcription CNN: 3.6% of its note
probabilities' range with the front end in FP16, 0.07% with it in FP32 (92% of the convolution
FLOPs still FP16). Range rules cannot see it: nothing overflows or flushes.

Guarantees (checked by ``ensures``): every free vertex on a path from a float graph input to the
input of a ``dynamic_range`` op (Log) whose vertices are all ``signal`` ops of the policy table
(linear in their signal, or a magnitude/power of it; a LOW op only when it reads a constant, i.e.
is a filter) is pinned to FP32 (DENY, rule ``policy.high.signal-path``) with the input and the op
in its reason, unless the user forced it low (``user.allow``); nothing else changes. Paths that
meet another op (an activation, a normalization, attention) are learned features, not a raw
signal, and are left alone. The walk follows :func:`~amp_compiler.core.graph.dataflow`, through a
Cast between float types (``wave.float()``), whose input and output lie in two vertices with no
tensor edge between them: the walk stopped there and the path was not found. An STFT front end (a
conv1d with a constant filter bank, power, log) converted with ``amp_compiler.fx`` to FP16: 7.2% of
range with it FP16, 0.03% with it FP32 (BF16: 15%, 0.14%).
"""

from __future__ import annotations

import dataclasses

import ml_dtypes

from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex, dataflow
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, paths_into, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.policy import Category

__all__ = ["SignalPathPass"]


def _is_input(vertex: Vertex) -> bool:
    return vertex.node is None and any(s.kind is SlotKind.GRAPH_IN for s in vertex.slots)


def _is_signal(vertex: Vertex) -> bool:
    policy = vertex.policy
    if vertex.node is None or policy is None or not policy.signal:
        return False
    return policy.category is not Category.LOW or bool(vertex.constants)


def noise_floor_db(graph: PrecisionGraph) -> float:
    """How far below a full-scale signal the rounding noise of the target's storage lies (dB)."""
    bits = ml_dtypes.finfo(graph.target.numpy_dtype).nmant + 1
    return 6.02 * bits + 1.76


def signal_paths(graph: PrecisionGraph) -> dict[int, tuple[Vertex, Vertex]]:
    """Per vertex on a raw signal path into a ``dynamic_range`` op: (the graph input, the op)."""
    found: dict[int, tuple[Vertex, Vertex]] = {}
    digraph = dataflow(graph)  # through a Cast between float types too
    for sink in graph.vertices:
        if sink.policy is None or not sink.policy.dynamic_range or sink.node is None:
            continue
        for vid, start in paths_into(graph, sink, _is_input, _is_signal, digraph).items():
            found.setdefault(vid, (graph.vertices[start], sink))
    return found


@dataclasses.dataclass
class SignalPathPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.SIGNAL_PATH}))
        paths = signal_paths(graph)
        ensure_pinned(self, graph, plan, paths, "is on a raw signal path into a Log")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        db = noise_floor_db(graph)
        name = graph.target.value.upper()
        for vid, (start, sink) in sorted(signal_paths(graph).items()):
            if not pinnable(plan, vid):
                continue
            plan.set_role(
                vid, Role.DENY, Rule.SIGNAL_PATH,
                f"FP32: on the linear signal path from {start.describe()} into {sink.describe()}: {name} "
                f"storage adds a noise floor {db:.0f} dB below the signal's peak, which the "
                f"{sink.node.op_type if sink.node is not None else 'op'} turns into large errors for quiet components",
            )
