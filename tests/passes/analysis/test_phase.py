"""Phase arguments (passes/analysis/phase.py): the linear path from raw positions or coordinates into a
Sin/Cos stays FP32 (``policy.high.phase-argument``); learned features and real products stay low."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from tests.support.onnx_builders import F32, model, tensor, vi, weights

_INV_FREQ = (1.0 / 10000 ** (np.arange(0, 16, 2) / 16)).astype(np.float32)


def _rules(m, **options) -> dict[str, tuple[str, str]]:
    return {d.node: (d.precision, d.rule) for d in convert(m, probe=False, **options).decisions}


def _rotary(exporter: str):
    """q rotated by HF Llama's angles, as torch.onnx.export writes them: ``dynamo`` reads inv_freq as an
    initializer into the angle MatMul; ``torchscript`` expands it to the batch first."""
    nodes = [helper.make_node("Cast", ["position_ids"], ["pf"], name="to_float", to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["pf", "axis1"], ["pos"], name="unsqueeze")]
    inits = [tensor("inv_freq", _INV_FREQ[None, :, None]), tensor("axis1", np.array([1], np.int64)),
             tensor("Wq", weights((16, 16))), tensor("Wo", weights((16, 16), seed=1))]
    freqs = "inv_freq"
    if exporter == "torchscript":
        inits.append(tensor("ones", np.array([1, 1], np.int64)))
        nodes += [helper.make_node("Shape", ["position_ids"], ["b"], name="batch", end=1),
                  helper.make_node("Concat", ["b", "ones"], ["shape"], name="shape", axis=0),
                  helper.make_node("Expand", ["inv_freq", "shape"], ["freqs"], name="expand")]
        freqs = "freqs"
    nodes += [
        helper.make_node("MatMul", [freqs, "pos"], ["ang"], name="angles"),
        helper.make_node("Transpose", ["ang"], ["angT"], name="transpose", perm=[0, 2, 1]),
        helper.make_node("Concat", ["angT", "angT"], ["emb"], name="emb", axis=-1),
        helper.make_node("Cos", ["emb"], ["cos"], name="cos"),
        helper.make_node("MatMul", ["x", "Wq"], ["q"], name="q_proj"),
        helper.make_node("Mul", ["q", "cos"], ["qc"], name="rotate"),
        helper.make_node("MatMul", ["qc", "Wo"], ["y"], name="o_proj"),
    ]
    return model(nodes, [vi("x", F32, ["b", "s", 16]), vi("position_ids", TensorProto.INT64, ["b", "s"])],
                 [vi("y", F32, ["b", "s", 16])], inits)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_rotary_angles_stay_fp32_and_the_projections_low(exporter):
    rules = _rules(_rotary(exporter))
    pinned = ["to_float", "angles", "transpose", "emb"] + (["expand"] if exporter == "torchscript" else [])
    for name in pinned:
        assert rules[name] == ("fp32", "policy.high.phase-argument"), (name, rules[name])
    assert rules["q_proj"][0] == rules["o_proj"][0] == "fp16"


def test_the_reason_names_the_op_the_input_and_the_angle_error():
    reason = {d.node: d.reason for d in convert(_rotary("dynamo"), probe=False).decisions}["angles"]
    assert "Cos node 'cos'" in reason and "to_float" in reason, reason
    assert "32000 rad to within 8" in reason and "2000 rad to within 0.5" in reason, reason
    bf16 = {d.node: d.reason for d in convert(_rotary("dynamo"), target="bf16", probe=False).decisions}["angles"]
    assert "32000 rad to within 64" in bf16, bf16
    from amp_compiler.passes.analysis.phase import angle_error

    assert angle_error(np.dtype(np.float16), 32000.0) == float(np.spacing(np.float16(32000))) / 2


def test_rotary_at_long_positions_is_accurate():
    """The output at positions 32000..32015 (the probe feeds 0..127): 42% of range with the angle FP16."""
    from amp_compiler.onnx.compare import compare_models

    fp32 = _rotary("torchscript")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 16, 16)).astype(np.float32),
              "position_ids": np.arange(32000, 32016, dtype=np.int64)[None]}]
    out = compare_models(fp32, convert(fp32, probe=False).model, feeds).outputs[0]
    assert out.error_of_range < 0.005, out


def _fourier(first: list, out: str, x_shape=(64, 2)):
    """sin(first(x)) into a small MLP: Fourier features when ``first`` projects raw coordinates."""
    nodes = first + [helper.make_node("Sin", [out], ["s"], name="sin"),
                     helper.make_node("MatMul", ["s", "W2"], ["y"], name="mlp")]
    inits = [tensor("B", weights((x_shape[1], 16), scale=10.0)), tensor("two_pi", np.array(2 * np.pi, np.float32)),
             tensor("W1", weights((16, 16))), tensor("W2", weights((16, 8)))]
    return model(nodes, [vi("x", F32, list(x_shape))], [vi("y", F32, [x_shape[0], 8])], inits)


@pytest.mark.parametrize(
    ("first", "out", "pinned"),
    [
        ([helper.make_node("MatMul", ["x", "B"], ["p"], name="phase"),
          helper.make_node("Mul", ["p", "two_pi"], ["a"], name="scale")], "a", True),
        # a SIREN's sine of a hidden layer: a learned feature, not a raw coordinate
        ([helper.make_node("MatMul", ["x", "B"], ["h"], name="first"), helper.make_node("Relu", ["h"], ["r"], name="relu"),
          helper.make_node("MatMul", ["r", "W1"], ["a"], name="phase")], "a", False),
        # a product of two variable operands (attention scores), not a projection with fixed frequencies
        ([helper.make_node("Transpose", ["x"], ["xt"], name="t", perm=[1, 0]),
          helper.make_node("MatMul", ["x", "xt"], ["a"], name="phase")], "a", False),
    ],
    ids=["fourier-features", "hidden-layer", "no-constant-operand"],
)
def test_phase_path_needs_raw_values_and_linear_ops(first, out, pinned):
    m = _fourier(first, out, (16, 16) if first[0].name == "t" else (64, 2))
    rule = _rules(m)["phase"][1]
    assert (rule == "policy.high.phase-argument") is pinned, rule


def test_a_user_allowed_angle_stays_low():
    assert _rules(_rotary("dynamo"), allow_nodes=["^angles$"])["angles"] == ("fp16", "user.allow")
