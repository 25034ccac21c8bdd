"""``compare`` on the catalog: each model's default FP16 conversion against FP32, as a markdown table.

    python -m benchmarks.compare_catalog [--size small] [--samples 2] [--target fp16]

Per model: the worst output cosine and max error of range, NaN/Inf values, the lowest argmax
agreement, and the node where the relative L2 error grows most (op, precision, rule), with exact
FP16/BF16 emulation on the CPU (:func:`amp_compiler.onnx.compare.compare_models`).
"""

from __future__ import annotations

import argparse

import numpy as np

from amp_compiler import convert
from amp_compiler.onnx.compare import compare_models
from models import catalog


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="small")
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--target", default="fp16")
    args = parser.parse_args()
    print("| model | worst cosine | max err / range | NaN/Inf | argmax agreement | error grows most at |")
    print("|---|---|---|---|---|---|")
    for entry in catalog.entries(args.size):
        fp32 = catalog.load(entry)
        samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(args.samples)]
        c = compare_models(fp32, convert(fp32, target=args.target, probe=False).model, samples, top=1)
        agree = [o.argmax_agreement for o in c.outputs if o.argmax_agreement is not None]
        worst = c.growth[0] if c.growth else None
        where = f"{worst.op_type} {worst.node!r} ({worst.precision}, {worst.rule})" if worst else "-"
        agreement = f"{min(agree):.1%}" if agree else "-"
        print(
            f"| {entry.name} | {min(o.cosine for o in c.outputs):.6f} | "
            f"{max(o.error_of_range for o in c.outputs):.2%} | {sum(o.nonfinite for o in c.outputs)} | "
            f"{agreement} | {where[:70]} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
