"""``--fp32-products split``: Tensor Core ops kept in FP32 for their precision, written TF32-proof."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.errors import OptionError
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.write.strongly_typed import strongly_typed_faults
from tests.support.onnx_builders import model, tensor, vi

_RNG = np.random.default_rng(7)


def _gemm_like(op: str, opset: int = 18) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A one-node FP32 model of ``op`` (MatMul of two activations, Gemm with transB, alpha and a bias, Conv
    and ConvTranspose with a bias and pads) followed by a Relu, and an input for it."""
    if op == "MatMul":
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="product")
        inputs, inits = [vi("x", shape=[4, 24]), vi("w", shape=[24, 8])], []
        feeds = {"x": _RNG.standard_normal((4, 24)).astype(np.float32), "w": _RNG.standard_normal((24, 8)).astype(np.float32)}
        shape = [4, 8]
    elif op == "Gemm":
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="product", transB=1, alpha=0.7)
        inputs = [vi("x", shape=[4, 24])]
        inits = [tensor("w", _RNG.standard_normal((8, 24)).astype(np.float32)),
                 tensor("b", _RNG.standard_normal(8).astype(np.float32))]
        feeds, shape = {"x": _RNG.standard_normal((4, 24)).astype(np.float32)}, [4, 8]
    else:
        weight = _RNG.standard_normal((3, 5, 3, 3) if op == "Conv" else (5, 3, 3, 3)).astype(np.float32)
        node = helper.make_node(op, ["x", "w", "b"], ["y"], name="product", pads=[1, 1, 1, 1])
        inputs = [vi("x", shape=[1, 5, 6, 6])]
        inits = [tensor("w", weight), tensor("b", _RNG.standard_normal(3).astype(np.float32))]
        feeds, shape = {"x": _RNG.standard_normal((1, 5, 6, 6)).astype(np.float32)}, [1, 3, 6, 6]
    relu = helper.make_node("Relu", ["y"], ["z"], name="relu")
    return model([node, relu], inputs, [vi("z", shape=shape)], inits, opset=opset), feeds


def _relative(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("op", ["MatMul", "Gemm", "Conv", "ConvTranspose"])
def test_a_blocked_product_split_is_exact_and_stays_so_read_as_tf32(op):
    """Kept FP32 by the user (a precision rule), the product is written as four products of BF16-exact
    high parts and remainders: exact FP32 arithmetic gives the FP32 output to 1e-6, TF32 operands to
    1e-5, where the product left as it is errs by 1e-4 or more read as TF32."""
    fp32, feeds = _gemm_like(op)
    (ref,) = run_onnxruntime(fp32, feeds)
    split = convert(fp32, provider="cuda", block_nodes=("^product$",), fp32_products="split", probe=False)
    plain = convert(fp32, provider="cuda", block_nodes=("^product$",), probe=False)
    onnx.checker.check_model(split.model, full_check=True)
    assert sum(n.op_type == op for n in split.model.graph.node) == 4
    assert _relative(ref, run_onnxruntime(split.model, feeds)[0]) < 1e-6
    assert _relative(ref, run_onnxruntime(emulate(split.model, tf32=True), feeds)[0]) < 1e-5
    assert _relative(ref, run_onnxruntime(emulate(plain.model, tf32=True), feeds)[0]) > 1e-4
    assert [o.name for o in split.model.graph.output] == ["z"] and strongly_typed_faults(split.model) == []


def test_decisions_say_what_was_split_and_warn_of_nothing_left():
    fp32, _ = _gemm_like("Gemm")
    result = convert(fp32, provider="tensorrt", block_nodes=("^product$",), fp32_products="split", probe=False)
    assert len(result.decisions) == len(result.model.graph.node)
    (product,) = [d for d in result.decisions if d.node == "product"]
    assert product.precision == "fp32" and product.rule == "user.block-node"
    assert product.reason.startswith("FP32 written TF32-proof (--fp32-products split): 'x' and 'w'")
    inserted = [d for d in result.decisions if d.rule == "tf32.split"]
    assert {d.op_type for d in inserted} == {"Cast", "Sub", "Gemm", "Add"} and all(d.index is None for d in inserted)
    assert result.casts_removed == 0 and result.casts_inserted == 0  # the split's Casts are no Cast of the input's
    assert not any("TF32" in w for w in result.provider_warnings)
    plain = convert(fp32, provider="tensorrt", block_nodes=("^product$",), probe=False)
    assert any("--fp32-products split" in w for w in plain.provider_warnings)


def test_below_opset_13_there_is_no_bf16_cast_and_the_node_stays_plain_with_its_warning():
    fp32, _ = _gemm_like("MatMul", opset=12)
    result = convert(fp32, provider="cuda", block_nodes=("^product$",), fp32_products="split", probe=False)
    assert sum(n.op_type == "MatMul" for n in result.model.graph.node) == 1
    assert any("1 matrix product kept in FP32 for precision (product" in w for w in result.provider_warnings)


def test_low_products_are_left_alone_and_a_bad_value_is_refused():
    fp32, _ = _gemm_like("Conv")
    result = convert(fp32, provider="cuda", fp32_products="split", probe=False)  # the Conv runs in FP16
    assert not any(d.rule == "tf32.split" for d in result.decisions)
    with pytest.raises(OptionError) as info:
        convert(fp32, fp32_products="exact")
    assert info.value.option == "fp32_products"
