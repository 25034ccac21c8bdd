"""Would natural-looking generated images bring the range probe's output error closer to real inputs'?

    python -m benchmarks.probe_images [--models ppocr-v4-rec,ppocr-cls,ppocr-v4-det] [--seeds 4]

The range probe (:mod:`amp_compiler.onnx.measure.range_probe`) feeds an image input uniform noise in
its range (0..1, 0..255, -1..1). Uniform noise is no image: every pixel independent, its spectrum
flat. Natural images have most of their energy at low spatial frequencies (an amplitude spectrum
about 1/f), large flat regions and sharp edges between them. The *dead leaves* model draws exactly
that (:mod:`amp_compiler.onnx.measure.images`): opaque discs of random grey level and tint, radii
power-law distributed (density r^-3, which gives the 1/f spectrum), dropped one over the other until the
image is covered, a little grain on top; stretched to fill the input's range.

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

from amp_compiler.onnx.measure.images import dead_leaves

__all__ = ["main"]


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
