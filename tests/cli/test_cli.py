"""The command line: conversions, and one clear line with exit code 2 for every bad input."""

import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper

from amp_compiler.cli import main
from tests.support.onnx_builders import F32, model, tensor, vi, weights


@pytest.fixture
def good_model(tmp_path) -> Path:
    m = model(
        [
            helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
            helper.make_node("Relu", ["a"], ["y"], name="relu"),
        ],
        # K = 16: a shorter product of the input stays FP32 (policy.high.raw-small-product)
        [vi("x", F32, [2, 16])], [vi("y", F32, [2, 4])], [tensor("w", weights((16, 4)))],
    )
    p = tmp_path / "good.onnx"
    onnx.save(m, p)
    return p


def _run(argv, capsys):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _assert_user_error(code, err, *needles):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("amp-compiler: error: ")
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0]


def test_convert_writes_a_valid_fp16_model(good_model, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    code, stdout, _ = _run(["convert", good_model, "-o", out], capsys)
    assert code == 0 and out.exists()
    m = onnx.load(out)
    onnx.checker.check_model(m, full_check=True)
    assert any(i.data_type == onnx.TensorProto.FLOAT16 for i in m.graph.initializer)
    assert "Tensor Core ops in fp16: 1/1" in stdout


def test_a_conversion_that_converts_nothing_says_so_and_why(good_model, tmp_path, capsys):
    """Every node blocked: the summary's counts said it (nodes: fp32 2), no line did."""
    out = tmp_path / "out.onnx"
    code, stdout, err = _run(["convert", good_model, "-o", out, "--block-op", "MatMul", "--block-op", "Relu"], capsys)
    assert code == 0 and "Tensor Core ops in fp16: 0/1" in stdout
    assert "warning: no node was converted to fp16: the output computes as the input does (nodes kept fp32 by " \
           "user.block-op 2)" in err
    code, _, err = _run(["convert", good_model, "-o", out, "--force"], capsys)
    assert code == 0 and "no node was converted" not in err


def test_convert_bf16_with_options(good_model, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    code, _, err = _run(
        ["convert", good_model, "-o", out, "--target", "bf16", "--block-node", "relu", "--no-keep-io-types"],
        capsys,
    )
    assert code == 0, err
    m = onnx.load(out)
    assert m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16


def test_missing_file(tmp_path, capsys):
    code, _, err = _run(["convert", tmp_path / "nope.onnx", "-o", tmp_path / "o.onnx"], capsys)
    _assert_user_error(code, err, "no such file")
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize(
    "content, needle",
    [
        (b"", "empty"),
        (b"this is definitely not a protobuf \xff\xfe\x00\x01" * 10, "not an ONNX model"),
    ],
)
def test_not_onnx(tmp_path, capsys, content, needle):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(content)
    code, _, err = _run(["convert", bad, "-o", tmp_path / "o.onnx"], capsys)
    _assert_user_error(code, err, needle)
    assert not (tmp_path / "o.onnx").exists()


def test_truncated_file(good_model, tmp_path, capsys):
    data = good_model.read_bytes()
    bad = tmp_path / "trunc.onnx"
    bad.write_bytes(data[: len(data) // 2])
    code, _, err = _run(["convert", bad, "-o", tmp_path / "o.onnx"], capsys)
    _assert_user_error(code, err)
    assert not (tmp_path / "o.onnx").exists()


def test_invalid_graph(tmp_path, capsys):
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "undefined_tensor"], ["y"])], "g", [vi("x", F32, [2, 2])], [vi("y", F32, [2, 2])]
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    bad = tmp_path / "invalid.onnx"
    bad.write_bytes(m.SerializeToString())
    code, _, err = _run(["convert", bad, "-o", tmp_path / "o.onnx"], capsys)
    _assert_user_error(code, err, "invalid ONNX model")


def test_unknown_op_in_options(good_model, tmp_path, capsys):
    code, _, err = _run(["convert", good_model, "-o", tmp_path / "o.onnx", "--block-op", "Frobnicate"], capsys)
    _assert_user_error(code, err, "Frobnicate")
    assert not (tmp_path / "o.onnx").exists()


def test_unknown_option_and_bad_choice(good_model, tmp_path, capsys):
    code, _, err = _run(["convert", good_model, "-o", tmp_path / "o.onnx", "--frobnicate"], capsys)
    _assert_user_error(code, err, "--frobnicate")
    code, _, err = _run(["convert", good_model, "-o", tmp_path / "o.onnx", "--target", "fp4"], capsys)
    _assert_user_error(code, err, "fp4")


def test_unwritable_output(good_model, tmp_path, capsys):
    code, _, err = _run(["convert", good_model, "-o", tmp_path / "no" / "such" / "dir.onnx"], capsys)
    _assert_user_error(code, err, "does not exist")
    if os.geteuid() != 0:  # root can write anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        code, _, err = _run(["convert", good_model, "-o", ro / "o.onnx"], capsys)
        _assert_user_error(code, err, "not writable")


def test_output_equal_to_input_is_refused(good_model, capsys):
    before = good_model.read_bytes()
    code, _, err = _run(["convert", good_model, "-o", good_model], capsys)
    _assert_user_error(code, err, "overwrite the input")
    assert good_model.read_bytes() == before


def test_failed_conversion_leaves_existing_output_untouched(tmp_path, capsys):
    out = tmp_path / "o.onnx"
    out.write_bytes(b"previous")
    code, _, err = _run(["convert", tmp_path / "missing.onnx", "-o", out], capsys)
    assert code == 2 and out.read_bytes() == b"previous"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".o.onnx")]


def test_console_script_entry_point(good_model, tmp_path):
    out = tmp_path / "o.onnx"
    proc = subprocess.run(
        [sys.executable, "-m", "amp_compiler.cli", "convert", str(good_model), "-o", str(out), "-q"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and out.exists()


def test_a_float64_graph_is_left_in_double_and_says_so(tmp_path, capsys):
    """FP64 MatMuls were counted as Tensor Core candidates ('0/2') and said 'kept fp32 by no float computation'."""
    import numpy as np

    f64 = onnx.TensorProto.DOUBLE
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    m = model(nodes, [vi("x", f64, ["N", 8])], [vi("y", f64, ["N", 4])],
              [tensor("w1", np.ones((8, 16))), tensor("w2", np.ones((16, 4)))], opset=17)
    src, out = tmp_path / "double.onnx", tmp_path / "out.onnx"
    onnx.save(m, src)
    code, stdout, err = _run(["convert", src, "-o", out, "--no-probe"], capsys)
    assert code == 0 and "Tensor Core ops in fp16: 0/0" in stdout
    assert "3 node(s) in fp64, which the conversion leaves as they are" in err and "no float computation" not in err
