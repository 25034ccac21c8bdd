"""Would natural-looking generated images bring the range probe's output error closer to real inputs'?

    python -m benchmarks.probe_images [--models ppocr-v4-rec,ppocr-cls,ppocr-v4-det] [--seeds 4]

The range probe (:mod:`amp_compiler.onnx.measure.range_probe`) feeds an image input uniform noise in
its range (0..1, 0..255, -1..1). Uniform noise is no image: every pixel independent, its spectrum
flat. Natural images have most of their energy at low spatial frequencies (an amplitude spectrum
about 1/f), large flat regions and sharp edges between them. The *dead leaves* model draws exactly
that: opaque discs of random grey level and tint, radii power-law distributed (density r^-3, which
gives the 1/f spectrum), dropped one over the other until the image is covered, a little grain on top;
stretched to fill the input's range.

Per model and seed, the default conversion (the probe on) is run with each generator, and the probe's
worst output error on its generated sample (max error as a share of the output's range, rel-L2) is
printed beside the written model's error on the catalog's own inputs (two samples, seeds 100 and 101:
text lines, pages, natural-looking images), measured with exact FP16 emulation. The generator that is
closer to the real error on most models is the one to keep (the probe keeps uniform noise: see
``docs/converting.md``, where the figures are).
"""

from __future__ import annotations

import argparse
import functools

import numpy as np

__all__ = ["COVER", "dead_leaves", "main"]

#: Discs dropped: enough that their areas add up to this many times the image's (a pixel is left
#: uncovered with probability e^-COVER: 0.7%), at most :data:`_MAX_LEAVES`.
COVER = 5.0
_MAX_LEAVES = 20_000
#: Radii, in pixels: from 2 px (a stroke, a texture's grain) to half the image's shorter side.
_MIN_RADIUS = 2.0
_MAX_RADIUS_SHARE = 0.5
#: Grain: Gaussian noise of this share of the range on every pixel.
_GRAIN = 0.02


def dead_leaves(rng: np.random.Generator, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    """Float32 images of ``shape`` (``(N, C, H, W)``) in ``[low, high]``: dead leaves (see the module
    doc), channels sharing each disc's grey level with a small tint of their own."""
    n, c, h, w = shape
    out = np.empty(shape, np.float32)
    side = min(h, w)
    r_max = max(2 * _MIN_RADIUS, _MAX_RADIUS_SHARE * side)
    # E[r^2] of the density r^-3 on [r_min, r_max]: 2 r_min^2 ln(r_max / r_min) / (1 - (r_min / r_max)^2)
    mean_square = 2 * _MIN_RADIUS**2 * np.log(r_max / _MIN_RADIUS) / (1 - (_MIN_RADIUS / r_max) ** 2)
    count = int(min(_MAX_LEAVES, max(16, COVER * h * w / (np.pi * mean_square))))
    ys, xs = np.arange(h)[:, None], np.arange(w)[None, :]
    for i in range(n):
        canvas = np.full((c, h, w), rng.uniform(0, 1), np.float32)
        # radius density r^-3 on [r_min, r_max]: inverse CDF of u (1/r^2 uniform between the bounds)
        u = rng.uniform(0, 1, count)
        radii = 1.0 / np.sqrt(1.0 / _MIN_RADIUS**2 - u * (1.0 / _MIN_RADIUS**2 - 1.0 / r_max**2))
        centres_y, centres_x = rng.uniform(0, h, count), rng.uniform(0, w, count)
        greys = rng.uniform(0, 1, count)
        tints = rng.normal(0, 0.1, (count, c))
        for r, cy, cx, grey, tint in zip(radii, centres_y, centres_x, greys, tints, strict=True):
            y0, y1 = max(0, int(cy - r)), min(h, int(cy + r) + 1)
            x0, x1 = max(0, int(cx - r)), min(w, int(cx + r) + 1)
            if y0 >= y1 or x0 >= x1:
                continue
            disc = (ys[y0:y1] - cy) ** 2 + (xs[:, x0:x1] - cx) ** 2 <= r * r
            for ch in range(c):
                canvas[ch, y0:y1, x0:x1][disc] = np.clip(grey + tint[ch], 0, 1)
        canvas += rng.normal(0, _GRAIN, canvas.shape).astype(np.float32)
        lo, hi = float(canvas.min()), float(canvas.max())
        canvas = (canvas - lo) / (hi - lo) if hi > lo else np.full_like(canvas, 0.5)
        out[i] = low + canvas * (high - low)
    return out


def _with_images(generator, random_samples):
    """``random_samples`` with every image input (a 4-D float input the probe gives an image range)
    drawn by ``generator`` instead."""
    from amp_compiler.runtime.samples import input_kinds

    def patched(model, input_shapes=None, n=1, seed=0, **kwargs):
        out = random_samples(model, input_shapes, n, seed, **kwargs)
        stated = kwargs.get("input_ranges") or {}
        images = {name: kind for name, kind in input_kinds(model, stated).items()
                  if name not in stated and kind.kind == "range"}
        rng = np.random.default_rng(seed)
        for sample in out:
            for name, kind in images.items():
                if sample[name].ndim == 4:
                    sample[name] = generator(rng, sample[name].shape, *kind.bounds).astype(sample[name].dtype)
        return out

    return patched


def main(argv: list[str] | None = None) -> None:
    from amp_compiler import convert
    from amp_compiler.onnx import convert as convert_module
    from amp_compiler.onnx.measure import generated_inputs, range_probe
    from amp_compiler.onnx.measure.output_error import output_accuracy
    from amp_compiler.runtime.runner import InProcessRunner
    from models import catalog

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ppocr-v4-rec,ppocr-cls,ppocr-v4-det,text-det-sigmoid,seg-sigmoid-edge,"
                        "ctc-wide-softmax,detect-head-overflow")
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args(argv)

    def worst(accuracy) -> str:
        return (f"{100 * max(a.error_of_range for a in accuracy):.2f}% / "
                f"{max(a.rel_l2 or 0.0 for a in accuracy):.4f}")

    original_samples, original_probe = generated_inputs.random_samples, range_probe.probe_ranges
    print("| model | generator | seed: probe max % of range / rel-L2 (written model on real inputs) |")
    print("|---|---|---|")
    try:
        for name in args.models.split(","):
            entry = catalog.get(name)
            model = catalog.load(entry)
            real = [entry.make_inputs(np.random.default_rng(s)) for s in (100, 101)]
            for label, generator in (("uniform noise (the probe's)", None), ("dead leaves", dead_leaves)):
                generated_inputs.random_samples = (
                    original_samples if generator is None else _with_images(generator, original_samples)
                )
                cells = []
                for seed in range(args.seeds):
                    convert_module.probe_ranges = functools.partial(original_probe, seed=seed)
                    result = convert(model, probe=True, runner=InProcessRunner())
                    on_real = output_accuracy(model, result.model, real, InProcessRunner())
                    cells.append(f"{seed}: {worst(result.accuracy)} ({worst(on_real)})")
                print(f"| {name} | {label} | {'; '.join(cells)} |", flush=True)
    finally:
        generated_inputs.random_samples, convert_module.probe_ranges = original_samples, original_probe


if __name__ == "__main__":
    main()
