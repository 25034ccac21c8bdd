"""--target fp8 (ONNX): exact FP8 emulation, Q/DQ placement, the per-layer fallback, refusals, and
numerics vs FP32 on catalog models."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.core.fp8_numbers import dequantize, quantize, weight_scales
from amp_compiler.core.plan import Rule
from amp_compiler.errors import OptionError
from amp_compiler.onnx.load.deferred import DeferredModel
from amp_compiler.onnx.load.files import load_model_deferred
from amp_compiler.onnx.measure.checks import compare, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.measure.fp8_view import fp8_view
from amp_compiler.passes.onnx.qdq import Fp8Input
from amp_compiler.targets import Target
from models import catalog
from tests.support.fp8_builders import conv_net, mlp, session, to_fp8

F32 = onnx.TensorProto.FLOAT


def _qdq_model(scale: float) -> onnx.ModelProto:
    zp = oh.make_tensor("zp", onnx.TensorProto.FLOAT8E4M3FN, [], [0.0])
    graph = oh.make_graph(
        [oh.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], saturate=1),
         oh.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"])],
        "qdq", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, [None])],
        [oh.make_tensor_value_info("q", onnx.TensorProto.FLOAT8E4M3FN, [None]),
         oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT16, [None])],
        [nh.from_array(np.array(scale, dtype=np.float16), "s"), zp],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)], ir_version=9)


@pytest.mark.parametrize("scale", [1.0, 0.0078125, 0.3701, 3.5])
def test_emulated_fp8_equals_onnxruntime_and_ml_dtypes_on_every_fp16_value(scale):
    x = np.arange(2**16, dtype=np.uint16).view(np.float16)  # every FP16 value: NaN, inf, subnormals, -0
    s = np.float16(scale)
    q, y = session(_qdq_model(float(s))).run(None, {"x": x})
    ours = quantize(x, s)
    assert np.array_equal(ours.view(np.uint8), np.asarray(q).view(np.uint8))
    with np.errstate(invalid="ignore"):
        scaled = x.astype(np.float32) / np.float32(s)
    reference = np.clip(scaled, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(ours.view(np.uint8), reference.view(np.uint8))
    assert np.array_equal(dequantize(ours, s).view(np.uint16), np.asarray(y).view(np.uint16))


def test_fp8_target_ranges():
    assert (Target.FP8.max, Target.FP8.smallest_normal, Target.FP8.fallback) == (448.0, 2.0**-6, Target.FP16)
    assert Target.FP16.fallback is Target.FP16 and Target.BF16.fallback is Target.BF16


@pytest.mark.parametrize("build", [mlp, conv_net], ids=["mlp", "conv"])
def test_qdq_placement(build):
    model, samples = build()
    result = to_fp8(model, samples)
    out = result.model
    assert next(o.version for o in out.opset_import if o.domain in ("", "ai.onnx")) >= 19
    validate(out)  # checker full_check, strict shape inference
    inits = {i.name: i for i in out.graph.initializer}
    producers = {o: n for n in out.graph.node for o in n.output}
    gemms = [n for n in out.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")]
    assert gemms
    for gemm in gemms:
        act = producers[gemm.input[0]]
        assert act.op_type == "DequantizeLinear"
        quant = producers[act.input[0]]
        assert quant.op_type == "QuantizeLinear"
        assert {a.name: a.i for a in quant.attribute}.get("saturate") == 1
        assert inits[quant.input[1]].data_type == onnx.TensorProto.FLOAT16 and not inits[quant.input[1]].dims
        assert inits[quant.input[2]].data_type == onnx.TensorProto.FLOAT8E4M3FN
        assert not nh.to_array(inits[quant.input[2]]).astype(np.float32).any()  # zero point 0
        weight_dq = producers[gemm.input[1]]
        assert weight_dq.op_type == "DequantizeLinear" and weight_dq.input[0] in inits  # weight DQ constant
        stored = inits[weight_dq.input[0]]
        assert stored.data_type == onnx.TensorProto.FLOAT8E4M3FN
        channels = stored.dims[0] if gemm.op_type in ("Conv", "Gemm") else stored.dims[1]
        assert list(inits[weight_dq.input[1]].dims) == [channels]  # per output channel
        if len(gemm.input) > 2:  # bias stays FP16, unquantized
            assert inits[gemm.input[2]].data_type == onnx.TensorProto.FLOAT16
    assert {d.rule for d in result.decisions if d.op_type in ("MatMul", "Gemm", "Conv")} == {Rule.FP8_GEMM.value}
    for d in result.decisions:
        if d.op_type in ("QuantizeLinear", "DequantizeLinear"):
            assert (d.precision, d.rule) == ("fp8", Rule.FP8_QDQ.value)
    feeds = samples[0]
    reference = session(model).run(None, feeds)[0]
    got = session(emulate(out)).run(None, feeds)[0]
    acc = compare("y", reference, got)
    assert acc.finite and acc.cosine > 0.995 and acc.error_of_range < 0.05, acc
    native = session(out).run(None, feeds)[0]  # onnxruntime runs the FP8 graph itself too
    assert compare("y", reference, native).cosine > 0.995


def test_gemm_whose_input_fp8_cannot_hold_stays_fp16_with_its_statistic():
    model, samples = mlp(outlier=True)
    result = to_fp8(model, samples)
    by_name = {d.node: d for d in result.decisions}
    kept = by_name["mm1"]
    assert (kept.precision, kept.rule) == ("fp16", Rule.FP8_KEPT.value)
    assert "below FP8's smallest normal" in kept.reason and "output error" in kept.reason
    assert (by_name["gemm2"].precision, by_name["gemm2"].rule) == ("fp8", Rule.FP8_GEMM.value)
    producers = {o: n.op_type for n in result.model.graph.node for o in n.output}
    mm1 = next(n for n in result.model.graph.node if n.name == "mm1")
    assert "DequantizeLinear" not in {producers.get(i) for i in mm1.input}
    validate(result.model)


def test_gemms_over_the_end_to_end_budget_stay_fp16_with_their_error():
    model, samples = mlp()
    result = to_fp8(model, samples, fp8_budget=0.001)
    gemms = [d for d in result.decisions if d.op_type in ("MatMul", "Gemm")]
    assert {(d.precision, d.rule) for d in gemms} == {("fp16", Rule.FP8_KEPT.value)}
    assert all("moves the model's outputs by" in d.reason and "budget 0%" in d.reason for d in gemms)
    assert not any(n.op_type in ("QuantizeLinear", "DequantizeLinear") for n in result.model.graph.node)
    everything = to_fp8(model, samples, fp8_budget=1.0)
    assert {d.rule for d in everything.decisions if d.op_type in ("MatMul", "Gemm")} == {Rule.FP8_GEMM.value}


def test_fp8_needs_calibration_samples():
    model, _ = mlp()
    with pytest.raises(OptionError) as info:
        convert(model, target="fp8", probe=False)
    assert info.value.option == "calibration_data"


def test_cli_refuses_fp8_without_calibration_data(tmp_path, capsys):
    model, _ = mlp()
    path = tmp_path / "mlp.onnx"
    onnx.save(model, path)
    code = main(["convert", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "fp8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--calibration-data" in err[0]
    assert not (tmp_path / "out.onnx").exists()


def test_cli_converts_toto_fp8(tmp_path, capsys):
    model, samples = mlp()
    path, data = tmp_path / "mlp.onnx", tmp_path / "cal.npz"
    onnx.save(model, path)
    np.savez(data, x=samples[0]["x"])
    code = main(["convert", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "fp8",
                 "--calibration-data", str(data)])
    out = capsys.readouterr().out
    assert code == 0 and "Tensor Core ops in fp8: 2/2" in out and "of their FLOPs" in out
    validate(onnx.load(tmp_path / "out.onnx"))


# Reduced-size catalog models, held-out inputs (seed 100; calibration seeds 1..4), default options
# (end-to-end budget 0.1 relative L2). Bounds on the max error as a share of the output's range: what
# the FP8 outputs measured here (2.4-7.1%), with headroom; all-FP8 ResNet gives 15%.
_NUMERICS = {"bert-base-small": 0.06, "gpt2-small": 0.06, "vit-base-small": 0.06, "resnet50-small": 0.10}


@pytest.mark.parametrize("name", sorted(_NUMERICS))
def test_catalog_models_in_fp8_match_fp32(name):
    entry, model = catalog.get(name), catalog.load(name)
    samples = [entry.make_inputs(np.random.default_rng(seed)) for seed in range(1, 5)]
    result = to_fp8(model, samples)
    validate(result.model)
    held_out = entry.make_inputs(np.random.default_rng(100))
    reference = session(model).run(None, held_out)
    got = session(emulate(result.model)).run(None, held_out)
    assert sum(d.rule == Rule.FP8_GEMM.value for d in result.decisions) > 0
    for info, ref, out in zip(model.graph.output, reference, got, strict=True):
        if np.issubdtype(ref.dtype, np.floating):
            acc = compare(info.name, ref, out)
            assert acc.finite and acc.error_of_range <= _NUMERICS[name], (info.name, acc)
            assert acc.cosine >= 0.95, (info.name, acc)


def _external(model: onnx.ModelProto, folder) -> DeferredModel:
    """``model`` (a copy) saved with every initializer in ``weights.data`` beside it, read back with
    them all left on disk (a path leaves those of 64 KiB or more there: these weights are smaller)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    path = folder / "model.onnx"
    onnx.save(copy, path, save_as_external_data=True, all_tensors_to_one_file=True, location="weights.data",
              size_threshold=0)
    deferred = load_model_deferred(path, min_bytes=0, check=False)
    assert deferred.locations
    return deferred


def test_external_data_model_converts_like_the_in_memory_one(tmp_path):
    model, samples = conv_net()
    path = _external(model, tmp_path)
    in_memory = to_fp8(model, samples)
    on_disk = to_fp8(path, samples)  # weights read from disk for scales, statistics and FP8 conversion
    assert [(d.node, d.precision, d.rule, d.reason) for d in on_disk.decisions] == \
        [(d.node, d.precision, d.rule, d.reason) for d in in_memory.decisions]
    data = on_disk.save(tmp_path / "out.onnx")
    assert data is not None and data.name == "out.onnx.data" and data.stat().st_size > 0  # as the FP16 path writes
    written = onnx.load(tmp_path / "out.onnx", load_external_data=False)
    stored = {i.name: i for i in written.graph.initializer}
    fp8_weights = [i for i in stored.values()  # FP8 weights of 1 KiB or more (not zero points)
                   if i.data_type == onnx.TensorProto.FLOAT8E4M3FN and np.prod(i.dims) >= 1024]
    assert fp8_weights and all(i.data_location == onnx.TensorProto.EXTERNAL for i in fp8_weights)
    loaded = onnx.load(tmp_path / "out.onnx")
    validate(loaded)
    feeds = samples[0]
    assert np.array_equal(session(emulate(loaded)).run(None, feeds)[0],
                          session(emulate(in_memory.model)).run(None, feeds)[0])


def test_external_data_model_too_large_for_the_probes_is_refused(tmp_path, monkeypatch):
    import amp_compiler.onnx.fp8.steps as fp8

    model, samples = conv_net()
    monkeypatch.setattr(fp8, "_PROBE_LIMIT", 1024)
    with pytest.raises(OptionError) as info:
        to_fp8(_external(model, tmp_path), samples)
    assert info.value.option == "target" and "2 GiB" in str(info.value)


@pytest.mark.parametrize("low", [Target.FP16, Target.BF16])
@pytest.mark.parametrize(("shape", "axis"), [((64, 48), 1), ((16, 8, 3, 3), 0), ((32, 16), None)])
def test_probe_quantizes_weights_in_graph_exactly_as_the_offline_conversion(low, shape, axis):
    """The probes hold each weight once, quantized by QuantizeLinear inside the probe: bit for bit what
    the converted model stores (quantize offline) and its DequantizeLinear gives."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(shape) * rng.uniform(0.01, 3, shape)).astype(np.float32)
    w.flat[0] = 1e-9  # below FP8's smallest subnormal once scaled
    scales = weight_scales(w, axis, dtype=low.numpy_dtype)
    inp = Fp8Input(1, "W", scales, axis, w, float(np.abs(w).max()))
    view = fp8_view(inp, "p_")
    graph = oh.make_graph(view.nodes, "g", [], [oh.make_tensor_value_info(n, F32, None) for n in (view.fp8, view.fp16)],
                          [nh.from_array(w, "W"), *view.initializers])
    got8, got16 = session(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 19)], ir_version=9)).run(None, {})
    scale = inp.broadcast_scale()
    expected = dequantize(quantize(w, scale), scale, low.numpy_dtype).astype(np.float32)
    assert np.array_equal(got8.view(np.uint32), expected.view(np.uint32))
    assert np.array_equal(got16, w.astype(low.numpy_dtype).astype(np.float32))


def test_a_gemm_of_negligible_flops_takes_no_fp8_inputs():
    """A conv net's 10-class head (640 of 302M FLOPs) gains no speed from FP8 inputs and would spend the
    budget on their rounding (sweep Y: a GRU's head took rel-L2 3e-4 -> 0.053): it stays FP16; the conv,
    99.9998% of the Tensor Core FLOPs, still goes to FP8."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array((rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32), "w"),
             nh.from_array((rng.standard_normal((64, 10)) * 0.1).astype(np.float32), "h")]
    nodes = [oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             oh.make_node("Relu", ["c"], ["r"]), oh.make_node("GlobalAveragePool", ["r"], ["p"]),
             oh.make_node("Flatten", ["p"], ["f"]), oh.make_node("MatMul", ["f", "h"], ["y"], name="head")]
    graph = oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64, 64, 64])],
                          [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 10])], inits)
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    samples = [{"x": rng.standard_normal((1, 64, 64, 64)).astype(np.float32)} for _ in range(4)]
    result = to_fp8(model, samples, fp8_budget=1.0)
    by_name = {d.node: d for d in result.decisions}
    assert (by_name["head"].precision, by_name["head"].rule) == ("fp16", Rule.FP8_KEPT.value)
    assert "of the model's Tensor Core FLOPs, under 0.1%" in by_name["head"].reason
    assert (by_name["conv"].precision, by_name["conv"].rule) == ("fp8", Rule.FP8_GEMM.value)


def test_the_reports_low_precision_share_counts_fp16_beside_fp8():
    """An FP8 conversion's report said '<0.1% of FLOPs low precision' for a model 99.7% FP16 and FP8: it
    counted the target's type alone (sweep Y); the FX report counts every low precision."""
    from amp_compiler.report.build import build_report

    model, samples = mlp()
    result = to_fp8(model, samples, fp8_budget=0.001)  # every GEMM kept FP16
    report = build_report(model, result, model_name="mlp")
    low = sum(n.flops or 0 for n in report.nodes if n.precision in ("fp16", "fp8") and n.rule != "lowering.cast")
    assert report.summary.flops_low >= low > 0.9 * report.summary.flops_total
