"""The range probe's output error on image models with uniform noise, dead leaves, and both (what it runs).

    python -m benchmarks.probe_images [--models ppocr-v4-rec,ppocr-cls,ppocr-v4-det] [--seeds 4]

The range probe (:mod:`amp_compiler.onnx.measure.range_probe`) runs a model with an image input on two
samples: uniform noise in the input's range, and the same sample with dead-leaves images
(:mod:`amp_compiler.onnx.measure.images`: a 1/f spectrum, flat regions, sharp edges); its output error
is the worse of the two, per output. Per model and seed, the default conversion is run with the probe
on noise alone, on dead leaves alone (noise's sample replaced), and on both, and the probe's worst
output error (max error as a share of the output's range, rel-L2) is printed beside the written
model's error on the catalog's own inputs (two samples, seeds 100 and 101: text lines, pages,
natural-looking images), measured with exact FP16 emulation. A warning is due where an output misses
2% of range: the generated inputs should show that on the models whose real inputs do, and not on
the others (the figures are in ``docs/converting.md``).
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
    from amp_compiler.runtime.input_kinds import input_kinds

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

    original = (generated_inputs.random_samples, range_probe.probe_ranges, range_probe.image_inputs)
    with_leaves = _with_images(dead_leaves, original[0])
    modes = (  # (label, the probe's random samples, its image inputs for the dead-leaves sample)
        ("uniform noise", original[0], _no_images), ("dead leaves", with_leaves, _no_images),
        ("both, the worse (the probe's)", original[0], original[2]),
    )
    print("| model | generated images | seed: probe max % of range / rel-L2 (written model on real inputs) |")
    print("|---|---|---|")
    try:
        for name in args.models.split(","):
            entry = catalog.get(name)
            model = catalog.load(entry)
            real = [entry.make_inputs(np.random.default_rng(s)) for s in (100, 101)]
            for label, samples, images in modes:
                generated_inputs.random_samples, range_probe.image_inputs = samples, images
                cells = []
                for seed in range(args.seeds):
                    convert_module.probe_ranges = functools.partial(original[1], seed=seed)
                    result = convert(model, probe=True, runner=InProcessRunner())
                    on_real = output_accuracy(model, result.model, real, InProcessRunner())
                    cells.append(f"{seed}: {worst(result.accuracy)} ({worst(on_real)})")
                print(f"| {name} | {label} | {'; '.join(cells)} |", flush=True)
    finally:
        generated_inputs.random_samples, convert_module.probe_ranges, range_probe.image_inputs = original


def _no_images(model, input_ranges=None) -> dict:
    """No image inputs: the probe runs its one generated sample only."""
    return {}


if __name__ == "__main__":
    main()
