"""Static ranges: interval bounds from the graph inputs' ranges (amp_compiler.onnx.graph.intervals), the pass
that keeps what provably overflows FP32, --input-range, and the warnings when no range is known."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import helper

from amp_compiler import convert
from amp_compiler.analysis import analyze
from amp_compiler.cli import main
from amp_compiler.errors import OptionError
from amp_compiler.onnx.convert import ConvertOptions
from amp_compiler.onnx.graph.intervals import static_bounds
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from models import catalog
from tests.support.onnx_builders import F32, model, tensor, vi, weights

INT16 = (-32768.0, 32767.0)


def _ir(m: onnx.ModelProto) -> ir.Model:
    return ir.from_proto(onnx.shape_inference.infer_shapes(m))


def _int16_audio(seed: int = 0) -> dict[str, np.ndarray]:
    sample = catalog.get("stft-power-mel").make_inputs(np.random.default_rng(seed))
    return {"audio": np.clip(sample["audio"] * 40000, *INT16).astype(np.float32)}


# ------------------------------------------------------------------------------------------- bounds
def test_a_filter_over_raw_samples_attains_its_bound():
    """Conv over a box: the bound is sum |w| * s, and x = s * sign(w) reaches it (exact, not loose)."""
    w = weights((4, 1, 16), seed=3)
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [vi("x", F32, [1, 1, 16])],
              [vi("y", F32, [1, 4, 1])], [tensor("w", w)])
    b = static_bounds(_ir(m), {"x": (-2.0, 2.0)})["y"]
    expected = 2.0 * np.abs(w).sum(axis=(1, 2))
    np.testing.assert_allclose(b.hi.ravel(), expected, rtol=1e-6)
    assert b.reached == pytest.approx(expected.max())
    worst = (2.0 * np.sign(w[np.argmax(expected)])).astype(np.float32)[None]
    assert float(run_onnxruntime(m, {"x": worst})[0].max()) == pytest.approx(expected.max(), rel=1e-5)


def test_max_with_a_constant_of_another_shape_broadcasts():
    """Found by the fuzzer: Max of a [1,1,2] signal and a [2,1,1,1] constant bounds like the op broadcasts."""
    c = np.array([-1.0, 3.0], np.float32).reshape(2, 1, 1, 1)
    m = model([helper.make_node("Max", ["x", "c"], ["y"], name="max")], [vi("x", F32, [1, 1, 2])],
              [vi("y", F32, [2, 1, 1, 2])], [tensor("c", c)])
    b = static_bounds(_ir(m), {"x": (-2.0, 2.0)})["y"]
    np.testing.assert_allclose(np.broadcast_to(b.lo, (2, 1, 1, 2))[:, 0, 0, 0], [-1.0, 3.0])
    np.testing.assert_allclose(np.broadcast_to(b.hi, (2, 1, 1, 2))[:, 0, 0, 0], [2.0, 3.0])


def test_power_and_mel_reach_what_one_bin_reaches():
    b = static_bounds(_ir(catalog.load("stft-power-mel")), {"audio": (-1.0, 1.0)})
    stft = b["stft_out"].reached
    assert b["square_out"].reached == pytest.approx(stft**2)
    assert b["power_out"].reached == pytest.approx(stft**2)  # the other part of the sum is >= 0
    assert b["mel_out"].reached >= stft**2 * 0.99  # a filter weight of 1 on the loudest bin, the rest >= 0
    assert b["mel_out"].magnitude >= b["mel_out"].reached


_UNARY = ["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Sqrt", "Exp"]


@settings(max_examples=25, deadline=None)
@given(
    ops=st.lists(st.sampled_from(_UNARY + ["square", "matmul", "add_self", "sum"]), min_size=1, max_size=5),
    lo=st.floats(-8, 0), width=st.floats(0.1, 8), seed=st.integers(0, 1000),
)
def test_bounds_are_sound(ops, lo, width, seed):
    """Random chains of supported ops: every value on random inputs within the range, and on the
    range's corners, stays within the static bound."""
    outs: list = []
    nodes, inits, prev, rows = [], [tensor("axis", np.array([0], np.int64))], "x", 4
    for i, op in enumerate(ops):
        out = f"t{i}"
        if op == "square":
            nodes.append(helper.make_node("Mul", [prev, prev], [out]))
        elif op == "matmul":
            inits.append(tensor(f"w{i}", weights((8, 8), seed=seed + i)))
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out]))
        elif op == "add_self":
            nodes.append(helper.make_node("Add", [prev, "x"], [out]))
            rows = 4
        elif op == "sum":
            nodes.append(helper.make_node("ReduceSum", [prev, "axis"], [out], keepdims=1))
            rows = 1
        else:
            nodes.append(helper.make_node(op, [prev], [out]))
        prev = out
        outs.append(vi(out, F32, [rows, 8]))
    m = model(nodes, [vi("x", F32, [4, 8])], outs, inits)
    hi = lo + width
    bounds = static_bounds(_ir(m), {"x": (lo, hi)})
    rng = np.random.default_rng(seed)
    samples = [rng.uniform(lo, hi, (4, 8)).astype(np.float32), np.full((4, 8), lo, np.float32),
               np.full((4, 8), hi, np.float32)]
    for x in samples:
        for name, value in zip([o.name for o in outs], run_onnxruntime(m, {"x": x}), strict=True):
            if name not in bounds:
                continue
            b = bounds[name]
            finite = np.isfinite(value)
            tol = 1e-4 * (1 + np.abs(value[finite]))
            assert np.all(value[finite] >= np.broadcast_to(b.lo, value.shape)[finite] - tol), name
            assert np.all(value[finite] <= np.broadcast_to(b.hi, value.shape)[finite] + tol), name


# ---------------------------------------------------------------------------------- the pass and options
def test_stated_int16_range_keeps_the_front_end_fp32():
    fp32 = catalog.load("stft-power-mel")
    result = convert(fp32, input_ranges={"audio": INT16}, range_fallback="fp32", probe=False)
    by_node = {d.node: d for d in result.decisions}
    for name in ("stft", "square", "mel", "magnitude", "normalize"):
        assert (by_node[name].precision, by_node[name].rule) == ("fp32", "input-range.overflow"), name
    assert "reaches |x| = " in by_node["stft"].reason
    assert by_node["fc1"].precision == by_node["fc2"].precision == "fp16"
    assert not result.warnings
    x = _int16_audio()
    ref = run_onnxruntime(fp32, x)[0]
    got = run_onnxruntime(emulate(result.model), x)[0]
    assert np.isfinite(got).all() and np.max(np.abs(got - ref)) < 0.02 * (ref.max() - ref.min())
    plain = run_onnxruntime(emulate(convert(fp32, probe=False).model), x)[0]
    assert not np.isfinite(plain).all()  # without the range the int16 audio overflows FP16


def test_observed_input_range_from_calibration_data_counts_as_stated(tmp_path):
    fp32 = catalog.load("stft-power-mel")
    np.savez(tmp_path / "loud.npz", **_int16_audio())
    analysis = analyze(fp32, ConvertOptions(), calibration_data=tmp_path / "loud.npz")
    rules = {d.node: d.rule for d in analysis.result.decisions}
    assert rules["stft"] == "input-range.overflow" and not analysis.result.warnings


def test_without_a_range_it_warns_above_which_magnitude(tmp_path, capsys):
    fp32 = catalog.load("stft-power-mel")
    warnings = convert(fp32, probe=False).warnings
    assert warnings and warnings[0].endswith("can overflow FP16 once |audio| > 4.04")
    assert any("MatMul node 'mel'" in w for w in warnings)
    assert not convert(fp32, target="bf16", probe=False).warnings  # BF16 has FP32's range
    path = tmp_path / "stft.onnx"
    onnx.save(fp32, path)
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx")]) == 0
    line = capsys.readouterr().out
    assert "| warning: Transpose node 'frames' can overflow FP16 once |audio| > 4.04 (and 2 more)" in line
    assert "--input-range NAME:LO,HI" in line
    assert main(["convert", str(path), "-o", str(tmp_path / "out.onnx"), "--input-range", "audio:-32768,32767"]) == 0
    assert "warning" not in capsys.readouterr().out


def test_a_normalized_image_model_gets_no_warning():
    assert not convert(catalog.load("resnet50-small"), probe=False).warnings


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ({"nope": (0.0, 1.0)}, "nope is not a graph input"),
        ({"audio": (3.0, 1.0)}, "finite range LO <= HI"),
        ({"audio": (0.0, float("inf"))}, "finite range"),
    ],
)
def test_bad_input_ranges_are_option_errors(ranges, message):
    with pytest.raises(OptionError, match=message) as info:
        convert(catalog.load("stft-power-mel"), input_ranges=ranges, probe=False)
    assert info.value.option == "input_ranges"


def _integer_inputs() -> onnx.ModelProto:
    """Token ids read by a Gather only (their range decides nothing: no float holds them), positions cast to
    float and added, as a distance |p_i - p_j|, to the attention logits (ALiBi: their range decides the bias)."""
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["x"]),
             helper.make_node("Cast", ["position_ids"], ["p"], to=onnx.TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["p", "a1"], ["pi"]), helper.make_node("Unsqueeze", ["p", "a0"], ["pj"]),
             helper.make_node("Sub", ["pi", "pj"], ["rel"]), helper.make_node("Abs", ["rel"], ["dist"]),
             helper.make_node("Mul", ["dist", "slope"], ["bias"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "xt"], ["s"]),
             helper.make_node("Add", ["s", "bias"], ["sb"]), helper.make_node("Softmax", ["sb"], ["probs"], axis=-1),
             helper.make_node("MatMul", ["probs", "x"], ["y"])]
    inits = [tensor("table", weights((32, 16))), tensor("a0", np.array([0], np.int64)),
             tensor("a1", np.array([1], np.int64)), tensor("slope", np.array(-0.5, np.float32))]
    return model(nodes, [vi("input_ids", onnx.TensorProto.INT64, ["seq"]), vi("position_ids", onnx.TensorProto.INT64,
                                                                             ["seq"])], [vi("y", F32, ["seq", 16])], inits)


def test_integer_input_range_is_refused_where_no_float_holds_its_values(tmp_path, capsys):
    path = tmp_path / "ids.onnx"
    onnx.save(_integer_inputs(), path)
    code = main(["convert", str(path), "-o", str(tmp_path / "o.onnx"), "--input-range", "input_ids:0,31"])
    assert code == 2
    err = capsys.readouterr().err
    assert "--input-range: input_ids is neither a float input nor an integer one cast to float" in err, err
    assert main(["convert", str(path), "-o", str(tmp_path / "o.onnx"), "--input-range", "x=1"]) == 2
    assert "expected NAME:LO,HI" in capsys.readouterr().err


def test_integer_input_cast_to_float_takes_a_range_and_the_probe_draws_in_it(tmp_path, capsys):
    """Positions past 2048 (a decoding step's) are what FP16 rounds: the probe draws the last ones of the
    stated range (8128..8191 here), where it drew 0..63; an attention mask cast to float takes one too."""
    path = tmp_path / "pos.onnx"
    onnx.save(_integer_inputs(), path)
    code = main(["convert", str(path), "-o", str(tmp_path / "o.onnx"), "--input-range", "position_ids:0,8191"])
    assert code == 0, capsys.readouterr().err
    assert "position_ids: positions up to 8191 (stated)" in capsys.readouterr().out
    mask = tmp_path / "mask.onnx"
    onnx.save(catalog.load("attention-mask-padding"), mask)
    assert main(["convert", str(mask), "-o", str(tmp_path / "o.onnx"), "--input-range", "attention_mask:0,1"]) == 0

    from amp_compiler.runtime.samples import random_samples
    drawn = random_samples(_integer_inputs(), {"input_ids": (64,), "position_ids": (64,)}, informed=True, input_ranges={"position_ids": (0, 8191)})
    assert drawn[0]["position_ids"].tolist() == list(range(8128, 8192))
