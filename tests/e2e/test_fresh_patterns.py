"""The four failures of a default conversion on models nobody had tuned for (models/fresh_patterns.py,
issue 23): the range probe fixes the overflow, and the conversion measures and warns about the rest."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.output_error import misses, output_accuracy
from amp_compiler.runtime.runner import InProcessRunner
from models import catalog


def _scored(name: str) -> list[dict[str, np.ndarray]]:
    entry = catalog.get(name)
    return [entry.make_inputs(np.random.default_rng(s)) for s in (100, 101)]


def _accuracy(name: str, converted) -> list:
    return output_accuracy(catalog.load(name), converted, _scored(name), InProcessRunner())


def test_detect_head_overflows_without_the_probe():
    """The pattern: the blind conversion's heatmap holds NaN/Inf under exact emulation."""
    fp32 = catalog.load("detect-head-overflow")
    blind = convert(fp32, runner=InProcessRunner(), probe=False)
    assert not all(a.finite for a in _accuracy("detect-head-overflow", blind.model))


def test_the_probe_finds_the_detect_heads_hidden_overflow_and_scales_it_into_fp16():
    fp32 = catalog.load("detect-head-overflow")
    result = convert(fp32, probe=True, runner=InProcessRunner())
    by_node = {d.node: d for d in result.decisions}
    # pinned for the overflow the probe saw, then run in FP16 on power-of-two scaled operands (the
    # default range fallback on cuda; an opset-17 Conv has no BF16), not FP32
    assert (by_node["head_hidden"].precision, by_node["head_hidden"].rule) == ("fp16", "probe.overflow")
    assert "generated inputs" in by_node["head_hidden"].reason and "power-of-two scales" in by_node["head_hidden"].reason
    assert by_node["head_hidden_relu"].precision == "fp32"  # its 3e5 stays out of FP16
    assert all(by_node[f"stage{i}"].precision == "fp16" for i in range(3))
    accuracy = _accuracy("detect-head-overflow", result.model)
    assert accuracy and not any(misses(a) for a in accuracy), accuracy
    assert result.accuracy and all(a.finite for a in result.accuracy)  # its own measure, on generated inputs
    assert "normalized image -2.12..2.64" in result.probe_inputs


def test_the_vae_decoder_is_nan_on_real_latents_without_the_probe():
    blind = convert(catalog.load("vae-decoder-overflow"), runner=InProcessRunner(), probe=False)
    assert not all(a.finite for a in _accuracy("vae-decoder-overflow", blind.model))


def test_the_probe_draws_the_decoders_latents_at_their_scale_and_scales_its_overflow_into_fp16():
    """Probed as a -1..1 image, conv_in peaked near 1.5e4 (FP16 holds it, with the 2x margin): nothing was
    kept out of FP16 and the image was NaN on real latents (latents / 0.13025). As latents N(0, 7.7) the
    probe sees the 1e5 real latents give."""
    result = convert(catalog.load("vae-decoder-overflow"), probe=True, runner=InProcessRunner())
    assert result.probe_inputs == "latent_sample: latents N(0, 7.7)"
    by_node = {d.node: d for d in result.decisions}
    assert (by_node["conv_in"].precision, by_node["conv_in"].rule) == ("fp16", "probe.overflow")
    assert "power-of-two scales" in by_node["conv_in"].reason  # on Tensor Cores, not FP32
    assert all(d.precision == "fp16" for d in result.decisions if d.op_type == "Conv" and d.node != "post_quant_conv")
    # a 1x1 Conv over the 4 raw latent channels (K = 4): below one MMA tile, FP32 (policy.high.raw-small-product)
    assert (by_node["post_quant_conv"].precision, by_node["post_quant_conv"].rule) == (
        "fp32", "policy.high.raw-small-product")
    accuracy = _accuracy("vae-decoder-overflow", result.model)
    assert accuracy and all(a.finite for a in accuracy) and not any(misses(a) for a in accuracy), accuracy


@pytest.mark.parametrize("name", ["text-det-sigmoid", "ctc-wide-softmax", "seg-sigmoid-edge"])
def test_accuracy_the_probe_cannot_fix_is_measured_and_flagged(name):
    """Nothing overflows: the conversion stays as it was, misses 2% of range on real-like inputs, and
    its own measure on generated inputs says so (the summary line's warning)."""
    fp32 = catalog.load(name)
    result = convert(fp32, probe=True, runner=InProcessRunner())
    assert any(misses(a) for a in _accuracy(name, result.model))
    assert any(misses(a) for a in result.accuracy), result.accuracy
    assert all(a.rel_l2 is not None and np.isfinite(a.rel_l2) for a in result.accuracy)


def test_the_blind_conversion_measures_nothing():
    result = convert(catalog.load("text-det-sigmoid"), probe=False)
    assert result.accuracy == [] and result.probe_inputs == ""


def test_cli_convert_says_where_ranges_came_from_and_warns(tmp_path):
    import onnx

    source = tmp_path / "text_det.onnx"
    onnx.save(catalog.load("text-det-sigmoid"), source)
    out = tmp_path / "text_det.fp16.onnx"
    run = subprocess.run([sys.executable, "-m", "amp_compiler", "convert", str(source), "-o", str(out)],
                         capture_output=True, text=True, check=True)
    assert "ranges from generated inputs (image: image 0..1, uniform noise and dead leaves)" in run.stdout  # it normalizes its input
    assert "output error vs fp32 on generated inputs: max" in run.stdout
    warnings = [line for line in run.stderr.splitlines() if "warning: output 'prob'" in line]
    assert len(warnings) == 1 and "amp-compiler compare" in warnings[0] and "--tolerance" in warnings[0], run.stderr
    quiet = subprocess.run(
        [sys.executable, "-m", "amp_compiler", "convert", str(source), "-o", str(out), "--force", "--no-probe"],
        capture_output=True, text=True, check=True,
    )
    assert "generated inputs" not in quiet.stdout and "warning: output" not in quiet.stderr


@pytest.mark.parametrize("probe", [False, True], ids=["blind", "probed"])
def test_pairwise_distances_from_the_gram_matrix_of_raw_coordinates_are_accurate(probe):
    """The K = 3 Gram MatMul of coordinates 40 A from the origin stays FP32 (sweep Q: 57% of range with it
    FP16, stated 0.00%: the probe draws coordinates ~ N(0, 1) for one atom); the cutoff is exact now."""
    fp32 = catalog.load("pairwise-distance-gram")
    result = convert(fp32, probe=probe, runner=InProcessRunner())
    gram = next(d for d in result.decisions if d.node == "gram")
    assert (gram.precision, gram.rule) == ("fp32", "policy.high.raw-small-product"), gram
    accuracy = _accuracy("pairwise-distance-gram", result.model)
    assert accuracy and all(a.error_of_range < 0.01 for a in accuracy), accuracy
    low = convert(fp32, probe=False, allow_nodes=["^gram$"], runner=InProcessRunner())  # the MatMul forced FP16
    assert all(a.error_of_range > 0.3 for a in _accuracy("pairwise-distance-gram", low.model))


@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_a_first_gemm_over_offset_raw_features_stays_fp32(target):
    """Sweep Y (Y-1): a standardisation folded into the first Gemm of raw-unit features; its bias says where
    they are centred, and rounding them there (BF16: spacing 8 at 1500) flipped 24.7% of labels."""
    fp32 = catalog.load("sensor-folded-standardisation")
    result = convert(fp32, target=target, runner=InProcessRunner())
    fc1 = next(d for d in result.decisions if d.node == "fc1")
    assert (fc1.precision, fc1.rule) == ("fp32", "policy.high.raw-offset-product"), fc1
    accuracy = _accuracy("sensor-folded-standardisation", result.model)
    assert accuracy and all(a.error_of_range < 0.01 for a in accuracy), accuracy
    low = convert(fp32, target=target, allow_nodes=["^fc1$"], runner=InProcessRunner())  # fc1 forced low
    assert all(a.error_of_range > 0.01 for a in _accuracy("sensor-folded-standardisation", low.model))
