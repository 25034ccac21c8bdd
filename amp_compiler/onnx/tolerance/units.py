"""Units: the disjoint groups of low-precision nodes that ``--tolerance`` keeps low or pins together.

Pinning one Tensor Core op alone removes little error: the cheap ops after it (bias Add, activation,
residual Add, normalization) round its result again. So the refinement decides per *unit*: a root
and the cheap low-precision nodes it feeds, up to the next Tensor Core op.

- Roots: every low-precision Tensor Core op (Conv, MatMul, Gemm, ...), and every low-precision node
  that no low-precision node feeds (a model's stem, a cheap op after an FP32 region).
- Every other low-precision node joins the unit of its nearest low-precision producer (fewest cheap
  nodes back to a root; on a tie, the producer latest in the graph): a residual Add joins the
  projection that feeds it, not the first layer of the residual stream.

Guarantees: every low-precision node of the main graph is in exactly one unit; a unit's first node
is its root; a unit's Tensor Core FLOPs are its root's (0 for a cheap root).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

import onnx

__all__ = ["Unit", "partition"]


@dataclasses.dataclass(frozen=True)
class Unit:
    nodes: tuple[int, ...]  # positions in the main graph, the root first
    tensor_core_flops: int  # FLOPs of the root when it is a Tensor Core op, else 0

    @property
    def root(self) -> int:
        return self.nodes[0]


def partition(
    graph: onnx.GraphProto, low: Collection[int], tensor_core: Sequence[bool], flops: Sequence[int]
) -> list[Unit]:
    """The units of the main graph's low-precision nodes ``low`` (positions), whose Tensor Core ops
    ``tensor_core`` marks (see module doc). Nodes are taken in graph order, which is topological."""
    producer: dict[str, int] = {}
    for i, node in enumerate(graph.node):
        for name in node.output:
            if name:
                producer[name] = i
    unit_of: dict[int, int] = {}
    depth: dict[int, int] = {}
    members: list[list[int]] = []
    for i, node in enumerate(graph.node):
        if i not in low:
            continue
        feeders = {producer[x] for x in node.input if x in producer and producer[x] in unit_of}
        if tensor_core[i] or not feeders:
            unit_of[i], depth[i] = len(members), 0
            members.append([i])
            continue
        nearest = min(feeders, key=lambda p: (depth[p], -p))
        unit_of[i], depth[i] = unit_of[nearest], depth[nearest] + 1
        members[unit_of[i]].append(i)
    return [Unit(tuple(m), flops[m[0]] if tensor_core[m[0]] else 0) for m in members]
