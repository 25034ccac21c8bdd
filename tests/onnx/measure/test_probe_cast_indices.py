"""A float input the graph casts to integers and uses as indices (sweep A1, D3: magika 0.5's ``bytes``, floats
0..256 cast to int64 for a OneHot of depth 257) takes the values an integer input of that use takes, as integral
floats: N(0, 1) cast to -3..3 hit 7 of its 257 rows, and the probe never saw the others."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert, emulate
from amp_compiler.runtime.input_kinds import input_kinds
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.runtime.samples import random_samples
from tests.support.onnx_builders import F32, model, tensor, vi, weights

DEPTH = 257


def _one_hot(table: np.ndarray, tail=()):
    """A float ``bytes`` [1, 64] -> Cast(int64) -> OneHot(257) -> MatMul with ``table`` [257, 8] -> y [1, 64, 8]
    (magika's first layer), then ``tail`` (y -> total [1, 8, 4]) if given."""
    nodes = [helper.make_node("Cast", ["bytes"], ["idx"], name="to_int", to=TensorProto.INT64),
             helper.make_node("OneHot", ["idx", "depth", "values"], ["oh"], name="one_hot", axis=-1),
             helper.make_node("MatMul", ["oh", "table"], ["y"], name="dense"), *tail]
    return model(nodes, [vi("bytes", F32, [1, 64])], [vi("total", F32, [1, 8, 4]) if tail else vi("y", F32, [1, 64, 8])],
                 [tensor("depth", np.array(DEPTH, np.int64)), tensor("values", np.array([0, 1], np.float32)),
                  tensor("table", table), tensor("ones", np.ones((64, 4), np.float32))])


def _run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_a_float_cast_to_one_hot_indices_is_drawn_as_integers_below_the_depth():
    """Before: no kind, N(0, 1) (7 distinct indices after the Cast), described as ``N(0, 1)``."""
    m = _one_hot(weights((DEPTH, 8)))
    kind = input_kinds(m)["bytes"]
    assert (kind.kind, kind.bounds, kind.why) == ("index", (0.0, 257.0), "below 257 (OneHot indices), integral floats")
    (sample,) = random_samples(m, informed=True)
    x = sample["bytes"]
    assert x.dtype == np.float32 and (x == np.round(x)).all() and 0 <= x.min() and x.max() <= 256
    assert len(np.unique(x)) > 40  # 64 draws of 257 values, not 7
    result = convert(m, runner=InProcessRunner())
    assert "bytes: below 257 (OneHot indices), integral floats" in result.probe_inputs


def test_rows_whose_sum_overflows_fp16_are_seen_by_the_probe_and_real_bytes_stay_finite():
    """The one-hot rows 8..248 hold 2000, and a MatMul summing 64 positions reaches 1.3e5 (past FP16's 65504):
    N(0, 1) cast to integers reaches rows 0..3 and, negative, 254..256, never those, so that MatMul went to FP16
    and real byte values gave inf."""
    table = weights((DEPTH, 8))
    table[8:249] = 2000.0
    m = _one_hot(table, tail=[helper.make_node("Transpose", ["y"], ["yt"], name="flip", perm=[0, 2, 1]),
                                helper.make_node("MatMul", ["yt", "ones"], ["total"], name="sum")])
    result = convert(m, runner=InProcessRunner())
    feeds = {"bytes": np.full((1, 64), 100.0, np.float32)}
    (ref,), (got,) = _run(m, feeds), _run(emulate(result.model), feeds)
    assert np.isfinite(ref).all() and np.isfinite(got).all()
    assert np.abs(got - ref).max() <= 0.02 * np.abs(ref).max()


@pytest.mark.parametrize("path", ["cast", "floor", "reshape"])
def test_a_float_cast_to_gather_indices_is_drawn_below_the_tables_rows(path):
    """Through a Floor (a bucketed value) or a reshape before the Cast too."""
    before = {"cast": [], "floor": [helper.make_node("Floor", ["tokens"], ["t"], name="floor")],
              "reshape": [helper.make_node("Reshape", ["tokens", "shape"], ["t"], name="reshape")]}[path]
    cast_from = "t" if before else "tokens"
    m = model([*before, helper.make_node("Cast", [cast_from], ["ids"], name="to_int", to=TensorProto.INT64),
               helper.make_node("Gather", ["table", "ids"], ["y"], name="embed")],
              [vi("tokens", F32, [1, 16])], [vi("y", F32, [1, 16, 8] if path != "reshape" else [16, 8])],
              [tensor("table", weights((50, 8))), tensor("shape", np.array([16], np.int64))])
    kind = input_kinds(m)["tokens"]
    assert (kind.kind, kind.bounds, kind.why) == ("ids", (0.0, 50.0), "vocabulary, integral floats")
    (sample,) = random_samples(m, informed=True, seed=1)
    x = sample["tokens"]
    assert x.dtype == np.float32 and (x == np.round(x)).all() and 0 <= x.min() and x.max() < 50
    assert len(np.unique(x)) > 8


def test_a_float_cast_to_another_float_type_stays_a_float_and_fp16_ids_stay_below_the_table():
    """A Cast to FP16 reads no indices: N(0, 1) as before. An FP16 input cast to integers for a table of 4103 rows:
    FP16 steps by 4 past 4096 (4102 rounds to 4104), each drawn one stays below 4103."""
    widened = model([helper.make_node("Cast", ["x"], ["h"], name="narrow", to=TensorProto.FLOAT16),
                     helper.make_node("Cast", ["h"], ["y"], name="widen", to=F32)],
                    [vi("x", F32, [1, 16])], [vi("y", F32, [1, 16])])
    assert "x" not in input_kinds(widened)
    half = model([helper.make_node("Cast", ["tokens"], ["ids"], name="to_int", to=TensorProto.INT64),
                  helper.make_node("Gather", ["table", "ids"], ["y"], name="embed")],
                 [vi("tokens", TensorProto.FLOAT16, [64, 64])], [vi("y", F32, [64, 64, 1])],
                 [tensor("table", weights((4103, 1)))])
    (sample,) = random_samples(half, informed=True)
    x = sample["tokens"]
    assert x.dtype == np.float16 and x.max() < 4103 and x.max() > 4000 and (x == np.round(x)).all()
