"""An output whose FP32 values are all NaN/Inf on the inputs the conversion ran (Gumbel noise ``-log(-log u)``
of the probe's N(0, 1) ``u``) has no measured error: the summary line, the warning and the report say so,
where they stated "max 0.00% of range, cosine 1.000000" before."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper

from amp_compiler.cli import main
from amp_compiler.core.tensor_error import ErrorStats
from amp_compiler.report import PrecisionReport
from amp_compiler.report.render import render


def _gumbel_heads() -> onnx.ModelProto:
    """``y = softmax((logits - log(-log u)) * 10)`` beside ``z = relu(logits @ w)``: only ``y`` is NaN in FP32 on
    negative ``u``."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Log", ["u"], ["l1"]), helper.make_node("Neg", ["l1"], ["n1"]),
        helper.make_node("Log", ["n1"], ["l2"]), helper.make_node("Sub", ["logits", "l2"], ["a"]),
        helper.make_node("Mul", ["a", "inv_tau"], ["b"]), helper.make_node("Softmax", ["b"], ["y"], axis=-1),
        helper.make_node("MatMul", ["logits", "w"], ["m"]), helper.make_node("Relu", ["m"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes, "gumbel",
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 64]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, ["B", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 64]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, ["B", 32])],
        [helper.make_tensor("inv_tau", TensorProto.FLOAT, [], [10.0]),
         onnx.numpy_helper.from_array((rng.standard_normal((64, 32)) / 8).astype(np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_output_without_finite_reference_values_is_not_measured():
    stats = ErrorStats()
    stats.add(np.full(4, np.nan), np.full(4, np.nan))
    a = stats.accuracy("y")
    assert a.finite and not a.measured  # its NaN matches FP32's: not wrong, and not measured either
    stats.add(np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    assert stats.accuracy("y").measured


def test_convert_says_which_outputs_it_could_not_measure(tmp_path, capsys):
    src, dst, report = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx", tmp_path / "r.json"
    onnx.save(_gumbel_heads(), src)
    code = main([str(a) for a in ["convert", src, "-o", dst, "--report", report]])
    out, err = capsys.readouterr()
    assert code == 0, err
    # listed before the measured ones, where it read "y max 0.00% of range, rel-L2 0, cosine 1.000000"
    assert "on generated inputs: y not measured (FP32's own values are NaN/Inf); z max" in out
    assert ("warning: output 'y': FP32's own values are all NaN/Inf on generated inputs, so its error is not "
            "measured; give --input-range NAME:LO,HI for the inputs, or --calibration-data DIR") in err
    data = json.loads(report.read_text())
    accuracy = {a["name"]: a for a in data["summary"]["accuracy"]}
    assert accuracy["y"]["measured"] is False and accuracy["z"]["measured"] is True
    assert "output y not measured (FP32's own values NaN/Inf)" in " ".join(
        render(PrecisionReport.from_dict(data), "terminal").split())


def test_the_inputs_range_given_the_output_is_measured(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx"
    onnx.save(_gumbel_heads(), src)
    code = main([str(a) for a in ["convert", src, "-o", dst, "--input-range", "u:0.001,0.999"]])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "not measured" not in out and "not measured" not in err
