"""Errors folded where the models run: each (FP32, converted) pair of tensors becomes a few sums in
the runner (equal to :class:`ErrorStats`' within float rounding); only they and the graph outputs
asked for come back."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler.core.tensor_error import ErrorStats
from amp_compiler.runtime import child_folds
from amp_compiler.runtime.runner import ChildRunner, InProcessRunner


def _stats(sums: list[float]) -> ErrorStats:
    from amp_compiler.onnx.tolerance.refine import _error_stats

    return _error_stats(sums)


def _close(a: ErrorStats, b: ErrorStats) -> bool:
    return all(x == pytest.approx(y, rel=1e-12, abs=1e-300) for x, y in
               zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True))


@pytest.mark.parametrize("special", ["none", "inf-got", "nan-got", "inf-both", "nan-ref", "nan-both", "inf-other-sign",
                                     "all-nan", "empty"])
@pytest.mark.parametrize("chunk", [7, 1 << 20])
def test_error_sums_are_error_stats(special, chunk, monkeypatch):
    monkeypatch.setattr(child_folds, "_ERROR_CHUNK", chunk)
    rng = np.random.default_rng(3)
    pairs = []
    for scale in (1e-3, 1.0, 1e4):
        r = (rng.standard_normal((6, 9)) * scale).astype(np.float32)
        pairs.append((r, (r + rng.standard_normal(r.shape).astype(np.float32) * scale * 1e-3).astype(np.float32)))
    if special == "inf-got":
        pairs[1][1][2, 3] = np.inf
    elif special == "nan-got":
        pairs[1][1][2, 3] = np.nan
    elif special == "inf-both":
        pairs[1][0][0, 0] = pairs[1][1][0, 0] = -np.inf
    elif special == "nan-ref":
        pairs[2][0][1, 1] = np.nan
    elif special == "nan-both":  # FP32's own NaN kept (before: NaN != NaN, an infinite error in both copies)
        pairs[2][0][1, 1] = pairs[2][1][1, 1] = np.nan
        pairs[0][0][0, 2] = pairs[0][1][0, 2] = np.nan
    elif special == "inf-other-sign":
        pairs[1][0][0, 0], pairs[1][1][0, 0] = np.inf, -np.inf
    elif special == "all-nan":
        pairs.append((np.full(4, np.nan, np.float32), np.full(4, np.nan, np.float32)))
    elif special == "empty":
        pairs.append((np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32)))
    expected, sums = ErrorStats(), None
    for r, g in pairs:
        expected.add(r, g)
        new = child_folds.error_sums(np, r, g)
        assert new is not None
        sums = new if sums is None else child_folds.add_sums(sums, new)
    assert sums is not None and _close(_stats(sums), expected)
    assert expected.finite is (special in ("none", "inf-both", "nan-both", "all-nan", "empty"))
    assert child_folds.error_sums(np, np.zeros(3), np.zeros(4)) is None  # shapes differ: nothing to compare


def _models():
    """The reference x -> Sin -> a -> Mul(3) -> y, and a 'converted' one whose a is rounded to FP16."""
    f = TensorProto.FLOAT
    three = helper.make_tensor("three", f, [], [3.0])

    def model(nodes):
        return helper.make_model(helper.make_graph(
            nodes, "m", [helper.make_tensor_value_info("x", f, None)],
            [helper.make_tensor_value_info("y", f, None), helper.make_tensor_value_info("a", f, None)], [three],
        ), opset_imports=[helper.make_opsetid("", 17)])

    reference = model([helper.make_node("Sin", ["x"], ["a"]), helper.make_node("Mul", ["a", "three"], ["y"])])
    converted = model([helper.make_node("Sin", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["h"], to=10),
                       helper.make_node("Cast", ["h"], ["a"], to=1), helper.make_node("Mul", ["a", "three"], ["y"])])
    return reference, converted


@pytest.mark.parametrize("runner_type", [InProcessRunner, ChildRunner])
def test_compare_sends_back_sums_and_the_outputs_asked_for(runner_type):
    reference, converted = _models()
    xs = [np.linspace(-3, 3, 40, dtype=np.float32).reshape(5, 8) * k for k in (1, 2)]
    expected = ErrorStats()
    with runner_type() as runner:
        ref, conv = runner.load(reference), runner.load(converted)
        for x in xs:
            expected.add(ref.run({"x": x})[1], conv.run({"x": x})[1])  # the tensors a, as they come back
            r, g = runner.compare([ref], [conv], {"x": x, "unused": x}, [("a", "a"), ("y", "y")], [("y", "y")], 9)
            assert len(r) == len(g) == 1  # the output asked for, nothing else
            np.testing.assert_allclose(r[0], np.sin(x) * 3, rtol=1e-6)
            np.testing.assert_allclose(g[0], np.sin(x).astype(np.float16).astype(np.float32) * 3, rtol=1e-6)
        sums = runner.errors(9)
        assert runner.errors(9) == {}  # answered once, then forgotten
    assert set(sums) == {"a", "y"}
    assert _close(_stats(sums["a"]), expected) and expected.diff2 > 0



@dataclasses.dataclass
class _Named:
    name: str


class _Piece:
    """An onnxruntime session's stand-in: each output ``inp * factor``, its runs recorded in ``log``."""

    def __init__(self, name: str, inp: str, outs: dict[str, float], log: list[str]):
        self.name, self.inp, self.outs, self.log = name, inp, outs, log

    def get_inputs(self):
        return [_Named(self.inp)]

    def get_outputs(self):
        return [_Named(o) for o in self.outs]

    def run(self, _names, feeds, _options):
        self.log.append(self.name)
        return [feeds[self.inp] * np.float32(f) for f in self.outs.values()]


@pytest.mark.parametrize("converted_pieces", [3, 1])
def test_compare_runs_a_converted_piece_as_soon_as_its_pairs_reference_halves_are_out(converted_pieces):
    from amp_compiler.runtime.child import compare_chains

    log: list[str] = []
    reference = [_Piece("r0", "x", {"a": 2}, log), _Piece("r1", "a", {"b": 3}, log), _Piece("r2", "b", {"y": 0.5}, log)]
    if converted_pieces == 3:
        converted = [_Piece("c0", "x", {"a": 2}, log), _Piece("c1", "a", {"b": 3.001}, log),
                     _Piece("c2", "b", {"y": 0.5}, log)]
    else:  # one piece: it waits for every reference piece
        converted = [_Piece("c", "x", {"a": 2, "b": 6.002, "y": 3.001}, log)]
    x = np.linspace(-1, 1, 12, dtype=np.float32)
    sums: dict[str, list] = {}
    kept = compare_chains(np, reference, converted, ({"x": x}, {"x": x}), [["a", "a"], ["b", "b"], ["y", "y"]],
                          [["y", "y"]], None, sums)
    assert log == (["r0", "c0", "r1", "c1", "r2", "c2"] if converted_pieces == 3 else ["r0", "r1", "r2", "c"])
    assert len(kept) == 2
    np.testing.assert_array_equal(kept[0], x * np.float32(2) * np.float32(3) * np.float32(0.5))
    expected = ErrorStats()
    b = x * np.float32(2) * np.float32(3.001) if converted_pieces == 3 else x * np.float32(6.002)
    expected.add(x * np.float32(2) * np.float32(3), b)
    assert set(sums) == {"a", "b", "y"} and sums["a"][0] == 0
    assert _close(_stats(sums["b"]), expected) and expected.diff2 > 0
