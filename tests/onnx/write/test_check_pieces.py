"""The load check's pieces (amp_compiler.onnx.write.check_pieces) and the check on them (amp_compiler.onnx.write.load_check).

A large output is loaded in overlapping pieces, each distinct piece once: every stretch of
OVERLAP + 1 consecutive nodes is inside one piece, the pieces are valid models onnxruntime loads,
repeated layers give one piece, and the crash the check exists for is still caught.
"""

from __future__ import annotations

import contextlib
import importlib
import io
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.errors import OutputCheckError
from amp_compiler.onnx.write.check_pieces import (
    _FAR,
    OVERLAP,
    SPAN,
    STAND_IN_FILE,
    STAND_IN_MIN_BYTES,
    load_pieces,
    write_stand_in,
)
from amp_compiler.onnx.write.load_check import OutputLoadCheck, check_output_loads
from amp_compiler.runtime.budget import RunBudget
from amp_compiler.runtime.runner import ChildRunner, InProcessRunner
from benchmarks.generate import transformer_model
from tests.support.onnx_builders import F16, F32, model, tensor, vi, weights

BUDGET = RunBudget(seconds=60, memory=2 << 30)


def _names(m: onnx.ModelProto) -> list[str]:
    return [n.name for n in m.graph.node]


def _loads(m: onnx.ModelProto) -> None:
    with InProcessRunner() as runner:
        runner.load(m).close()


def _chain(n: int, elem: int = F32) -> onnx.ModelProto:
    """x -> n Adds of distinct scalars -> y: no two nodes alike, so no piece repeats another."""
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    nodes, inits, x = [], [], "x"
    for i in range(n):
        inits.append(tensor(f"c{i}", np.array(i + 1, np_type)))
        nodes.append(helper.make_node("Add", [x, f"c{i}"], [f"t{i}"], name=f"add{i}"))
        x = f"t{i}"
    nodes[-1].output[0] = "y"
    return model(nodes, [vi("x", elem, ["B", 4])], [vi("y", elem, ["B", 4])], inits)


def test_a_small_model_is_loaded_whole():
    result = convert(_chain(SPAN + OVERLAP), probe=False)
    assert load_pieces(result.model, result.value_types) is None


def test_every_stretch_of_overlap_plus_one_nodes_is_inside_one_piece():
    result = convert(_chain(400), probe=False)
    pieces = load_pieces(result.model, result.value_types)
    assert pieces is not None and len(pieces) > 2
    order = _names(result.model)
    covered = [set(_names(p)) for p in pieces]
    assert set().union(*covered) == set(order)
    for i in range(len(order) - OVERLAP):
        assert any(set(order[i:i + OVERLAP + 1]) <= names for names in covered), i
    assert all(len(p.graph.node) < _FAR for p in pieces)  # offsets up to _FAR are told apart
    for piece in pieces:  # pieces are valid models: symbolic borders typed, constants with them
        onnx.checker.check_model(piece, full_check=True)
        _loads(piece)


def test_repeated_layers_are_loaded_once():
    result = convert(transformer_model(blocks=40, batch="B"), probe=False)
    assert len(result.model.graph.node) > 1000
    pieces = load_pieces(result.model, result.value_types)
    assert pieces is not None and len(pieces) <= 4
    assert sum(len(p.graph.node) for p in pieces) < len(result.model.graph.node) // 3
    for piece in pieces:
        onnx.checker.check_model(piece, full_check=True)
        _loads(piece)


def _crashing(tmp_path: Path, width: int = 3) -> Path:
    """A long FP16 chain with, in its middle, the pattern onnxruntime 1.32 crashes on: a batch-moving
    Transpose of a graph input into a MatMul by a 2-D weight (its CPU provider, which has no FP16
    MatMul, puts a Cast between them); ``width``: the weight's columns (4096: a stand-in in the pieces)."""
    head = [helper.make_node("Relu", [f"r{i}"], [f"r{i + 1}"], name=f"relu{i}") for i in range(150)]
    middle = [
        helper.make_node("Transpose", ["z"], ["t"], perm=[1, 0, 2], name="transpose"),
        helper.make_node("MatMul", ["t", "w"], ["m"], name="proj"),
        helper.make_node("Add", ["r150", "m"], ["s0"], name="join"),
    ]
    tail = [helper.make_node("Relu", [f"s{i}"], [f"s{i + 1}"], name=f"tail{i}") for i in range(150)]
    m = model(head + middle + tail, [vi("r0", F16, [2, 5, width]), vi("z", F16, [5, 2, 8])],
              [vi("s150", F16, [2, 5, width])], [tensor("w", weights((8, width)).astype(np.float16))],
              opset=17, ir_version=8)
    path = tmp_path / "crash.onnx"
    onnx.save(m, path)
    return path


@pytest.mark.parametrize("width", [3, 4096], ids=["small-weight", "stand-in-weight"])
def test_the_crash_pattern_in_a_large_model_is_caught_by_its_pieces(tmp_path, width):
    path = _crashing(tmp_path, width)
    m = onnx.load(path)
    types = convert(m, target="fp16", keep_io_types=False, probe=False).value_types
    pieces = load_pieces(m, types)
    assert pieces is not None and len(pieces) > 2
    assert sum(1 for p in pieces if "proj" in _names(p)) == 1
    stand_ins = [t.name for p in pieces for t in p.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert stand_ins == (["w"] if width == 4096 else [])
    good = tmp_path / "good.onnx"
    onnx.save(_chain(10), good)
    with ChildRunner(BUDGET) as runner, pytest.raises(OutputCheckError, match="crashes onnxruntime"):
        check_output_loads(path, good, BUDGET, runner, pieces)


def test_a_piece_that_fails_where_the_whole_model_loads_is_no_refusal(tmp_path):
    """A failure in a piece is confirmed on the whole output before it is refused."""
    fine = tmp_path / "fine.onnx"
    onnx.save(_chain(10), fine)
    crashing = onnx.load(_crashing(tmp_path))
    with ChildRunner(BUDGET) as runner:
        assert check_output_loads(fine, fine, BUDGET, runner, [crashing]) is None


def test_an_output_with_external_data_is_checked_in_pieces_made_before_its_weights(tmp_path, monkeypatch):
    """The pieces of an output whose weights are still on disk are made from its graph: each large
    weight a stand-in of its size (zeros from a sparse file), none read from the input or the output."""
    src = tmp_path / "in" / "m.onnx"
    src.parent.mkdir()
    big = transformer_model(blocks=12, hidden=128, batch="B")  # FFN weights of 128 KiB in FP16, others 32
    onnx.save(big, src, save_as_external_data=True, location="m.onnx.data", size_threshold=1024)
    result = convert(src, probe=False)
    assert result.output is not None  # weights left on disk, written to <output>.data
    made: list[list[onnx.ModelProto] | None] = []

    def spy(*args, **kwargs):
        pieces = load_pieces(*args, **kwargs)
        made.append(pieces)
        return pieces

    monkeypatch.setattr("amp_compiler.onnx.write.load_check.load_pieces", spy)
    with ChildRunner(BUDGET) as runner:
        check = OutputLoadCheck(src, BUDGET, runner)
        check.start(result)
        result.save(tmp_path / "out.onnx", verify=check)
    assert check.warnings == [] and (tmp_path / "out.onnx.data").exists()
    pieces = made[0]
    assert pieces is not None and len(pieces) <= 4
    weights = [t for p in pieces for t in p.graph.initializer if len(t.dims) == 2]
    sizes = [int(np.prod(t.dims)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize for t in weights]
    assert {s >= STAND_IN_MIN_BYTES for s in sizes} == {True, False}
    for t, size in zip(weights, sizes):
        if size >= STAND_IN_MIN_BYTES:
            assert {e.key: e.value for e in t.external_data} == {"location": STAND_IN_FILE, "offset": "0", "length": str(size)}
        else:  # read into the output's graph
            assert t.data_location == onnx.TensorProto.DEFAULT and len(t.raw_data) == size


def test_stand_in_weights_are_only_large_float_weights(tmp_path):
    """A piece keeps small tensors and non-float ones as they are (their values can matter to
    onnxruntime's optimizers); it loads with the stand-in file beside it, which holds no bytes on disk."""
    big = np.ones((128, 256), np.float16)  # 64 KiB
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"], name="mm")]
    nodes += [helper.make_node("Gather", ["h0" if i == 0 else f"h{i}", "idx"], [f"h{i + 1}"], axis=1) for i in range(100)]
    inits = [
        tensor("w", big), tensor("idx", np.arange(256, dtype=np.int64)),
    ]
    m = model(nodes, [vi("x", F16, [2, 128])], [vi("h100", F16, [2, 256])], inits)
    types = convert(m, keep_io_types=False, probe=False).value_types
    pieces = load_pieces(m, types)
    assert pieces is not None
    first = pieces[0]
    stored = {t.name: t for t in first.graph.initializer}
    assert stored["w"].data_location == onnx.TensorProto.EXTERNAL and not stored["w"].raw_data
    assert stored["idx"].data_location == onnx.TensorProto.DEFAULT
    write_stand_in(pieces, tmp_path)
    blank = tmp_path / STAND_IN_FILE
    assert blank.stat().st_size == big.nbytes and blank.stat().st_blocks == 0  # sparse
    with InProcessRunner() as runner:
        for piece in pieces:
            runner.load(piece, data_folder=tmp_path).close()


def _cli(argv) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def test_the_cli_checks_a_large_output_in_pieces_while_it_writes_it(tmp_path, monkeypatch):
    src, out = tmp_path / "big.onnx", tmp_path / "big.fp16.onnx"
    onnx.save(transformer_model(blocks=40), src)
    made: list[int] = []

    def spy(*args, **kwargs):
        pieces = load_pieces(*args, **kwargs)
        made.append(len(pieces or ()))
        return pieces

    monkeypatch.setattr("amp_compiler.onnx.write.load_check.load_pieces", spy)
    assert _cli(["convert", src, "-o", out]) == (0, "")
    assert out.exists() and made and 0 < made[0] <= 4


def test_the_cli_refuses_a_large_output_that_crashes_onnxruntime(tmp_path, monkeypatch):
    """The conversion (replaced here) gives a large model with the crash in its middle: not written."""
    crashing = onnx.load(_crashing(tmp_path))
    src, out = tmp_path / "good.onnx", tmp_path / "o.onnx"
    onnx.save(_chain(10), src)
    command = importlib.import_module("amp_compiler.onnx.convert")
    real = command.convert

    def converted(*args, **kwargs):
        result = real(*args, **kwargs)
        result.model = crashing
        result.value_types = convert(crashing, keep_io_types=False, probe=False).value_types
        return result

    monkeypatch.setattr(command, "convert", converted)
    code, err = _cli(["convert", src, "-o", out])
    assert code == 1 and "the converted model crashes onnxruntime" in err and "not written" in err
    assert not out.exists()
