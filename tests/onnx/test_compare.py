"""`amp-compiler compare` and amp_compiler.onnx.compare: outputs, where the error grows, rules, any pair of models."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnxconverter_common import float16

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.errors import ModelRunError
from amp_compiler.onnx.compare import compare_models
from amp_compiler.report.comparison import render_comparison
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.targets import Provider
from models import catalog
from tests.support.onnx_builders import F32, model, tensor, vi


def _samples(name: str, n: int = 2) -> list[dict[str, np.ndarray]]:
    entry = catalog.get(name)
    return [entry.make_inputs(np.random.default_rng(s)) for s in range(n)]


def test_our_conversion_compares_close_with_rules():
    fp32 = catalog.load("mlp-softmax")
    c = compare_models(fp32, convert(fp32, probe=False).model, _samples("mlp-softmax"))
    assert not c.generated_inputs and c.samples == 2 and c.emulated
    (out,) = c.outputs
    assert out.name == "y" and out.cosine > 0.999 and out.nonfinite == 0
    assert out.argmax_agreement is not None and out.argmax_agreement > 0.9
    assert c.growth and all(e.rule for e in c.growth)  # a default conversion made it: every rule known
    assert "is what a default fp16 conversion" in c.decisions
    assert [e.position for e in c.growth] == sorted(e.position for e in c.growth)


def test_a_mixed_fp16_bf16_model_compares_as_the_fp16_conversion_it_is():
    """FP16 with a BF16 range fallback: emulated tensor by tensor, and its rules are those of the
    default FP16 conversion (not BF16's, though it holds BF16 tensors)."""
    from tests.passes.analysis.test_range_fallback import _scaled

    fp32 = _scaled()
    samples = [{"x": np.random.default_rng(s).standard_normal((4, 16)).astype(np.float32)} for s in range(2)]
    c = compare_models(fp32, convert(fp32, probe=False).model, samples)
    (out,) = c.outputs
    assert out.nonfinite == 0 and out.cosine > 0.999
    assert "is what a default fp16 conversion" in c.decisions
    assert {e.node: e.precision for e in c.growth}.get("big_mm") == "bf16"


def test_other_tools_output_first_nonfinite_named():
    """onnxconverter-common runs Exp in FP16: e^40 overflows, and compare names the Exp as the first
    NaN/Inf; its precision differs from ours, so no rule is claimed for it."""
    fp32 = catalog.load("exp-range")
    occ = float16.convert_float_to_float16(fp32, keep_io_types=True)
    c = compare_models(fp32, occ, _samples("exp-range"))
    assert c.first_nonfinite is not None and c.first_nonfinite.node == "exp"
    assert c.first_nonfinite.precision == "fp16" and c.first_nonfinite.rule is None
    assert c.outputs[0].nonfinite > 0
    ours = compare_models(fp32, convert(fp32, probe=False).model, _samples("exp-range"))
    assert ours.first_nonfinite is None and ours.outputs[0].nonfinite == 0


def test_growth_names_the_node_that_adds_error():
    """A converted model with one weight perturbed: the error starts growing at that MatMul."""
    fp32 = catalog.load("mlp-softmax")
    bad = convert(fp32, probe=False).model
    w = next(i for i in bad.graph.initializer if i.name == "W2")
    arr = numpy_helper.to_array(w).copy()
    arr.flat[0] += np.asarray(0.5, arr.dtype)
    w.CopyFrom(numpy_helper.from_array(arr, "W2"))
    c = compare_models(fp32, bad, _samples("mlp-softmax"), top=1)
    assert [e.node for e in c.growth] == ["matmul2"]


def test_generated_inputs_are_said(tmp_path):
    fp32 = catalog.load("mlp-softmax")
    c = compare_models(fp32, convert(fp32, probe=False).model)
    assert c.generated_inputs and any("generated" in w for w in c.warnings)
    text = render_comparison(c)
    assert "generated inputs" in text and all(len(line) <= 80 for line in text.splitlines())


def test_unrunnable_converted_model_is_a_user_error():
    fp32 = catalog.load("mlp-softmax")
    broken = convert(fp32, probe=False).model
    broken.graph.node[1].op_type = "NoSuchOp"
    with pytest.raises(ModelRunError, match="converted: onnxruntime could not load the model"):
        compare_models(fp32, broken)


def test_cuda_without_onnxruntime_gpu_is_an_option_error():
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider")
    from amp_compiler.errors import OptionError

    fp32 = catalog.load("mlp-softmax")
    with pytest.raises(OptionError) as info:
        compare_models(fp32, convert(fp32, probe=False).model, provider=Provider.CUDA)
    assert info.value.option == "provider"


def _saved(tmp_path, name: str, model: onnx.ModelProto):
    path = tmp_path / name
    onnx.save(model, path)
    return path


def test_cli_json_and_terminal(tmp_path, capsys):
    fp32 = catalog.load("mlp-softmax")
    a = _saved(tmp_path, "fp32.onnx", fp32)
    b = _saved(tmp_path, "fp16.onnx", convert(fp32, probe=False).model)
    data = tmp_path / "data"
    data.mkdir()
    for i, sample in enumerate(_samples("mlp-softmax", 3)):
        np.savez(data / f"{i}.npz", **sample)
    assert main(["compare", str(a), str(b), "--data", str(data), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["schema_version"] == 3 and out["changed"] is None and out["metric"] == "rel-l2" and out["samples"] == 3
    assert out["outputs"][0]["name"] == "y" and out["error"] == out["outputs"][0]["error"] > 0
    assert main(["compare", str(a), str(b), "--top", "2"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("fp16.onnx vs fp32.onnx: cpu") and "where the error grows most" in text


def test_cli_errors_are_one_line(tmp_path, capsys):
    fp32 = catalog.load("mlp-softmax")
    a = _saved(tmp_path, "fp32.onnx", fp32)
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    assert main(["compare", str(a), str(tmp_path / "junk.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "junk.onnx" in err
    other = helper.make_model(
        helper.make_graph([helper.make_node("Relu", ["q"], ["y"])], "g",
                          [helper.make_tensor_value_info("q", 1, [2])], [helper.make_tensor_value_info("y", 1, [2])]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=8,
    )
    b = _saved(tmp_path, "other.onnx", other)
    data = tmp_path / "x.npz"
    np.savez(data, x=np.zeros((4, 16), np.float32))
    assert main(["compare", str(a), str(b), "--data", str(data)]) == 2
    assert capsys.readouterr().err.startswith("amp-compiler: error: other.onnx")


def test_the_fp32_reference_is_the_models_semantics_with_intermediates_exposed():
    """onnxruntime 1.32's extended fusions compute a per-channel DequantizeLinear -> MatMul wrongly
    once the DQ output is a graph output (one column off by 30% of the range): the exposed reference
    runs with basic optimisations, so a faithful conversion compares as one."""
    entry = catalog.get("qdq")
    fp32 = catalog.load(entry)
    samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(2)]
    (out,) = compare_models(fp32, convert(fp32, probe=False).model, samples).outputs
    assert out.cosine > 0.9999 and out.error_of_range < 0.01, out


def test_output_errors_leave_out_non_finite_references_and_flag_non_finite_outputs():
    from amp_compiler.core.tensor_error import OutputErrors

    found = OutputErrors(2)
    ref = [np.array([3.0, np.inf, 4.0]), np.array([0.0, 0.0])]
    assert found.add(ref, [np.array([3.0, np.nan, 4.5]), np.array([0.0, 0.0])])  # inf reference: left out
    assert found.relative() == [pytest.approx(0.1), 0.0]  # 0.5 / |(3, 4)|; zero against zero
    assert not found.add(ref, [np.array([np.inf, 1.0, 4.0]), np.array([0.0, 0.0])])
    assert found.relative()[0] == np.inf and found.worst() == np.inf


def test_compares_argmax_is_the_metrics_a_nan_row_never_agrees_one_logit_has_none():
    """Before: compare read the converted NaN as -inf, so the row still agreed (agreement 1.0)."""
    def pair(offset):
        return model(
            [helper.make_node("Add", ["x", "offset"], ["y"], name="add"),
             helper.make_node("ReduceMax", ["x", "last"], ["p"], name="top", keepdims=1)],
            [vi("x", F32, [2, 3])], [vi("y", F32, [2, 3]), vi("p", F32, [2, 1])], [tensor("offset", offset), tensor("last", np.array([-1], np.int64))],
        )

    nan_offset = np.array([[0.0, np.nan, 0.0], [0.0, 0.0, 0.0]], np.float32)
    sample = {"x": np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]], np.float32)}
    c = compare_models(pair(np.zeros((2, 3), np.float32)), pair(nan_offset), [sample], runner=InProcessRunner())
    by_name = {o.name: o for o in c.outputs}
    assert by_name["y"].argmax_agreement == 0.5 and by_name["p"].argmax_agreement is None


def test_tf32_reads_a_kept_fp32_product_as_the_gpu_does(tmp_path, capsys):
    """``--tf32``: the converted model's FP32 Tensor Core ops read their operands at TF32's precision
    (onnxruntime's CUDA provider and TensorRT by default). An FP32 model compared with itself differs by
    nothing under exact emulation and by TF32's rounding of its MatMuls' operands with it, a relative
    L2 error of about 2^-12; the comparison says how it ran. On ``cuda`` (real kernels, onnxruntime's own
    ``use_tf32``) the option is refused in one line."""
    fp32 = catalog.load("mlp-softmax")
    samples = _samples("mlp-softmax")
    exact = compare_models(fp32, fp32, samples, runner=InProcessRunner())
    tf32 = compare_models(fp32, fp32, samples, runner=InProcessRunner(), tf32=True)
    assert tf32.tf32 and not exact.tf32
    assert exact.error == 0.0 and 1e-5 < tf32.error < 1e-2
    products = sum(n.op_type in ("MatMul", "Gemm") for n in fp32.graph.node)
    (hint,) = [w for w in exact.warnings if "TF32" in w]  # exact emulation says what it did not measure
    assert hint.startswith(f"{products} matrix product(s) of converted are FP32 (") and "--tf32" in hint
    assert not any("TF32" in w for w in tf32.warnings)
    ours = compare_models(fp32, convert(fp32, probe=False).model, samples, runner=InProcessRunner())
    assert not any("TF32" in w for w in ours.warnings)  # every product FP16: nothing for TF32 to read
    a = _saved(tmp_path, "fp32.onnx", fp32)
    assert main(["compare", str(a), str(a), "--tf32"]) == 0
    assert "FP32 matrix products' operands as TF32" in " ".join(capsys.readouterr().out.split())
    assert main(["compare", str(a), str(a), "--tf32", "--provider", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tf32" in err and "use_tf32" in err and "\n" not in err


def test_without_data_compare_runs_the_inputs_convert_stated_its_error_on():
    """Before: one N(0, 1) sample with every integer 1 (a single token of id 1 for a text model), not
    the probe's: `convert` warned of an error that the `compare` it named did not show."""
    fp32 = catalog.load("bert-base-small")
    result = convert(fp32)
    c = compare_models(fp32, result.model)
    stated = {a.name: a.error_of_range for a in result.accuracy}
    assert stated and set(stated) == {o.name for o in c.outputs}
    for o in c.outputs:
        assert o.error_of_range == pytest.approx(stated[o.name], rel=1e-6, abs=1e-9)
    assert any("range probe" in w and "sequence=64" in w for w in c.warnings)


def test_without_data_compare_runs_an_image_model_on_the_probes_images():
    """Uniform noise and dead leaves at 224x224, and dead leaves at the other normalizations (the graph
    does not normalize), as the probe (each output's error over all: convert states the worst, each
    against its own image's output range)."""
    from amp_compiler.onnx.measure.range_probe import LEAVES_PER_NORMALIZATION

    fp32 = catalog.load("mobilenetv2-small")
    result = convert(fp32)
    c = compare_models(fp32, result.model)
    assert c.samples == 2 + 2 * LEAVES_PER_NORMALIZATION and any("dead leaves" in w for w in c.warnings)
    stated = max(a.error_of_range for a in result.accuracy)
    # compare pools both images (one range over both, wider than either's): at most what convert states
    assert 0 < max(o.error_of_range for o in c.outputs) <= 1.5 * stated


def test_cli_input_shape_sizes_the_generated_inputs(tmp_path, capsys):
    fp32 = catalog.load("bert-base-small")
    a = _saved(tmp_path, "fp32.onnx", fp32)
    b = _saved(tmp_path, "fp16.onnx", convert(fp32, probe=False).model)
    assert main(["compare", str(a), str(b), "--input-shape", "input_ids:1x16", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["generated_inputs"] and out["outputs"]
    assert main(["compare", str(a), str(b), "--input-shape", "input_ids:1x4096"]) == 2  # beyond the position table
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "64 by 4096" in err
    assert main(["compare", str(a), str(b), "--input-shape", "ids:1x16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--input-shape" in err and "not a graph input" in err
    np.savez(tmp_path / "x.npz", input_ids=np.ones((1, 16), np.int64))
    assert main(["compare", str(a), str(b), "--input-shape", "input_ids:1x16", "--data", str(tmp_path / "x.npz")]) == 2
    assert "--data gives the inputs" in capsys.readouterr().err


def test_a_node_writing_a_graph_output_kept_fp32_shows_its_own_precision():
    """The MatMul writes the output's FP16 copy and a Cast the output's name; before, the row of the
    MatMul showed the Cast's fp32 (the type of the tensor of its output's name)."""
    x, y = helper.make_tensor_value_info("x", 1, [4, 16]), helper.make_tensor_value_info("y", 1, [4, 8])
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32), "w")
    m = helper.make_model(
        helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="last")], "g", [x], [y], [w]),
        opset_imports=[helper.make_opsetid("", 18)], ir_version=9,
    )
    converted = convert(m, probe=False).model
    assert [n.op_type for n in converted.graph.node if "y" in n.output] == ["Cast"]
    c = compare_models(m, converted, [{"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}])
    assert [(g.node, g.precision) for g in c.growth] == [("last", "fp16")]


def _unnamed_mlp() -> onnx.ModelProto:
    """x -> MatMul -> Relu -> MatMul -> y, no node named (as onnx.helper graphs often are)."""
    rng = np.random.default_rng(0)
    w1, w2 = (numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for s, n in (((16, 32), "w1"), ((32, 8), "w2")))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["y"])]
    x, y = helper.make_tensor_value_info("x", 1, [4, 16]), helper.make_tensor_value_info("y", 1, [4, 8])
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w1, w2]),
                             opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def test_unnamed_nodes_of_our_conversion_get_their_rules_and_precision():
    """Before, rules were matched by node name only ("0 of 0 named nodes have the precision..."), and the
    unnamed MatMul writing the output showed the Cast's fp32."""
    m = _unnamed_mlp()
    c = compare_models(m, convert(m).model, [{"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}])
    assert "is what a default fp16 conversion" in c.decisions
    rows = {e.position: e for e in c.growth}
    assert rows[2].op_type == "MatMul" and rows[2].precision == "fp16" and rows[2].rule == "policy.low"


def test_unnamed_nodes_another_tool_converted_say_why_no_rules():
    m = _unnamed_mlp()
    other = float16.convert_float_to_float16(m, keep_io_types=True)
    c = compare_models(m, other, [{"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}])
    assert c.decisions.startswith("no rules:") and "no names" in c.decisions
    assert all(not e.rule for e in c.growth)


def test_compare_counts_changed_labels_and_topk_indices(tmp_path, capsys):
    """Before: integer outputs were left out ('outputs not compared (not float ...)'), the table was empty
    and the worst line said 0 for a model whose labels changed."""
    from tests.support.onnx_builders import CLEAR_WEIGHTS, NEAR_TIE_WEIGHTS, label_model

    x = np.random.default_rng(0).standard_normal((64, 2)).astype(np.float32)
    changed = int((x[:, 0] > 0).sum())  # every row with x[:, 0] > 0 ties in FP16
    fp32 = label_model(NEAR_TIE_WEIGHTS)
    src, dst, data = tmp_path / "m.onnx", tmp_path / "m.fp16.onnx", tmp_path / "x.npz"
    onnx.save(fp32, src)
    onnx.save(convert(fp32, probe=False).model, dst)
    np.savez(data, x=x)
    assert main(["compare", str(src), str(dst), "--data", str(data)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("label "))
    assert row.split()[-1] == f"{changed / 64:.1%}"
    assert f"integer output label: {changed} of 64 values ({changed / 64:.1%}) changed" in " ".join(out.split())
    assert "worst output error (rel-l2): 0" not in out and "not compared" not in out

    topk = label_model(NEAR_TIE_WEIGHTS, topk=True)
    c = compare_models(topk, convert(topk, probe=False).model, [{"x": x}], runner=InProcessRunner())
    by_name = {o.name: o for o in c.outputs}
    assert by_name["classes"].changed_values == 2 * changed and by_name["classes"].values == 128
    assert by_name["top"].changed is None and c.changed == 2 * changed / 128
    assert f"integer output classes: {2 * changed} of 128 values" in " ".join(render_comparison(c).split())
    assert json.loads(render_comparison(c, "json"))["outputs"][1]["changed"] == 2 * changed / 128

    clear = label_model(CLEAR_WEIGHTS)
    same = compare_models(clear, convert(clear, probe=False).model, [{"x": x}], runner=InProcessRunner())
    assert same.changed == 0.0 and "label: 0 of 64 values (0%) changed" in " ".join(render_comparison(same).split())


def test_a_mask_written_as_minus_32768_by_design_is_not_ranked_as_error_growth():
    """Before, the causal mask (float32's lowest, which the conversion writes as -32768) was the first row
    of "where the error grows most" (rel L2 1.0, 100% of range) and hid the real sources of error."""
    s, h = 16, 32
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, h ** -0.5, (h, h)).astype(np.float32), n) for n in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
              numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest"),
              numpy_helper.from_array(np.tril(np.ones((s, s), bool)), "causal")]
    nodes = [
        helper.make_node("Where", ["causal", "zero", "lowest"], ["mask"], name="where_mask"),
        helper.make_node("MatMul", ["x", "wq"], ["q"], name="q"), helper.make_node("MatMul", ["x", "wk"], ["k"], name="k"),
        helper.make_node("MatMul", ["x", "wv"], ["v"], name="v"),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1], name="kt"),
        helper.make_node("MatMul", ["q", "kt"], ["sc"], name="scores"),
        helper.make_node("Add", ["sc", "mask"], ["sm"], name="add_mask"),
        helper.make_node("Softmax", ["sm"], ["p"], axis=-1, name="softmax"),
        helper.make_node("MatMul", ["p", "v"], ["y"], name="pv"),
    ]
    m = helper.make_model(helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F32, [1, s, h])],
                                            [helper.make_tensor_value_info("y", F32, [1, s, h])], inits),
                          opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    c = compare_models(m, convert(m, probe=False).model, [{"x": rng.normal(size=(1, s, h)).astype(np.float32)}])
    assert c.growth and all(e.node not in ("where_mask", "add_mask") for e in c.growth)
    assert any("not ranked: 2 tensor(s)" in w and "where_mask, add_mask" in w for w in c.warnings)


def _two_matmuls(out: int = 16) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"), helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    inits = [tensor("w1", (rng.standard_normal((64, 128)) / 8).astype(np.float32)),
             tensor("w2", (rng.standard_normal((128, out)) / 11).astype(np.float32))]
    return model(nodes, [vi("x", F32, ["b", 64])], [vi("y", F32, ["b", out])], inits)


def test_an_fp8_conversion_is_said_and_its_gemms_are_fp8():
    """Its FP8 GEMMs write FP16 as a default FP16 conversion's do: compare called it that conversion and
    gave them policy.low, the nodes where the error grew (sweep Y)."""
    fp32 = _two_matmuls()
    samples = [{"x": np.random.default_rng(s).standard_normal((32, 64)).astype(np.float32)} for s in range(4)]
    with InProcessRunner() as runner:
        fp8 = convert(fp32, target="fp8", samples=samples, runner=runner).model
    c = compare_models(fp32, fp8, samples)
    assert {e.node: e.precision for e in c.growth if e.op_type == "MatMul"} == {"mm1": "fp8", "mm2": "fp8"}
    assert c.decisions.startswith("no rules: the converted model is an FP8 conversion (2 node(s) read FP8 inputs")
    assert not any(e.rule for e in c.growth)


def test_nodes_a_default_conversion_does_not_make_are_said():
    """A padded conversion adds a Slice (10 outputs padded to 16): it is no default conversion, whatever
    its other nodes are."""
    fp32 = _two_matmuls(out=10)
    samples = [{"x": np.random.default_rng(s).standard_normal((32, 64)).astype(np.float32)} for s in range(2)]
    padded = convert(fp32, probe=False, pad_tensor_cores=True).model
    c = compare_models(fp32, padded, samples)
    assert "is what a default" not in c.decisions
    assert "node(s) a default fp16 conversion does not make" in c.decisions
