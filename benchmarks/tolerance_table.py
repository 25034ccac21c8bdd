"""What ``--tolerance`` costs and buys, per catalog model, as a markdown table.

    python -m benchmarks.tolerance_table [--models a,b,c] [--samples 2] [--factor 0.5]

For each model: plain FP16 (worst output relative L2 and max error of range against FP32, with exact
FP16 storage emulation; share of Tensor Core FLOPs in FP16) and the ``--tolerance`` refinement at
``factor`` times plain FP16's worst output error (relative L2): nodes pinned, the error reached, the
share of Tensor Core FLOPs left in FP16, the most any choice could leave (``at most``: the FLOPs of
the units whose cheapest low-precision option alone fits the tolerance), the units measured,
conversions and model runs, and the seconds it took.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from amp_compiler import convert
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.tolerance.refine import measure, refine
from amp_compiler.policy import default_table
from amp_compiler.targets import Target
from models import catalog


def tensor_core_low_share(result, shapes) -> float:
    """Share of the Tensor Core ops' FLOPs that run in FP16."""
    table = default_table()
    costs = estimate(result.model, shapes)
    tc = [(c.flops, d.precision) for c, d in zip(costs.nodes, result.decisions, strict=False)
          if table.is_tensor_core(d.domain, d.op_type)]
    total = sum(f for f, _ in tc)
    return sum(f for f, p in tc if p == "fp16") / total if total else 0.0


def _max_error_of_range(fp32, converted, samples) -> float:
    worst = 0.0
    runnable = emulate(converted)
    for sample in samples:
        ref, got = run_onnxruntime(fp32, sample), run_onnxruntime(runnable, sample)
        for r, g in zip(ref, got, strict=True):
            if np.issubdtype(np.asarray(r).dtype, np.floating):
                worst = max(worst, compare("o", r, g).error_of_range)
    return worst


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--models",
        default="ppocr-v4-det,ppocr-v4-rec,resnet50-small,mobilenetv2-small,efficientnet-b0-small,bert-base-small,"
        "decomposed-activations",
    )
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--factor", type=float, default=0.5)
    args = parser.parse_args()
    print("| model | nodes | plain FP16: rel L2 / max err / TC FLOPs FP16 | tolerance | pinned | rel L2 | max err "
          "| TC FLOPs FP16 | at most | units | conversions | model runs | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        entry = catalog.get(name)
        fp32 = catalog.load(entry)
        samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(args.samples)]
        shapes = {k: v.shape for k, v in samples[0].items()}
        plain = convert(fp32, probe=False)
        _, outputs, _ = measure(fp32, plain.model, samples, Target.FP16)
        base = max(outputs.values())
        tol = args.factor * base
        start = time.perf_counter()
        r = refine(fp32, samples, tol)
        seconds = time.perf_counter() - start
        print(
            f"| {name} | {len(fp32.graph.node)} | {base:.2e} / {_max_error_of_range(fp32, plain.model, samples):.2%} / "
            f"{tensor_core_low_share(plain, shapes):.1%} | {tol:.2e} | {len(r.pinned)} | "
            f"{max(r.output_errors.values()):.2e}{'' if r.met else ' (not met)'} | "
            f"{_max_error_of_range(fp32, r.result.model, samples):.2%} | {tensor_core_low_share(r.result, shapes):.1%} | "
            f"{r.ceiling:.1%} | {r.units} | {r.rounds} | {r.model_runs} | {seconds:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
