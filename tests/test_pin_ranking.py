"""Which nodes --tolerance pins first (amp_compiler.pin_ranking): error removed per Tensor Core FLOP."""

from __future__ import annotations

import pytest
from onnx import helper
from onnx_builders import F32, model, tensor, vi, weights

from amp_compiler.pin_ranking import rank
from amp_compiler.report.model import NodeError


def _chain():
    """conv1 (many FLOPs) -> relu -> conv2 (few) -> sigmoid -> output."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Conv", ["b", "w2"], ["c"], name="conv2"),
        helper.make_node("Sigmoid", ["c"], ["y"], name="sigmoid"),
    ]
    return model(nodes, [vi("x", F32, [1, 4, 8, 8])], [vi("y", F32, [1, 4, 8, 8])],
                 [tensor("w1", weights((4, 4, 1, 1))), tensor("w2", weights((4, 4, 1, 1)))])


ADDED = {0: 1e-3, 1: 1e-4, 2: 5e-4, 3: 2e-4}
FLOPS = [10_000_000, 256, 10_000, 256]
TENSOR_CORE = [True, False, True, False]


def _errors():
    return {i: NodeError(rel_l2=a, max_abs=a, added=a) for i, a in ADDED.items()}


def test_per_flop_pins_cheap_removals_first_and_skips_what_is_rounded_again():
    precision = dict.fromkeys(range(4), "fp16")
    order = rank("per-flop", _chain().graph, _errors(), precision, "fp16", FLOPS, TENSOR_CORE)
    # sigmoid: nothing low precision reads it (free); conv2 (+ the sigmoid after it) per FLOP beats
    # conv1 (+ relu); the relu alone removes nothing (conv2 rounds its input again)
    assert [c.index for c in order] == [3, 2, 0]
    assert order[0].cost == 0
    assert order[1].benefit == pytest.approx(5e-4 + 2e-4) and order[1].cost == 10_000
    assert order[2].benefit == pytest.approx(1e-3 + 1e-4)
    assert "Tensor Core FLOPs kept FP32" in order[2].why(1e-3, 1)


def test_error_ranking_is_the_added_error_alone():
    precision = dict.fromkeys(range(4), "fp16")
    order = rank("error", _chain().graph, _errors(), precision, "fp16", FLOPS, TENSOR_CORE)
    assert [c.index for c in order] == [0, 2, 3, 1]


def test_nodes_already_fp32_are_no_candidates():
    precision = {0: "fp16", 1: "fp16", 2: "fp32", 3: "fp32"}
    order = rank("per-flop", _chain().graph, _errors(), precision, "fp16", FLOPS, TENSOR_CORE)
    # the relu now feeds an FP32 conv2: pinning it removes its own error, at no Tensor Core cost
    assert [c.index for c in order] == [1, 0]
