"""--target fp8 options: the BF16 fallback (--fallback bf16) and percentile calibration of activation
scales (--fp8-calibration percentile, --fp8-percentile): structure, the scales they give, numerics vs
FP32, and refusals."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper as nh
import pytest

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.core.fp8_numbers import stored_scale
from amp_compiler.core.plan import Rule
from amp_compiler.errors import OptionError
from amp_compiler.onnx.fp8.scales import histogram_percentile, magnitude_histogram
from amp_compiler.onnx.measure.checks import compare, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.targets import Target
from models import catalog
from tests.support.fp8_builders import conv_net, mlp, session, to_fp8

BF16 = onnx.TensorProto.BFLOAT16
FP16 = onnx.TensorProto.FLOAT16


def _types(model: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor of the main graph (inferred), initializers included."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out = {i.name: i.data_type for i in model.graph.initializer}
    for vi in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        out[vi.name] = vi.type.tensor_type.elem_type
    return out


# ---------------------------------------------------------------- --fallback bf16


@pytest.mark.parametrize("build", [mlp, conv_net], ids=["mlp", "conv"])
def test_bf16_fallback_quantizes_bf16_inputs_and_leaves_no_fp16(build):
    model, samples = build()
    result = to_fp8(model, samples, fallback="bf16")
    out = result.model
    validate(out)
    assert next(o.version for o in out.opset_import if o.domain in ("", "ai.onnx")) >= 22  # bfloat16 Conv
    types = _types(out)
    assert FP16 not in types.values()
    producers = {o: n for n in out.graph.node for o in n.output}
    gemms = [n for n in out.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
    for gemm in gemms:
        dq = producers[gemm.input[0]]
        q = producers[dq.input[0]]
        assert (q.op_type, dq.op_type) == ("QuantizeLinear", "DequantizeLinear")
        assert types[q.input[0]] == BF16 and types[q.input[1]] == BF16  # BF16 input, BF16 scale
        assert types[gemm.input[0]] == BF16 and types[gemm.input[1]] == BF16  # DQ outputs BF16
        assert types[producers[gemm.input[1]].input[0]] == onnx.TensorProto.FLOAT8E4M3FN
    low = {d.precision for d in result.decisions if d.op_type not in ("MatMul", "Gemm", "Conv")} - {"fp8", "none"}
    assert "bf16" in low and "fp16" not in low
    assert {d.rule for d in result.decisions if d.op_type in ("MatMul", "Gemm", "Conv")} == {Rule.FP8_GEMM.value}
    reference = session(model).run(None, samples[0])[0]
    got = session(emulate(out)).run(None, samples[0])[0]  # exact BF16 storage and FP8 Q/DQ
    acc = compare("y", reference, got)
    assert acc.finite and acc.cosine > 0.995 and acc.error_of_range < 0.05, acc


def test_bf16_fallback_keeps_the_gemm_fp8_cannot_hold_in_bf16():
    model, samples = mlp(outlier=True)
    result = to_fp8(model, samples, fallback="bf16")
    kept = next(d for d in result.decisions if d.node == "mm1")
    assert (kept.precision, kept.rule) == ("bf16", Rule.FP8_KEPT.value)
    assert kept.reason.startswith("kept BF16") and "vs BF16 inputs" in kept.reason


def test_catalog_model_with_bf16_fallback_matches_fp32():
    entry, model = catalog.get("bert-base-small"), catalog.load("bert-base-small")
    samples = [entry.make_inputs(np.random.default_rng(seed)) for seed in range(1, 5)]
    result = to_fp8(model, samples, fallback="bf16")
    validate(result.model)
    assert sum(d.rule == Rule.FP8_GEMM.value for d in result.decisions) > 0
    assert "fp16" not in {d.precision for d in result.decisions}
    held_out = entry.make_inputs(np.random.default_rng(100))
    reference = session(model).run(None, held_out)
    got = session(emulate(result.model)).run(None, held_out)
    for info, ref, out in zip(model.graph.output, reference, got, strict=True):
        acc = compare(info.name, ref, out)
        assert acc.finite and acc.cosine >= 0.995 and acc.error_of_range <= 0.06, (info.name, acc)


@pytest.mark.parametrize(("options", "option"), [
    ({"target": "fp16", "fallback": "bf16"}, "fallback"),
    ({"target": "fp8", "fallback": "fp8"}, "fallback"),
    ({"target": "fp8", "fallback": "int8"}, "fallback"),
    ({"target": "fp8", "fp8_calibration": "entropy"}, "fp8_calibration"),
    ({"target": "fp8", "fp8_percentile": 0.0}, "fp8_percentile"),
    ({"target": "fp8", "fp8_percentile": 100.5}, "fp8_percentile"),
])
def test_bad_fallback_and_calibration_options_are_refused(options, option):
    model, samples = mlp()
    with pytest.raises(OptionError) as info:
        convert(model, samples=samples, **options)
    assert info.value.option == option


def test_cli_fallback_and_percentile(tmp_path, capsys):
    model, samples = mlp(outlier=True)
    path, data = tmp_path / "mlp.onnx", tmp_path / "cal.npz"
    onnx.save(model, path)
    np.savez(data, x=samples[0]["x"])
    out = tmp_path / "out.onnx"
    code = main(["convert", str(path), "-o", str(out), "--target", "fp8", "--calibration-data", str(data),
                 "--fallback", "bf16", "--fp8-calibration", "percentile", "--fp8-percentile", "95"])
    assert code == 0 and "Tensor Core ops in fp8: 2/2" in capsys.readouterr().out
    assert BF16 in _types(onnx.load(out)).values()
    code = main(["convert", str(path), "-o", str(out), "--target", "bf16", "--calibration-data", str(data)])
    assert code == 0, capsys.readouterr().err  # the BF16 model's report runs (no bfloat16 tensor exposed)
    capsys.readouterr()
    code = main(["convert", str(path), "-o", str(out), "--fallback", "bf16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--fallback" in err[0] and "--target fp8" in err[0]


# ---------------------------------------------------------------- percentile calibration


def test_magnitude_histogram_percentile_is_exact_on_rounded_values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(10_000).astype(np.float32) * 3
    x[:3] = [np.nan, np.inf, -1e6]
    for low in (Target.FP16, Target.BF16):
        counts = magnitude_histogram(x, low)
        with np.errstate(over="ignore"):
            held = np.abs(x.astype(low.numpy_dtype).astype(np.float64))
        held = np.sort(held[~np.isnan(held)])  # NaN never counts; inf does
        assert counts.sum() == held.size
        for q in (50.0, 99.0, 99.9, 99.99, 100.0):
            expected = held[int(np.ceil(q / 100 * held.size)) - 1]  # the smallest v with share(|x| <= v) >= q
            assert histogram_percentile(counts, q, low) == expected, (low, q)


def test_percentile_clips_the_outlier_and_sets_the_scale_from_the_percentile():
    model, samples = mlp(outlier=True)  # one |x| = 2e4 among 64 values per sample, which W1 ignores
    by_max = to_fp8(model, samples)
    assert next(d for d in by_max.decisions if d.node == "mm1").rule == Rule.FP8_KEPT.value
    clipped = to_fp8(model, samples, fp8_calibration="percentile", fp8_percentile=98, fp8_margin=0)
    mm1 = next(d for d in clipped.decisions if d.node == "mm1")
    assert (mm1.precision, mm1.rule) == ("fp8", Rule.FP8_GEMM.value)
    assert "98th percentile of |x|" in mm1.reason
    values = np.concatenate([s["x"].ravel() for s in samples]).astype(np.float16).astype(np.float64)
    p98 = np.sort(np.abs(values))[int(np.ceil(0.98 * values.size)) - 1]
    inits = {i.name: nh.to_array(i) for i in clipped.model.graph.initializer}
    producers = {o: n for n in clipped.model.graph.node for o in n.output}
    mm1_node = next(n for n in clipped.model.graph.node if n.name == "mm1")
    q = producers[producers[mm1_node.input[0]].input[0]]
    assert q.op_type == "QuantizeLinear"
    assert inits[q.input[1]] == stored_scale(p98 / 448, np.float16)  # amax * 2^0 / 448, the 98th percentile's
    assert p98 < 10 and inits[q.input[1]] < stored_scale(2.0e4 / 448, np.float16) / 1000
    reference = session(model).run(None, samples[0])[0]
    got = session(emulate(clipped.model)).run(None, samples[0])[0]
    acc = compare("y", reference, got)  # the clipped outlier meets zero weights: no harm at the output
    assert acc.finite and acc.cosine > 0.995, acc
    fp8_values = session(clipped.model).run(None, samples[0])  # the outlier saturates to 448 * scale
    assert np.all(np.isfinite(fp8_values[0]))


def test_percentile_100_is_the_max_calibration():
    model, samples = mlp()
    by_max = to_fp8(model, samples)
    by_p100 = to_fp8(model, samples, fp8_calibration="percentile", fp8_percentile=100)
    scales = [{i.name: i.raw_data for i in r.model.graph.initializer if i.name.endswith("_scale")}
              for r in (by_max, by_p100)]
    assert scales[0] == scales[1]


def test_bf16_scales_are_bf16_values():
    assert stored_scale(0.1, Target.BF16.numpy_dtype).dtype == ml_dtypes.bfloat16
    assert float(stored_scale(1e-30, Target.FP16.numpy_dtype)) == 2.0**-14  # FP16's smallest normal
    assert float(stored_scale(1e-40, Target.BF16.numpy_dtype)) == float(ml_dtypes.finfo(ml_dtypes.bfloat16).smallest_normal)
