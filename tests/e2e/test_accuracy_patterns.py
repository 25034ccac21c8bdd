"""The accuracy failures found on real trained models (models/patterns.py), each fixed by a rule:
the decisions the rule makes, and the accuracy with the rule against the accuracy without it."""

from __future__ import annotations

import functools
import re
from importlib import resources

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.onnx.compare import compare_models
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.policy import PolicyTable
from models import catalog
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _samples(name: str, n: int = 2) -> list[dict[str, np.ndarray]]:
    entry = catalog.get(name)
    return [entry.make_inputs(np.random.default_rng(s)) for s in range(n)]


@functools.cache
def _table_without(key: str) -> PolicyTable:
    """The shipped policy table with one key dropped from every entry (the rule it drives is off)."""
    text = resources.files("amp_compiler.policy").joinpath("onnx_ops.toml").read_text("utf-8")
    return PolicyTable.from_toml(re.sub(rf"\n{key} = [^\n]+", "", text))


def _worst_error_of_range(fp32: onnx.ModelProto, converted: onnx.ModelProto, samples) -> float:
    return max(o.error_of_range for o in compare_models(fp32, converted, samples).outputs)


# ---------------------------------------------------------------------------------------- signal paths
def test_cqt_front_end_stays_fp32_and_the_cnn_runs_fp16():
    fp32 = catalog.load("cqt-log")
    by_node = {d.node: d for d in convert(fp32, probe=False).decisions}
    for name in ("cqt_0", "downsample", "cqt_1", "octaves", "pairs", "square"):
        assert (by_node[name].precision, by_node[name].rule) == ("fp32", "policy.high.signal-path"), name
    assert "graph input 'audio'" in by_node["cqt_0"].reason and "68 dB" in by_node["cqt_0"].reason
    assert by_node["conv1"].precision == by_node["conv2"].precision == "fp16"


def test_cqt_front_end_in_fp32_is_what_keeps_the_notes_accurate():
    fp32, samples = catalog.load("cqt-log"), _samples("cqt-log")
    with_rule = _worst_error_of_range(fp32, convert(fp32, probe=False).model, samples)
    without = _worst_error_of_range(fp32, convert(fp32, policy=_table_without("dynamic_range"), probe=False).model, samples)
    assert with_rule < 0.005 and without > 10 * with_rule, (with_rule, without)


def _log_after(prefix: list, prefix_out: str, extra_inits=()) -> onnx.ModelProto:
    nodes = prefix + [
        helper.make_node("Mul", [prefix_out, prefix_out], ["p"], name="square"),
        helper.make_node("Log", ["p"], ["y"], name="log"),
    ]
    inits = [tensor("W", weights((16, 16))), *extra_inits]
    return model(nodes, [vi("x", F32, [4, 16])], [vi("y", F32, [4, 16])], inits)


@pytest.mark.parametrize(
    ("prefix", "out", "pinned"),
    [
        ([helper.make_node("MatMul", ["x", "W"], ["h"], name="filter")], "h", True),
        # a learned feature (an activation between the filter and the Log), not a raw signal
        ([helper.make_node("MatMul", ["x", "W"], ["m"], name="filter"),
          helper.make_node("Relu", ["m"], ["h"], name="relu")], "h", False),
        # a product of two signals (attention), not a filter with constant weights
        ([helper.make_node("MatMul", ["x", "x"], ["h"], name="filter")], "h", False),
    ],
    ids=["filter", "activation-between", "no-constant-weights"],
)
def test_signal_path_needs_a_raw_input_and_linear_ops(prefix, out, pinned):
    m = _log_after(prefix, out) if prefix[0].input[1] == "W" else model(
        prefix + [helper.make_node("Mul", [out, out], ["p"], name="square"),
                  helper.make_node("Log", ["p"], ["y"], name="log")],
        [vi("x", F32, [16, 16])], [vi("y", F32, [16, 16])], [],
    )
    rule = {d.node: d.rule for d in convert(m, probe=False).decisions}["filter"]
    assert (rule == "policy.high.signal-path") is pinned, rule


# ------------------------------------------------------------------------------------ phase arguments
def test_rotary_angle_path_stays_fp32_and_the_projections_run_fp16():
    by_node = {d.node: d for d in convert(catalog.load("llama-rope-long"), probe=False).decisions}
    for name in ("inv_freq_expand", "position_float", "position_unsqueeze", "rope_angles", "rope_transpose", "rope_emb"):
        assert (by_node[name].precision, by_node[name].rule) == ("fp32", "policy.high.phase-argument"), name
    for name in ("q_proj", "k_proj", "v_proj", "scores", "attn_v", "o_proj"):
        assert by_node[name].precision == "fp16", name


def test_rotary_angles_in_fp32_are_what_keeps_long_positions_accurate():
    """Positions 2000-32768 (the entry's inputs; the range probe feeds 0..127): 0.05% of range with the
    angle's path FP32, 33% (q_rot 87%) with it FP16."""
    fp32, samples = catalog.load("llama-rope-long"), _samples("llama-rope-long")
    with_rule = _worst_error_of_range(fp32, convert(fp32).model, samples)
    without = _worst_error_of_range(fp32, convert(fp32, policy=_table_without("periodic")).model, samples)
    assert with_rule < 0.005 and without > 0.05, (with_rule, without)


def _relative_alibi(positions: str):
    """Cast(positions) -> i - j -> |.| x slope, added to x @ x^T -> Softmax -> @ x (sweep S, pos_min): the
    positions an integer graph input, as a decoder given ``position_ids`` or ``cache_position`` takes them."""
    nodes = [
        helper.make_node("Cast", [positions], ["p"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["p", "a2"], ["pi"]), helper.make_node("Unsqueeze", ["p", "a1"], ["pj"]),
        helper.make_node("Sub", ["pi", "pj"], ["rel"]), helper.make_node("Abs", ["rel"], ["ar"]),
        helper.make_node("Mul", ["ar", "slope"], ["bias"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]), helper.make_node("MatMul", ["x", "xt"], ["s"]),
        helper.make_node("Add", ["s", "bias"], ["sb"]), helper.make_node("Softmax", ["sb"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "x"], ["y"]),
    ]
    inits = [tensor("a1", np.array([1], np.int64)), tensor("a2", np.array([2], np.int64)),
             tensor("slope", np.array(-0.5, np.float32))]
    return model(nodes, [vi(positions, onnx.TensorProto.INT64, [1, "seq"]), vi("x", F32, [1, "seq", 16])],
                 [vi("y", F32, [1, "seq", 16])], inits)


@pytest.mark.parametrize("positions", ["position_ids", "cache_position", "idx"])
def test_relative_positions_from_an_integer_input_stay_exact_past_2048(positions):
    """Positions 3000.. and 8000.. (a long prompt, a KV-cache step; the probe draws 0..127): FP16 rounds them to
    multiples of 2 and 4, and the bias |i - j| x slope moves by up to 2 logits: 6.5% and 4.3% of range with
    the Cast, Sub, Abs and Mul in FP16; 0.025% and 0.039% with them FP32, both MatMuls still FP16."""
    fp32 = _relative_alibi(positions)
    converted = convert(fp32)
    assert [d.precision for d in converted.decisions if d.op_type == "MatMul"] == ["fp16", "fp16"]
    rng = np.random.default_rng(0)
    for start in (3000, 8000):
        feeds = {positions: (start + np.arange(64))[None].astype(np.int64),
                 "x": (rng.standard_normal((1, 64, 16)) / 2).astype(np.float32)}
        ref = run_onnxruntime(fp32, feeds)[0]
        got = run_onnxruntime(emulate(converted.model), feeds)[0]
        assert np.abs(got - ref).max() / np.ptp(ref) < 0.005, (start, np.abs(got - ref).max() / np.ptp(ref))


# ------------------------------------------------------------------------------- FP32 graph outputs
def _relative_error(name: str, **options) -> float:
    fp32 = catalog.load(name)
    feeds = catalog.get(name).make_inputs(np.random.default_rng(0))
    ref = run_onnxruntime(fp32, feeds)[0]
    got = run_onnxruntime(emulate(convert(fp32, probe=False, **options).model), feeds)[0]
    kept = ref > 1e-7
    return float(np.max(np.abs(got - ref)[kept] / ref[kept]))


def test_probabilities_output_computed_in_fp32_at_one_cast_more():
    decision = {d.node: d for d in convert(catalog.load("gated-softmax-output"), probe=False).decisions}["softmax"]
    assert (decision.precision, decision.rule) == ("fp32", "placement.min-cut")
    assert "FP32 graph output" in decision.reason
    painted = {d.node: d for d in convert(catalog.load("gated-softmax-output"), placement="paint", probe=False).decisions}
    assert painted["softmax"].precision == "fp16"  # painting alone: between two low-precision ops
    assert _relative_error("gated-softmax-output") < 0.02 < 0.1 < _relative_error("gated-softmax-output", placement="paint")


def test_probabilities_reaching_an_output_through_data_movement_are_computed_in_fp32():
    """A detector's class head drops its "no object" column with a Slice before the output: the Softmax is the
    output's producer all the same. In FP16 its probabilities below 6.1e-5 (84% of them) were subnormals and those
    below 6e-8 zero; in FP32 the output's Cast moves as many bytes as the Softmax input's would."""
    classes = 1000
    bias = np.zeros(classes, np.float32)
    bias[-1] = -30.0  # the dropped class never wins: the rows kept still sum to 1
    m = model(
        [helper.make_node("MatMul", ["x", "W"], ["z0"], name="mm"), helper.make_node("Add", ["z0", "b"], ["z"], name="bias"),
         helper.make_node("Softmax", ["z"], ["p"], name="softmax", axis=-1),
         helper.make_node("Slice", ["p", "starts", "ends", "axes"], ["probs"], name="drop_no_object")],
        [vi("x", F32, [1, 16, 64])], [vi("probs", F32, [1, 16, classes - 1])],
        [tensor("W", weights((64, classes), scale=0.5)), tensor("b", bias), tensor("starts", np.array([0], np.int64)),
         tensor("ends", np.array([classes - 1], np.int64)), tensor("axes", np.array([2], np.int64))],
    )
    decided = {d.node: d for d in convert(m, probe=False).decisions}
    assert decided["softmax"].precision == decided["drop_no_object"].precision == "fp32", decided["softmax"]
    x = {"x": np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)}
    ref = run_onnxruntime(m, x)[0]
    got = run_onnxruntime(emulate(convert(m, probe=False).model), x)[0]
    small = (ref > 1e-9) & (ref < 1e-6)  # FP16 holds these as subnormals spaced 6e-8: 6-100% off
    assert small.sum() > 1000 and np.max(np.abs(got - ref)[small] / ref[small]) < 0.05  # the logits' FP16 error alone


def test_data_movement_before_an_output_has_no_rounding_cost():
    """A PASS op rounds nothing: a Relu between a MatMul and the output stays low precision and the
    Cast goes after it, as painting put it."""
    m = model(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="relu")],
        [vi("x", F32, [4, 16])], [vi("y", F32, [4, 16])], [tensor("W", weights((16, 16)))],
    )
    assert {d.node: d.precision for d in convert(m, probe=False).decisions}["relu"] == "fp16"


# ------------------------------------------------------------------------------ calibration and masks
def test_padding_in_calibration_data_does_not_pin_the_mask_path():
    """Calibration with padded sequences sees -3.4e38 after the mask's Mul, Add and in the Softmax's
    input; the mask rule turns that constant into -32768, so none of it is an overflow."""
    from amp_compiler.onnx.measure.calibrate import collect_ranges

    fp32 = catalog.load("attention-mask-padding")
    samples = _samples("attention-mask-padding")
    ranges = collect_ranges(fp32, samples)
    assert ranges["add_mask_out"].min < -1e38  # what calibration observes
    result = convert(fp32, ranges=ranges, probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert not [d.node for d in result.decisions if d.rule.startswith("calibration")]
    assert by_node["mask_scale"].precision == by_node["softmax"].precision == "fp16"
    assert "-32768" in by_node["mask_scale"].reason
    comparison = compare_models(fp32, result.model, samples)
    assert comparison.outputs[0].nonfinite == 0 and comparison.outputs[0].error_of_range < 0.01


def test_a_real_overflow_on_the_mask_path_still_counts():
    """Scores of 1e6 beside the mask overflow FP16 whatever the mask does: observed maxima count."""
    from amp_compiler.onnx.measure.calibrate import collect_ranges

    fp32 = catalog.load("attention-mask-padding")
    samples = [{**s, "x": s["x"] * 300} for s in _samples("attention-mask-padding")]
    result = convert(fp32, ranges=collect_ranges(fp32, samples), probe=False)
    add = {d.node: d for d in result.decisions}["add_mask"]
    assert add.rule == "calibration.overflow" and "e+38" not in add.reason  # the scores' maximum, not the mask


# ------------------------------------------------------------------------------------- quantized models
def test_quantized_islands_stay_fp32_with_reasons():
    result = convert(catalog.load("quantized-encoder"), probe=False)
    by_node = {d.node: d for d in result.decisions}
    assert by_node["attn_v_0"].rule == "quantized.requantize"  # its result is quantized for o_0
    assert by_node["scores_0"].rule == "quantized.requantize"  # upstream of it, in the same island
    assert "DynamicQuantizeLinear" in by_node["attn_v_0"].reason and "integer levels" in by_node["attn_v_0"].reason
    assert by_node["q_0_quant_scales_mul"].rule == "quantized.scale"
    assert by_node["q_0_quant"].precision == "none"  # MatMulInteger: never touched
    assert result.casts_inserted == 0


def test_quantized_islands_in_fp32_keep_the_probabilities_exact():
    """Without the rule, FP16 in the islands flips int8 levels at the next quantizer."""
    fp32, samples = catalog.load("quantized-encoder"), _samples("quantized-encoder", 4)
    assert _worst_error_of_range(fp32, convert(fp32, probe=False).model, samples) == 0.0
    without = _worst_error_of_range(fp32, convert(fp32, policy=_table_without("quantizes"), probe=False).model, samples)
    assert without > 1e-3


def test_a_static_quantizer_keeps_only_what_it_reads_fp32():
    """QuantizeLinear (a fixed scale) after a MatMul: the MatMul's result is what it reads."""
    from tests.support.onnx_builders import tensor as t

    m = model(
        [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm0"), helper.make_node("MatMul", ["h", "W"], ["h2"], name="mm1"),
         helper.make_node("QuantizeLinear", ["h2", "s", "z"], ["q"], name="quant"),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dequant")],
        [vi("x", F32, [4, 16])], [vi("y", F32, [4, 16])],
        [t("W", weights((16, 16))), t("s", np.array(0.02, np.float32)), t("z", np.array(0, np.int8))], opset=19,
    )
    rules = {d.node: d.rule for d in convert(m, probe=False).decisions}
    assert rules["mm1"] == "quantized.requantize" and rules["mm0"] == "policy.low"


# ------------------------------------------------------------------------------------ BF16 recurrences
def test_onnx_lstm_stays_fp32_for_bf16_and_low_for_fp16():
    """At opset 22 (the first where LSTM takes bf16) the policy keeps it FP32 for BF16."""
    hidden = 8
    m = model(
        [helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="lstm", hidden_size=hidden)],
        [vi("x", F32, [5, 2, 4])], [vi("y", F32, [5, 1, 2, hidden])],
        [tensor("W", weights((1, 4 * hidden, 4))), tensor("R", weights((1, 4 * hidden, hidden)))], opset=22, ir_version=10,
    )
    bf16 = {d.node: d for d in convert(m, target="bf16", probe=False).decisions}["lstm"]
    assert (bf16.precision, bf16.rule) == ("fp32", "policy.high.bf16-recurrence")
    assert "0.9988" in bf16.reason
    fp16 = {d.node: d for d in convert(m, target="fp16", probe=False).decisions}["lstm"]
    assert (fp16.precision, fp16.rule) == ("fp16", "policy.low")


def test_fx_lstm_encoder_keeps_its_recurrence_fp32_in_bf16():
    """A 3-layer LSTM encoder with trained-like long memory (recurrent weights x2.5, forget bias +1):
    in BF16 throughout (torch's own) its embeddings lose cosine; with the LSTM FP32 they do not."""
    import copy

    import torch

    import amp_compiler.fx as ampfx

    torch.manual_seed(0)

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(40, 128, 3, batch_first=True)
            self.proj = torch.nn.Linear(128, 64)
            with torch.no_grad():
                for name, p in self.lstm.named_parameters():
                    p.mul_(2.5 if "weight_hh" in name else 1.5 if "weight_ih" in name else 1.0)
                    if "bias_hh" in name:
                        p[128:256] += 1.0

        def forward(self, x):
            y, _ = self.lstm(x)
            return torch.nn.functional.normalize(self.proj(y[:, -1]), dim=-1)

    encoder, x = Encoder().eval(), torch.randn(8, 120, 40)
    with torch.no_grad():
        ref = encoder(x)
        everything_bf16 = copy.deepcopy(encoder).to(torch.bfloat16)(x.bfloat16()).float()
        gm = ampfx.convert(encoder, (x,), target="bf16")
        ours = gm(x).float()
    assert float((ref * everything_bf16).sum(-1).min()) < 0.999
    assert float((ref * ours).sum(-1).min()) > 0.9999
    by_op = {d.op_type: d for d in ampfx.report(gm).decisions}
    assert by_op["aten.lstm.input"].rule == "policy.high.bf16-recurrence"
    assert by_op["aten.linear.default"].precision == "bf16"


# ------------------------------------------------------------------------------ --tolerance per FLOP
def test_tolerance_pins_the_cheap_chains_and_keeps_every_convolution_fp16():
    from amp_compiler.onnx.tolerance.refine import measure, refine
    from amp_compiler.targets import Target

    fp32 = catalog.load("decomposed-activations")
    samples = _samples("decomposed-activations")
    _, plain, _ = measure(fp32, convert(fp32, probe=False).model, samples, Target.FP16)
    r = refine(fp32, samples, max(plain.values()) / 2)
    assert r.met and r.rounds == 2
    convs = [d for d in r.result.decisions if d.op_type == "Conv"]
    assert len(convs) == 4 and all((d.precision, d.rule) == ("fp16", "tolerance.kept-low") for d in convs)
    assert r.low_flops_share > 0.99  # the classifier's Gemm, a few FLOPs, may go
    pinned_ops = {fp32.graph.node[i].op_type for i, _ in r.pinned}
    assert pinned_ops & {"Mul", "Add", "Clip", "Div"} and "Conv" not in pinned_ops


# ------------------------------------------------------------------------ trees compiled to tensor ops
def test_a_tree_compiled_to_tensor_ops_takes_the_fp32_branches():
    """hummingbird's GEMM strategy in four ops: MatMul(x, one-hot feature selection) -> Less(split thresholds) ->
    Cast -> MatMul(leaf values). With the selection in FP16, features near a split (1000.3, FP16's step 0.5
    there) took the other branch: 3 of 301 rows changed by 100, 90% of the output's range, stated 0%."""
    a = np.zeros((4, 3), np.float32)
    a[0, 0] = a[2, 1] = a[3, 2] = 1
    nodes = [helper.make_node("MatMul", ["x", "select"], ["f"], name="select"),
             helper.make_node("Less", ["f", "thresholds"], ["left"], name="split"),
             helper.make_node("Cast", ["left"], ["leftf"], to=onnx.TensorProto.FLOAT, name="to_float"),
             helper.make_node("MatMul", ["leftf", "leaves"], ["y"], name="leaves")]
    fp32 = model(nodes, [vi("x", F32, ["N", 4])], [vi("y", F32, ["N", 1])],
                 [tensor("select", a), tensor("thresholds", np.array([1000.3, 0.7, 52.1], np.float32)),
                  tensor("leaves", np.array([[100.0], [10.0], [1.0]], np.float32))], opset=17, ir_version=8)
    rng = np.random.default_rng(100)
    x = np.stack([rng.uniform(999, 1002, 301), rng.normal(0, 1, 301), rng.uniform(0, 1.4, 301),
                  rng.uniform(40, 60, 301)], 1).astype(np.float32)
    result = convert(fp32)
    want, got = (run_onnxruntime(m, {"x": x})[0] for m in (fp32, emulate(result.model)))
    assert int(np.sum(want != got)) == 0
    by_node = {d.node: d for d in result.decisions}
    assert (by_node["select"].precision, by_node["select"].rule) == ("fp32", "threshold.input")
    assert by_node["leaves"].precision == "fp16"  # what the comparisons give (0/1) is exact in FP16
