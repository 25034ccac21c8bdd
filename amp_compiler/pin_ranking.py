"""Which nodes ``--tolerance`` pins first: the most error removed per Tensor Core FLOP kept in FP32.

Ranking nodes by the error they add alone pins what is cheap to find, not what is cheap to keep: on
deep CNNs every convolution adds a little, and pinning them by added error gave up most Tensor Core
FLOPs (PP-OCRv4's recogniser kept 1% in FP16). Here a candidate's benefit is the error pinning it
removes and its cost the Tensor Core FLOPs that then run in FP32:

- a Tensor Core op (Conv, MatMul, ...) pinned to FP32 takes the numeric ops after it along (painting
  spreads FP32 forward up to the next Tensor Core op), so its benefit is the error added by it and
  by them, its cost its FLOPs;
- a cheap op whose result no low-precision op reads (a Sigmoid before an output, an op before an
  FP32 region) removes its own added error at no Tensor Core cost;
- a cheap op between low-precision ops removes nothing alone (its result is rounded again for the
  next one) and is no candidate.

Candidates go by benefit per FLOP (cheap ones first), then by benefit. ``error`` ranking, the one
used before, orders every low-precision node by its added error alone (kept for comparison).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import onnx

from amp_compiler.report.model import NodeError

RANKINGS = ("per-flop", "error")


@dataclasses.dataclass(frozen=True)
class Candidate:
    index: int  # position in the FP32 model's main graph
    benefit: float  # relative L2 error pinning it removes (estimated: the error added where it pins)
    cost: int  # Tensor Core FLOPs it keeps in FP32

    def why(self, tolerance: float, round_: int) -> str:
        flops = f"{self.cost:.3g} Tensor Core FLOPs" if self.cost else "no Tensor Core FLOPs"
        return (f"pinned by --tolerance {tolerance:g}: removes about {self.benefit:.2e} relative error for "
                f"{flops} kept FP32 (round {round_})")


def rank(
    ranking: str, graph: onnx.GraphProto, errors: Mapping[int, NodeError], precision: Mapping[int, str],
    low: str, flops: Sequence[int], tensor_core: Sequence[bool],
) -> list[Candidate]:
    """The candidates of one refinement round, best first. ``errors``, ``precision`` (the current
    conversion's, ``low`` for low precision), ``flops`` and ``tensor_core`` are by main-graph position."""
    if ranking == "error":
        found = [Candidate(i, e.added, flops[i] if tensor_core[i] else 0)
                 for i, e in errors.items() if precision.get(i) == low and e.added > 0]
        return sorted(found, key=lambda c: (-c.benefit, c.index))
    nodes = list(graph.node)
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)

    def low_readers(i: int) -> list[int]:
        return [k for name in nodes[i].output for k in readers.get(name, []) if precision.get(k) == low]

    def followers(i: int) -> set[int]:
        """The low-precision non-Tensor-Core nodes after ``i``, up to the next Tensor Core op."""
        seen: set[int] = set()
        stack = [i]
        while stack:
            for k in low_readers(stack.pop()):
                if k not in seen and not tensor_core[k]:
                    seen.add(k)
                    stack.append(k)
        return seen

    found = []
    for i, e in errors.items():
        if precision.get(i) != low:
            continue
        if tensor_core[i]:
            benefit = sum(max(errors[j].added, 0.0) for j in {i} | followers(i) if j in errors)
            cost = flops[i]
        elif not low_readers(i):
            benefit, cost = max(e.added, 0.0), 0
        else:
            continue
        if benefit > 0:
            found.append(Candidate(i, benefit, cost))
    return sorted(found, key=lambda c: (-c.benefit / max(c.cost, 1), -c.benefit, c.index))
