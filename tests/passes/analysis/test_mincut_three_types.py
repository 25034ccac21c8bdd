"""Cast placement across three types (FP32, FP16, and BF16 range fallbacks): the exact reduction to the
two-label min-cut finds the optimum of exhaustive search on small graphs."""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir
import pytest

from amp_compiler.core.plan import Role
from amp_compiler.passes.analysis import MinCutPlacementPass
from amp_compiler.passes.analysis.mincut import FP32, LOW, THIRD, _output_penalties, _tensors, colours, total_cast_bytes
from tests.passes.analysis.test_mincut import _painted, _random_graph, free_vertices


def _with_bf16(seed: int):
    """A random graph after painting, with about a third of its fixed-by-role vertices (MatMul, Exp)
    made BF16 (the first always), as a range fallback leaves them."""
    graph, plan = _painted(_random_graph(seed))
    rng = np.random.default_rng(1000 + seed)
    fixed = [v.id for v in graph.vertices if plan.roles[v.id] in (Role.ALLOW, Role.DENY)]
    for k, vid in enumerate(fixed):
        if rng.random() < 0.35 or k == 0:
            plan.decide(vid, ir.DataType.BFLOAT16, plan.role_rules[vid][0], "BF16 for the test")
    return graph, plan


def test_cast_costs_count_one_cast_per_tensor_and_type():
    """A BF16 tensor read by FP32 and FP16 users takes two Casts (6 and 4 bytes per element)."""
    graph, plan = _with_bf16(3)
    tensors = _tensors(graph)
    t = tensors[0]
    users = sorted(t.users)
    colour = {t.producer: THIRD, **{u: (FP32 if i % 2 else LOW) for i, u in enumerate(users)}}
    expected = (t.bytes if len(users) > 1 else 0) + t.bytes * 2 // 3
    assert t.cost(colour) == expected


@pytest.mark.parametrize("seed", range(40))
def test_three_type_min_cut_finds_the_optimum_of_exhaustive_search(seed):
    """With BF16 vertices fixed, every colouring of the free vertices (FP32 or FP16) is tried: the
    pass reaches the cheapest (cast bytes, a Cast between FP32 and a 16-bit type 6 bytes per
    element, between FP16 and BF16 4), and records both totals as recounted."""
    graph, plan = _with_bf16(seed)
    painted = colours(graph, plan)
    assert THIRD in painted.values()
    free = free_vertices(graph, plan)
    tensors = _tensors(graph)
    penalties = _output_penalties(graph, plan, tensors)

    def cost(colour):
        return total_cast_bytes(tensors, colour) + sum(b for v, b in penalties.items() if colour[v] == LOW)

    best = min(
        cost({**painted, **dict(zip(free, choice, strict=True))})
        for choice in itertools.product((FP32, LOW), repeat=len(free))
    )
    MinCutPlacementPass()(graph, plan)
    final = colours(graph, plan)
    assert cost(final) == best
    assert plan.cast_bytes_final == total_cast_bytes(tensors, final)
    assert plan.cast_bytes_painting == total_cast_bytes(tensors, painted)
    assert all(final[v] == THIRD for v, c in painted.items() if c == THIRD)
