"""What a diffusion model's inputs are, from the graph: a VAE decoder's latents, a denoiser's noisy latents and
its timesteps (:func:`diffusion_kinds`), so that generated inputs have the scale real ones have.

A diffusers pipeline feeds these inputs values of a scale no image or N(0, 1) guess has:

- a VAE decoder's latents are ``latents / scaling_factor`` (``vae.decode(latents / 0.18215)``): N(0, 5.5)
  for SD 1.x/2.x, N(0, 7.7) for SDXL (0.13025), N(0, 2.8) for Flux (0.3611), N(0, 0.65) for SD3 (1.5305).
  Probed as a normalized image (-1..1, std 0.58), a decoder whose trained weights carry its hidden
  activations to 6.5e4-8e4 on real latents (the SDXL VAE's FP16 overflow) showed peaks 10x smaller:
  nothing was kept out of FP16, the summary line stated 0.08-0.15% error, and the FP16 decoder's output
  was 100% NaN on real latents (sweep L: ``vae-dec-huge``, ``vae-dec-XL``). The probe takes the largest
  of those scales, :data:`LATENT_SIGMA`: a probe too small misses an overflow (the output is NaN), one
  too large (1.4x for SD 1.x) at most pins a product that the default range fallback then runs as FP16
  on power-of-two scaled operands, on Tensor Cores;
- a denoiser's (UNet, DiT) sample is noisy latents ``sqrt(a) x0 + sqrt(1 - a) noise``, x0 scaled to
  unit variance, or a pixel-space image mixed so (a DDPM's 3-channel ``sample``): N(0, 1), not an image;
- its timestep is one of the scheduler's 1000 training steps, 0..999 (float or integer), not N(0, 1)
  (negative, fractional) nor 1.

- an EDM/Karras denoiser's noise level ``sigma`` is 0.002..80, positive (``log(sigma)``), not N(0, 1).

The names are data (:data:`LATENT`, :data:`NOISY`, :data:`TIMESTEP`, :data:`SIGMA`, :data:`CONDITIONING`), each with
why; :func:`~amp_compiler.runtime.input_kinds.input_kinds` takes these kinds before it looks for images.
"""

from __future__ import annotations

import dataclasses
import re

import onnx

__all__ = [
    "CONDITIONING", "LATENT", "LATENT_SIGMA", "NOISY", "SIGMA", "SIGMAS", "TIMESTEP", "TIMESTEPS",
    "VAE_SCALING_FACTORS", "NamedInput", "diffusion_kinds",
]

#: The latent scaling factors of the common VAEs (diffusers' ``vae.config.scaling_factor``): a decoder
#: receives ``latents / factor``, latents of unit variance.
VAE_SCALING_FACTORS: dict[str, float] = {"SD 1.x/2.x": 0.18215, "SDXL": 0.13025, "Flux": 0.3611, "SD3": 1.5305}
#: A VAE decoder's latents are drawn N(0, LATENT_SIGMA): the largest scale of :data:`VAE_SCALING_FACTORS`
#: (SDXL's, 7.68). Erring large: an under-scaled probe misses an overflow and the FP16 output is NaN.
LATENT_SIGMA = 1.0 / min(VAE_SCALING_FACTORS.values())
#: A scheduler's training timesteps (``num_train_timesteps`` 1000 in every diffusers pipeline's config).
TIMESTEPS = (0.0, 999.0)
#: The noise levels an EDM/Karras denoiser takes (``sigma_min`` 0.002, ``sigma_max`` 80: EDM's and k-diffusion's
#: defaults); drawn log-spaced (``positive``): EDM conditions on ``log(sigma) / 4``.
SIGMAS = (0.002, 80.0)


@dataclasses.dataclass(frozen=True)
class NamedInput:
    """A graph input's name pattern (matched whole, case-insensitively), the ranks it takes, whether it is
    float (else integer or float), and why it is what it is."""

    pattern: re.Pattern[str]
    ranks: tuple[int, ...]
    reason: str
    floats_only: bool = True


def _named(pattern: str, ranks: tuple[int, ...], reason: str, floats_only: bool = True) -> NamedInput:
    return NamedInput(re.compile(pattern, re.IGNORECASE), ranks, reason, floats_only)


#: A diffusion model's timestep: a scalar or one per batch item, float or integer (diffusers' UNets and
#: transformers: ``timestep``; ``t`` in DiT-style code).
TIMESTEP = _named(r"t|timesteps?|time_?steps?", (0, 1), "a scheduler's training step, 0..999", floats_only=False)
#: A latent named so (``latent_sample``: Optimum's VAE decoder; ``latents``, ``z``: diffusers' ``decode(z)``),
#: 4-D images or 5-D videos of latents, whatever its channels (4 for SD, 16 for SD3 and Flux: a 4-channel
#: latent is no RGBA image). Without a timestep beside it, a VAE decoder's input: ``latents / scaling_factor``.
LATENT = _named(r"\w*latents?(_\w*)?|z", (4, 5), "a VAE decoder's input, latents / scaling_factor")
#: Beside a timestep, the denoiser's sample: noisy latents (UNet ``sample``, DiT ``hidden_states``, ``x``),
#: or a pixel-space model's noisy image, N(0, 1).
NOISY = _named(r"sample|hidden_states|x|x_?t|z|noisy_\w+|\w*latents?(_\w*)?", (4, 5),
               "a denoiser's noisy latents, N(0, 1)")
#: An EDM/Karras denoiser's noise level, one per batch item (``sigma``; k-diffusion's ``sigmas``), beside its
#: noisy input: :data:`SIGMAS`, not N(0, 1) (``log(sigma)`` of a negative draw: every FP32 output NaN).
SIGMA = _named(r"sigmas?|noise_levels?", (0, 1), "an EDM/Karras noise level, 0.002..80")
#: SDXL's size and crop conditioning (``time_ids``: original size, crop corner, target size, in pixels).
CONDITIONING = _named(r"(add_)?time_ids", (2,), "SDXL's sizes and crop corner in pixels, 0..1024", floats_only=False)
_PIXELS = (0.0, 1024.0)


def _rank(info: onnx.ValueInfoProto) -> int:
    tt = info.type.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else -1


def _matches(entry: NamedInput, info: onnx.ValueInfoProto) -> bool:
    elem = info.type.tensor_type.elem_type
    floating = elem in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                        onnx.TensorProto.DOUBLE)
    numeric = floating or elem in (onnx.TensorProto.INT32, onnx.TensorProto.INT64)
    return (bool(entry.pattern.fullmatch(info.name)) and _rank(info) in entry.ranks
            and (floating if entry.floats_only else numeric))


def diffusion_kinds(inputs: list[onnx.ValueInfoProto]) -> dict[str, tuple[str, tuple[float, float], str]]:
    """The diffusion inputs among a model's graph ``inputs`` (those it must be fed), as (kind, bounds, why)
    for :class:`~amp_compiler.runtime.input_kinds.InputKind`: with a timestep input (:data:`TIMESTEP`) beside
    a 4-D or 5-D float input, the timestep uniform in :data:`TIMESTEPS` (``timesteps 0..999``) and the noisy
    sample (:data:`NOISY`) N(0, 1) (``noisy latents N(0, 1)``), SDXL's ``time_ids`` 0..1024; beside a 4-D or 5-D
    input, a noise level (:data:`SIGMA`) log-spaced over :data:`SIGMAS`; without a timestep, a
    float input named like a latent (:data:`LATENT`) N(0, :data:`LATENT_SIGMA`) (``latents N(0, 7.7)``).
    Kind ``normal`` takes bounds (mean, standard deviation); ``range`` is uniform in its bounds."""
    spatial = any(_rank(i) in (4, 5) for i in inputs)
    timesteps = {i.name for i in inputs if spatial and _matches(TIMESTEP, i)}
    out: dict[str, tuple[str, tuple[float, float], str]] = {}
    for info in inputs:
        if info.name in timesteps:
            out[info.name] = ("range", TIMESTEPS, "timesteps 0..999")
        elif spatial and _matches(SIGMA, info):
            out[info.name] = ("positive", SIGMAS, "noise levels 0.002..80, log-spaced (EDM/Karras sigmas)")
        elif timesteps and _matches(NOISY, info):
            out[info.name] = ("normal", (0.0, 1.0), "noisy latents N(0, 1)")
        elif timesteps and _matches(CONDITIONING, info):
            out[info.name] = ("range", _PIXELS, "sizes and crops 0..1024")
        elif not timesteps and _matches(LATENT, info):
            out[info.name] = ("normal", (0.0, LATENT_SIGMA), f"latents N(0, {LATENT_SIGMA:.1f})")
    return out
