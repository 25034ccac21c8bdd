"""A probability output the generated inputs leave certain everywhere (Magika on uniform random bytes: one file
type, p = 1.0) shows no FP16 error on them: its stated error says nothing of the near-ties real inputs reach
(1.47% of range on real files, 0.00% stated). The conversion says so instead of staying silent."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_compiler.cli import main
from amp_compiler.core.probabilities import CERTAIN, saturation
from amp_compiler.onnx.measure.output_error import logistic_outputs


def _classifier(scale: float) -> onnx.ModelProto:
    """``y = softmax(scale * x @ w)``, x [B, 32]: a large ``scale`` makes the probe's N(0, 1) inputs certain."""
    w = (np.random.default_rng(0).standard_normal((32, 10)) / 4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["l"]), helper.make_node("Mul", ["l", "s"], ["m"]),
         helper.make_node("Softmax", ["m"], ["y"], axis=-1)],
        "classifier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 10])],
        [onnx.numpy_helper.from_array(w, "w"), helper.make_tensor("s", TensorProto.FLOAT, [], [scale])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_saturation_is_the_share_of_certain_rows_of_a_probability_output():
    certain = np.full((3, 4), 1e-6 / 3, np.float32)
    certain[:, 0] = 1 - 1e-6
    spread = np.full((1, 4), 0.25, np.float32)
    assert saturation([certain, spread]) == 0.75
    assert saturation([np.full((2, 4), 0.3, np.float32)]) is None  # rows summing to 1.2: no probabilities
    assert saturation([np.array([[2.0, -1.0]], np.float32)]) is None
    assert saturation([np.array([0.5, 0.5], np.float32)]) == 0.0 and CERTAIN == 1 - 2**-12


def test_an_output_certain_on_every_generated_input_is_warned_of(tmp_path, capsys):
    """x4000: no other class's logit within 3 of the top's, nothing read near a tie: certain everywhere."""
    for scale, warned in ((4000.0, True), (1.0, False)):
        path, out = tmp_path / f"c{scale:g}.onnx", tmp_path / f"c{scale:g}.fp16.onnx"
        onnx.save(_classifier(scale), path)
        assert main(["convert", str(path), "-o", str(out)]) == 0
        err = capsys.readouterr().err
        lines = [w for w in err.splitlines() if "certain everywhere" in w]
        assert bool(lines) == warned, err
        if warned:
            assert lines[0].startswith("amp-compiler: warning: output 'y': on generated inputs its top probability "
                                       "is 1 in low precision at 100% of its positions")
            assert f"amp-compiler compare {path} {out} --data DIR" in lines[0]


def test_the_tie_warning_says_more_than_the_certain_one():
    """Certain at 99% of its rows, yet a tie read from the others moves past the line: the tie warning alone."""
    from pathlib import Path

    from amp_compiler.cli.convert import accuracy_warnings
    from amp_compiler.core.measures import OutputAccuracy

    certain = OutputAccuracy("y", 1.0, 1e-6, 1.0, True, 1e-6, saturated=0.995)
    both = OutputAccuracy("y", 1.0, 1e-6, 1.0, True, 1e-6, saturated=0.995, tie_move=0.05)
    (said,) = accuracy_warnings([certain], "generated inputs", Path("m.onnx"), Path("m.fp16.onnx"))
    assert "certain everywhere" in said
    (said,) = accuracy_warnings([both], "generated inputs", Path("m.onnx"), Path("m.fp16.onnx"))
    assert "where two classes tie it moves by up to 5.0% of its range" in said


def _score(scale: float) -> onnx.ModelProto:
    """``y = sigmoid(scale * x @ w)`` reshaped to [B]: a binary classifier's score."""
    w = (np.random.default_rng(0).standard_normal((32, 1)) / 4).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["l"]), helper.make_node("Mul", ["l", "s"], ["m"]),
         helper.make_node("Sigmoid", ["m"], ["p"]), helper.make_node("Reshape", ["p", "flat"], ["y"])],
        "score", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [onnx.numpy_helper.from_array(w, "w"), helper.make_tensor("s", TensorProto.FLOAT, [], [scale]),
         onnx.numpy_helper.from_array(np.array([-1], np.int64), "flat")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_sigmoid_score_certain_on_every_generated_input_is_warned_of(tmp_path, capsys):
    """A Sigmoid's output (through a Reshape) is a probability of two classes: scores of exactly 0 or 1 on the probe
    were stated 0.00% and said nothing of the threshold, where FP16 moves a confident classifier's score 2.4-3.9%
    (sweep C1)."""
    assert logistic_outputs(_score(1.0)) == {"y"} and logistic_outputs(_classifier(1.0)) == set()
    for scale, warned in ((4000.0, True), (1.0, False)):
        path, out = tmp_path / f"s{scale:g}.onnx", tmp_path / f"s{scale:g}.fp16.onnx"
        onnx.save(_score(scale), path)
        assert main(["convert", str(path), "-o", str(out)]) == 0
        err = capsys.readouterr().err
        assert ("certain everywhere" in err) == warned, err
