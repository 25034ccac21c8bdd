"""Cast placement by minimum cut: known optima on small graphs, never worse than painting."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.checks import compare, run_onnxruntime, validate
from models import catalog
from onnx_builders import F32, model, tensor, vi, weights



def _slice_then_matmul():
    """A big FP32 graph input, sliced down 64x before a MatMul: cast after the Slice, not before."""
    return model(
        [
            helper.make_node("Slice", ["x", "starts", "ends"], ["s"], name="slice"),
            helper.make_node("MatMul", ["s", "w"], ["y"], name="mm"),
        ],
        [vi("x", F32, [64, 64])], [vi("y", F32, [8, 8])],
        [
            tensor("starts", np.array([0, 0], np.int64)), tensor("ends", np.array([8, 8], np.int64)),
            tensor("w", weights((8, 8))),
        ],
    )


def test_cast_goes_to_the_smaller_side_of_a_slice():
    m = _slice_then_matmul()
    painted = convert(m, placement="paint")
    placed = convert(m)
    d = {x.node: x for x in placed.decisions}
    assert {x.node: x for x in painted.decisions}["slice"].precision == "fp16"  # painting: cast 64x64
    assert d["slice"].precision == "fp32" and d["slice"].rule == "placement.min-cut"
    assert placed.cast_bytes_painting == (64 * 64 + 8 * 8) * 6
    assert placed.cast_bytes == (8 * 8 + 8 * 8) * 6
    validate(placed.model)
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    assert compare("y", run_onnxruntime(m, {"x": x})[0], run_onnxruntime(placed.model, {"x": x})[0]).cosine > 0.999


def test_one_cast_serves_every_user_of_a_tensor():
    """An FP32 tensor read by three low-precision ops needs one Cast, not three: the cut pays it once."""
    m = model(
        [
            helper.make_node("Exp", ["x"], ["e"], name="exp"),
            helper.make_node("MatMul", ["e", "w"], ["a"], name="mm1"),
            helper.make_node("MatMul", ["e", "w"], ["b"], name="mm2"),
            helper.make_node("MatMul", ["e", "w"], ["c"], name="mm3"),
            helper.make_node("Sum", ["a", "b", "c"], ["y"], name="sum"),
        ],
        [vi("x", F32, [4, 4])], [vi("y", F32, [4, 4])], [tensor("w", weights((4, 4)))],
    )
    r = convert(m)
    assert r.cast_bytes <= r.cast_bytes_painting
    to_low = [n for n in r.model.graph.node if n.op_type == "Cast" and n.input[0] == "e"]
    assert len(to_low) == 1


def test_painting_only_is_still_available_and_unknown_placement_is_an_error():
    from amp_compiler.errors import OptionError

    assert convert(_slice_then_matmul(), placement="paint").cast_bytes is None
    with pytest.raises(OptionError, match="placement"):
        convert(_slice_then_matmul(), placement="greedy")


@pytest.mark.parametrize("entry", catalog.entries("small"), ids=lambda e: e.name)
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_never_more_cast_bytes_than_painting(entry, target):
    r = convert(catalog.load(entry), target=target)
    assert r.cast_bytes is not None and r.cast_bytes_painting is not None
    assert r.cast_bytes <= r.cast_bytes_painting
