"""What ``--tolerance`` costs and buys, per catalog model, as a markdown table.

    python -m benchmarks.tolerance_table [--models a,b,c] [--samples 2] [--factor 0.5]

For each model: plain FP16 (accuracy against FP32 with exact FP16 storage emulation, share of FLOPs
in FP16) and the ``--tolerance`` refinement at ``factor`` times plain FP16's worst output error
(relative L2): conversions, model runs, nodes pinned, accuracy, FLOP share.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from amp_compiler import convert
from amp_compiler.checks import compare, run_onnxruntime
from amp_compiler.costs import estimate
from amp_compiler.emulate import emulate
from amp_compiler.refine import measure, refine
from amp_compiler.targets import Target
from models import catalog


def _low_share(result, shapes) -> float:
    costs = estimate(result.model, shapes)
    total = sum(c.flops for c in costs.nodes)
    low = sum(c.flops for c, d in zip(costs.nodes, result.decisions) if d.precision == "fp16")
    return low / total if total else 0.0


def _accuracy(fp32, converted, sample) -> tuple[float, float]:
    ref = run_onnxruntime(fp32, sample)
    got = run_onnxruntime(emulate(converted), sample)
    accs = [compare("o", r, g) for r, g in zip(ref, got) if np.issubdtype(np.asarray(r).dtype, np.floating)]
    return min(a.cosine for a in accs), max(a.error_of_range for a in accs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="ppocr-v4-det,mobilenetv2-small,vit-base-small")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--factor", type=float, default=0.5)
    args = parser.parse_args()
    print(
        "| model | nodes | plain FP16: rel L2 / cos / max err / FP16 FLOPs | tolerance | conversions | "
        "model runs | log2 N | pinned | refined: rel L2 / cos / max err / FP16 FLOPs | time s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        entry = catalog.get(name)
        fp32 = catalog.load(entry)
        samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(args.samples)]
        shapes = {k: v.shape for k, v in samples[0].items()}
        plain = convert(fp32)
        _, outputs, _ = measure(fp32, plain.model, samples, Target.FP16)
        base = max(outputs.values())
        tol = args.factor * base
        start = time.perf_counter()
        r = refine(fp32, samples, tol)
        seconds = time.perf_counter() - start
        cos0, err0 = _accuracy(fp32, plain.model, samples[0])
        cos1, err1 = _accuracy(fp32, r.result.model, samples[0])
        n = len(fp32.graph.node)
        print(
            f"| {name} | {n} | {base:.2e} / {cos0:.5f} / {err0:.2%} / {_low_share(plain, shapes):.1%} | "
            f"{tol:.2e} | {r.rounds} | {r.model_runs} | {math.log2(n):.1f} | {len(r.pinned)} | "
            f"{max(r.output_errors.values()):.2e} / {cos1:.5f} / {err1:.2%} / {_low_share(r.result, shapes):.1%} | "
            f"{seconds:.1f} |"
        )


if __name__ == "__main__":
    main()
