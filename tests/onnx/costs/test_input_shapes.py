"""``--input-shape``: checked once against the model, named dims filled in for every input sharing
them, and evaluated in the dims exporters write (``Min(64, sequence)``)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.analysis import analyze
from amp_compiler.cli import main
from amp_compiler.errors import OptionError
from amp_compiler.onnx.convert import ConvertOptions
from amp_compiler.onnx.costs.costs import bind_input_shapes, estimate
from amp_compiler.onnx.costs.dims import evaluate
from amp_compiler.runtime.runner import InProcessRunner
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _pair() -> onnx.ModelProto:
    """ids, mask [batch, sequence] -> (ids + mask) [batch, sequence] @ w -> y; ``fixed [1, 3]`` too."""
    nodes = [helper.make_node("Add", ["ids", "mask"], ["s"], name="add"),
             helper.make_node("Unsqueeze", ["s", "axis"], ["s3"], name="unsqueeze"),
             helper.make_node("MatMul", ["s3", "w"], ["y"], name="mm"),
             helper.make_node("Relu", ["fixed"], ["z"], name="relu")]
    inputs = [vi("ids", F32, ["batch", "sequence"]), vi("mask", F32, ["batch", "sequence"]), vi("fixed", F32, [1, 3])]
    m = model(nodes, inputs, [vi("y", F32, ["batch", "sequence", 4]), vi("z", F32, [1, 3])],
              [tensor("w", weights((1, 4))), tensor("axis", np.array([-1], np.int64))])
    m.graph.value_info.append(vi("s3", F32, ["batch", "Min(64, sequence)", 1]))  # as torch.export writes
    return m


def test_named_dims_are_filled_in_for_every_input_sharing_them():
    m = _pair()
    assert bind_input_shapes(m, {"ids": (2, 16)}) == {"ids": (2, 16), "mask": (2, 16)}  # fixed: already fixed
    assert bind_input_shapes(m, {"fixed": (1, 3)}) == {"fixed": (1, 3)}  # nothing named: nothing else bound


@pytest.mark.parametrize("given, message", [
    ({"ids": (0, 16)}, "ids: dim 0 is 0; dims must be at least 1"),
    ({"fixed": (2, 3)}, "fixed: dim 0 is 2, but the model fixes it at 1"),
    ({"ids": (2, 16), "mask": (2, 8)}, "the dim 'sequence' is 16 in ids but 8 in mask"),
    ({"ids": (2, 16, 1)}, "ids: rank 3, the model says 2"),
    ({"nope": (1,)}, "nope is not a graph input (inputs: fixed, ids, mask)"),
])
def test_shapes_the_model_contradicts_are_refused(given, message):
    with pytest.raises(OptionError) as info:
        convert(_pair(), input_shapes=given, probe=False)
    assert str(info.value) == message and info.value.option == "input_shapes"


def test_dim_expressions_are_evaluated_safely():
    bound = {"sequence": 100, "batch": 2}
    assert [evaluate(t, bound) for t in ("Min(64, sequence)", "2*sequence", "sequence + 1", "batch*sequence//4",
                                         "Max(batch, 3)", "sequence")] == [64, 200, 101, 50, 3, 100]
    for hostile in ("__import__('os').system('true')", "sequence ** 99999", "().__class__", "unknown + 1", "0", "x" * 300):
        assert evaluate(hostile, bound) is None


def test_the_analysis_runs_and_costs_the_bound_shapes():
    m = _pair()
    report = analyze(m, ConvertOptions(input_shapes=(("ids", (2, 16)),)), runner=InProcessRunner()).report
    assert report.summary.accuracy and not any("dynamic dims" in w for w in report.warnings)
    costs = estimate(m, bind_input_shapes(m, {"ids": (2, 16)}))
    mm = next(c for n, c in zip(m.graph.node, costs.nodes) if n.name == "mm")
    assert mm.flops == 2 * 2 * 16 * 4 and costs.assumed == []


def test_the_cli_fills_in_shared_dims_and_says_one_line_otherwise(tmp_path):
    onnx.save(_pair(), tmp_path / "m.onnx")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        ok = main(["report", str(tmp_path / "m.onnx"), "--input-shape", "ids:2x16"])
        twice = main(["report", str(tmp_path / "m.onnx"), "--input-shape", "ids:2x16", "--input-shape", "ids:2x8"])
    assert ok == 0 and twice == 2
    assert err.getvalue() == "amp-compiler: error: --input-shape: ids is given twice\n"


def test_an_int_input_sharing_a_named_dim_gets_it_too():
    m = model([helper.make_node("Cast", ["ids"], ["f"], to=F32, name="cast"), helper.make_node("Add", ["f", "x"], ["y"])],
              [vi("ids", TensorProto.INT64, ["b", "s"]), vi("x", F32, ["b", "s"])], [vi("y", F32, ["b", "s"])])
    assert bind_input_shapes(m, {"x": (3, 5)}) == {"x": (3, 5), "ids": (3, 5)}


def test_dims_inside_the_graph_are_counted_not_listed_as_the_users_to_give():
    """A dim onnx's inference cannot derive (NonZero's count: its unk__N) is no input's: the note names
    the inputs' dims, which --input-shape fixes, and counts the others (SAM's report listed ~290
    unk__N dims and told the user to give them)."""
    nodes = [helper.make_node("NonZero", ["x"], ["where"]), helper.make_node("Transpose", ["where"], ["rows"]),
             helper.make_node("Cast", ["rows"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["f", "w"], ["y"], name="mm")]
    m = helper.make_model(helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 3])],
        [helper.make_tensor("w", TensorProto.FLOAT, [2, 3], np.ones(6, np.float32))]),
        opset_imports=[helper.make_opsetid("", 17)])
    costs = estimate(m)
    assert costs.assumed == ["batch"] and costs.underived >= 1
    report = analyze(m, ConvertOptions(probe=False), runner=InProcessRunner()).report
    (note,) = [w for w in report.warnings if "taken as 1" in w]
    assert note.startswith("dynamic dims taken as 1 for cost estimates: batch (fix them with --input-shape")
    assert "unk__" not in note and "dim(s) inside the graph" in note
