"""Opt-in Tensor Core padding: weights padded to multiples of 8 with zeros, outputs sliced back, exactly."""

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.policy import PolicyTable, default_table
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _model(opset=17):
    """A MatMul (N=100), a Gemm (transB, K=100: left alone), a Conv (C_out=3, bias), a ConvTranspose
    (C_out=5, bias), a grouped Conv (left alone), and two MatMuls sharing one weight (N=20)."""
    return model(
        [
            helper.make_node("MatMul", ["x", "w_mm"], ["mm"], name="mm"),
            helper.make_node("Gemm", ["mm", "w_gemm", "b_gemm"], ["gemm"], name="gemm", transB=1),
            helper.make_node("Conv", ["img", "w_conv", "b_conv"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["conv"], ["conv_relu"], name="relu"),
            helper.make_node("ConvTranspose", ["img", "w_ct", "b_ct"], ["ct"], name="ct", strides=[2, 2]),
            helper.make_node("Conv", ["img", "w_grouped"], ["grouped"], name="grouped", group=2),
            helper.make_node("MatMul", ["x", "w_shared"], ["s1"], name="shared1"),
            helper.make_node("MatMul", ["x", "w_shared"], ["s2"], name="shared2"),
            helper.make_node("Add", ["s1", "s2"], ["shared"], name="add"),
        ],
        [vi("x", F32, [4, 64]), vi("img", F32, [2, 8, 6, 6])],
        [
            vi("gemm", F32, [4, 12]), vi("mm", F32, [4, 100]), vi("conv_relu", F32, [2, 3, 6, 6]),
            vi("ct", F32, [2, 5, 12, 12]), vi("grouped", F32, [2, 6, 4, 4]), vi("shared", F32, [4, 20]),
        ],
        [
            tensor("w_mm", weights((64, 100), seed=1)), tensor("w_gemm", weights((12, 100), seed=2)),
            tensor("b_gemm", weights((12,), seed=3)), tensor("w_conv", weights((3, 8, 3, 3), seed=4)),
            tensor("b_conv", weights((3,), seed=5)), tensor("w_ct", weights((8, 5, 2, 2), seed=6)),
            tensor("b_ct", weights((5,), seed=7)), tensor("w_grouped", weights((6, 4, 3, 3), seed=8)),
            tensor("w_shared", weights((64, 20), seed=9)),
        ],
        opset=opset,
    )


def _feeds():
    rng = np.random.default_rng(11)
    return {
        "x": rng.standard_normal((4, 64)).astype(np.float32),
        "img": rng.standard_normal((2, 8, 6, 6)).astype(np.float32),
    }


def _weight_shapes(m):
    inits = {t.name: list(t.dims) for t in m.graph.initializer}
    return {n.name: inits.get(n.input[1]) for n in m.graph.node if n.op_type in ("MatMul", "Gemm", "Conv", "ConvTranspose")}


@pytest.mark.parametrize("opset", [9, 17])
def test_padding_is_exact_and_aligns_the_output_dims(opset):
    m = _model(opset)
    plain = convert(m, target="fp16", probe=False)
    padded = convert(m, target="fp16", pad_tensor_cores=True, probe=False)
    validate(padded.model)
    shapes = _weight_shapes(padded.model)
    assert shapes["mm"] == [64, 104]
    assert shapes["conv"] == [8, 8, 3, 3] and shapes["ct"] == [8, 8, 2, 2]
    assert shapes["shared1"] == shapes["shared2"] == [64, 24]
    assert shapes["gemm"] == [12, 100]  # K = 100: padding N would not make it eligible
    assert shapes["grouped"] == [6, 4, 3, 3]  # grouped: zero filters would land inside groups
    assert {t.name for t in padded.model.graph.initializer} >= {"b_conv_pad8", "b_ct_pad8"}
    assert not {"w_mm", "w_conv", "w_shared"} & {t.name for t in padded.model.graph.initializer}
    # the interface is unchanged
    assert [o.name for o in padded.model.graph.output] == [o.name for o in m.graph.output]
    # Tensor Core eligibility as the report sees it
    costs = {n.name: c for n, c in zip(padded.model.graph.node, estimate(padded.model).nodes)}
    for name in ("mm", "conv", "ct", "shared1", "shared2"):
        assert costs[name].tensor_core is True, (name, costs[name].tensor_core_note)
    # FP16 storage with FP32 arithmetic (what the GPU does): bitwise the same outputs
    feeds = _feeds()
    for a, b in zip(run_onnxruntime(emulate(plain.model), feeds), run_onnxruntime(emulate(padded.model), feeds)):
        assert a.shape == b.shape and np.array_equal(a, b)
    # onnxruntime's own CPU FP16 kernels may sum in another order: the padded ops' outputs agree
    # within FP16 rounding (ops downstream then see inputs a rounding apart)
    names = [o.name for o in m.graph.output]
    for name, a, b in zip(names, run_onnxruntime(plain.model, feeds), run_onnxruntime(padded.model, feeds)):
        assert a.shape == b.shape
        if name in ("mm", "conv_relu", "ct"):
            ulp = np.spacing(np.abs(a).astype(np.float16)).astype(np.float32)
            assert np.all(np.abs(a - b) <= ulp), name
        else:
            assert np.abs(a - b).max() <= 1e-2 * np.abs(a).max(), name


def test_decisions_describe_the_padding_and_follow_the_output_nodes():
    r = convert(_model(), target="fp16", pad_tensor_cores=True, probe=False)
    assert len(r.decisions) == len(r.model.graph.node)
    d = {x.node: x for x in r.decisions}
    slices = [x for x in r.decisions if x.rule == "pad.slice"]
    assert {x.node for x in slices} == {"mm/unpad", "conv/unpad", "ct/unpad", "shared1/unpad", "shared2/unpad"}
    assert all(x.precision == "fp16" and x.index is None for x in slices)
    assert "N 100 -> 104" in d["mm"].reason and "C_out 3 -> 8" in d["conv"].reason
    for x, node in zip(r.decisions, r.model.graph.node):
        assert x.node == node.name
        if x.rule == "lowering.cast":
            assert "_pad8" not in x.reason  # Casts read the Slice's output, which kept the name


def test_bf16_matmul_is_padded_exactly():
    m = _model(opset=17)
    plain = convert(m, target="bf16", probe=False)
    padded = convert(m, target="bf16", pad_tensor_cores=True, probe=False)
    validate(padded.model)
    assert _weight_shapes(padded.model)["mm"] == [64, 104]
    feeds = _feeds()
    for a, b in zip(run_onnxruntime(emulate(plain.model), feeds), run_onnxruntime(emulate(padded.model), feeds)):
        assert np.array_equal(a, b)


def test_off_by_default_and_fp32_nodes_are_left_alone():
    m = _model()
    assert not any(n.op_type == "Slice" for n in convert(m, probe=False).model.graph.node)
    r = convert(m, pad_tensor_cores=True, block_ops=["MatMul"], probe=False)
    shapes = _weight_shapes(r.model)
    assert shapes["mm"] == [64, 100] and shapes["shared1"] == [64, 20]  # FP32: no Tensor Cores to align for
    assert shapes["conv"] == [8, 8, 3, 3]


def test_cli_flag(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "out.onnx"
    onnx.save(_model(), src)
    assert main(["convert", str(src), "-o", str(out), "--pad-tensor-cores", "-q"]) == 0
    assert _weight_shapes(onnx.load(out))["mm"] == [64, 104]
    assert main(["convert", str(src), "-o", str(out), "--force", "-q"]) == 0
    assert _weight_shapes(onnx.load(out))["mm"] == [64, 100]


def _gemm_model():
    """Gemm with transB (K=64, N=12, bias) and Gemm with transA (K=16, N=20): B's N axis is 0 in the
    first, 1 in the second; the policy table's Gemm layout says so."""
    return model(
        [
            helper.make_node("Gemm", ["x", "w_t", "b"], ["y"], name="gemm_tb", transB=1),
            helper.make_node("Gemm", ["xt", "w"], ["z"], name="gemm_ta", transA=1),
        ],
        [vi("x", F32, [4, 64]), vi("xt", F32, [16, 4])],
        [vi("y", F32, [4, 12]), vi("z", F32, [4, 20])],
        [tensor("w_t", weights((12, 64), seed=1)), tensor("b", weights((12,), seed=2)),
         tensor("w", weights((16, 20), seed=3))],
    )


def test_gemm_weights_are_padded_on_the_axis_the_table_lays_out():
    m = _gemm_model()
    plain = convert(m, target="fp16", probe=False)
    padded = convert(m, target="fp16", pad_tensor_cores=True, probe=False)
    validate(padded.model)
    assert _weight_shapes(padded.model) == {"gemm_tb": [16, 64], "gemm_ta": [16, 24]}
    assert "b_pad16" in {t.name for t in padded.model.graph.initializer}
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float32), "xt": rng.standard_normal((16, 4)).astype(np.float32)}
    for a, b in zip(run_onnxruntime(emulate(plain.model), feeds), run_onnxruntime(emulate(padded.model), feeds)):
        assert a.shape == b.shape and np.array_equal(a, b)


def test_only_ops_the_policy_table_lays_out_are_padded():
    """Without its ``gemm`` layout in the table, a Gemm is not known to have a weight with an N axis."""
    table = PolicyTable([dataclasses.replace(e, gemm=None) if e.op == "Gemm" else e for e in default_table()])
    padded = convert(_gemm_model(), target="fp16", pad_tensor_cores=True, policy=table, probe=False)
    assert _weight_shapes(padded.model) == {"gemm_tb": [12, 64], "gemm_ta": [16, 20]}


def test_casts_after_a_padded_gemm_name_the_tensor_as_the_output_model_has_it():
    """The Slice takes over the padded output's name: a Cast reading it gives that name."""
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
         helper.make_node("Softmax", ["mm"], ["y"], name="softmax", axis=-1)],
        [vi("x", F32, [4, 64])], [vi("y", F32, [4, 100])], [tensor("w", weights((64, 100), seed=1))],
    )
    r = convert(m, target="fp16", provider="cpu", pad_tensor_cores=True, probe=False)
    casts = [d for d in r.decisions if d.rule == "lowering.cast" and "softmax" in d.reason]
    assert casts and all("'mm'" in d.reason for d in casts), [d.reason for d in casts]
    reads = {n.input[0] for n in r.model.graph.node if n.op_type == "Cast"}
    assert "mm" in reads  # the name the reason gives is the tensor the Cast reads
