"""A diffusion model's inputs are generated as a pipeline feeds them: a VAE decoder's latents at the largest
common latent scale, a denoiser's noisy latents N(0, 1) and its timesteps over 0..999; an RGB image stays an
image (sweep L: a decoder's latents probed as a -1..1 image hid an FP16 overflow that made its output NaN)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler.runtime.diffusion_inputs import LATENT_SIGMA, SIGMAS, VAE_SCALING_FACTORS
from amp_compiler.runtime.input_kinds import image_inputs, input_kinds
from amp_compiler.runtime.samples import random_samples
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _conv_model(inputs: dict[str, tuple[int, list]], x: str, channels: int):
    """``x`` (1, ``channels``, 8, 8) -> Conv -> y, beside the other ``inputs`` (name: (type, shape)), each
    added into y so that the graph reads them."""
    nodes = [helper.make_node("Conv", [x, "w"], ["y0"], name="conv", pads=[1, 1, 1, 1])]
    out = "y0"
    for k, name in enumerate(n for n in inputs if n != x):
        cast = helper.make_node("Cast", [name], [f"{name}_f"], to=F32)
        nodes += [cast, helper.make_node("ReduceMean", [f"{name}_f"], [f"{name}_m"], keepdims=0),
                  helper.make_node("Add", [out, f"{name}_m"], [f"y{k + 1}"])]
        out = f"y{k + 1}"
    nodes.append(helper.make_node("Identity", [out], ["y"]))
    return model(nodes, [vi(n, t, s) for n, (t, s) in inputs.items()], [vi("y", F32, [1, 4, 8, 8])],
                 [tensor("w", weights((4, channels, 3, 3)))])


@pytest.mark.parametrize("name, channels", [("latent_sample", 4), ("latent_sample", 16), ("z", 4), ("latents", 4)])
def test_a_vae_decoders_latents_are_drawn_at_the_largest_common_scale(name, channels):
    m = _conv_model({name: (F32, [1, channels, 8, 8])}, name, channels)
    kind = input_kinds(m)[name]
    assert (kind.kind, kind.why) == ("normal", "latents N(0, 7.7)")
    assert kind.bounds == (0.0, LATENT_SIGMA) and LATENT_SIGMA == pytest.approx(1 / VAE_SCALING_FACTORS["SDXL"])
    assert name not in image_inputs(m)  # no dead-leaves image: a 4-channel latent is no RGBA picture
    sample = random_samples(m, informed=True)[0][name]
    assert 0.8 * LATENT_SIGMA < sample.std() < 1.2 * LATENT_SIGMA and abs(sample.mean()) < 1.0


@pytest.mark.parametrize("step_type", [TensorProto.FLOAT, TensorProto.INT64])
@pytest.mark.parametrize("name, channels", [("sample", 4), ("hidden_states", 16), ("sample", 3)])
def test_a_denoisers_sample_is_noisy_latents_and_its_timesteps_span_the_schedule(name, channels, step_type):
    m = _conv_model({name: (F32, [1, channels, 8, 8]), "timestep": (step_type, [4]),
                     "encoder_hidden_states": (F32, [1, 7, 16])}, name, channels)
    kinds = input_kinds(m)
    assert (kinds[name].kind, kinds[name].bounds, kinds[name].why) == ("normal", (0.0, 1.0), "noisy latents N(0, 1)")
    assert (kinds["timestep"].bounds, kinds["timestep"].why) == ((0.0, 999.0), "timesteps 0..999")
    assert "encoder_hidden_states" not in kinds
    sample = random_samples(m, informed=True, input_shapes={"timestep": (64,)})[0]
    assert 0.8 < sample[name].std() < 1.2
    steps = sample["timestep"]
    assert steps.dtype == (np.float32 if step_type == TensorProto.FLOAT else np.int64)
    assert steps.min() >= 0 and steps.max() <= 999 and steps.max() - steps.min() > 500


def test_sdxls_size_conditioning_takes_pixels():
    m = _conv_model({"sample": (F32, [1, 4, 8, 8]), "timestep": (F32, []), "time_ids": (F32, [1, 6])}, "sample", 4)
    assert input_kinds(m)["time_ids"].bounds == (0.0, 1024.0)


@pytest.mark.parametrize("name, channels", [("image", 3), ("sample", 3), ("pixel_values", 4), ("x", 1)])
def test_an_image_without_a_timestep_or_a_latents_name_stays_an_image(name, channels):
    """A VAE encoder's ``sample`` is an RGB image, as is any 1/3/4-channel input of a model with no timestep."""
    m = _conv_model({name: (F32, [1, channels, 8, 8])}, name, channels)
    kind = input_kinds(m)[name]
    assert (kind.kind, kind.bounds, kind.why) == ("range", (-2.12, 2.64), "normalized image -2.12..2.64")
    assert name in image_inputs(m)


def test_a_t_without_latents_beside_it_is_no_timestep_and_a_stated_range_wins():
    m = model([helper.make_node("Mul", ["t", "x"], ["y"])], [vi("t", F32, [1]), vi("x", F32, [1, 8])],
              [vi("y", F32, [1, 8])])
    assert "t" not in input_kinds(m)
    d = _conv_model({"latent_sample": (F32, [1, 4, 8, 8])}, "latent_sample", 4)
    assert input_kinds(d, {"latent_sample": (-30.0, 30.0)})["latent_sample"].why == "stated"


@pytest.mark.parametrize("name", ["sigma", "sigmas", "noise_level"])
def test_an_edm_denoisers_noise_level_spans_karras_sigmas(name):
    """EDM/Karras denoisers take ``(x, sigma)``, no timestep: sigma was N(0, 1), and ``log(sigma)`` NaN (sweep S)."""
    m = _conv_model({"x": (F32, [1, 4, 8, 8]), name: (F32, [4])}, "x", 4)
    kind = input_kinds(m)[name]
    assert (kind.kind, kind.bounds) == ("positive", SIGMAS) and SIGMAS == (0.002, 80.0) and "EDM/Karras" in kind.why
    sigma = random_samples(m, informed=True)[0][name]
    assert sigma.min() == pytest.approx(0.002) and sigma.max() == pytest.approx(80.0)
