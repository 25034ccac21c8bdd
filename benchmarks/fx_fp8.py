"""target="fp8" on the FX path, measured on the catalog models the FX tests use (CPU emulation).

    python -m benchmarks.fx_fp8 [--models resnet50-small,...] [--training]

Inference: per model, FP16 and FP8 conversions (FP8 with 4 calibration samples, default settings)
compared with FP32 on an input outside the samples (relative L2 of the worst output), the FP8
GEMMs chosen among the candidates, the FP8 share of FLOPs, parameter bytes, and the conversion's
wall time. ``--training``: the FX training tests' CNN (60 steps) and transformer (200 steps) tasks in
FP32, FP16 and FP8: the mean loss of the last 20 steps and the held-out loss. Numbers only, for
benchmarks/RESULTS.md; the tests assert the bounds.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

SMALL = ["resnet50-small", "mobilenetv2-small", "bert-base-small", "gpt2-small"]


def _rel(ref: tuple, out) -> float:
    out = out if isinstance(out, tuple) else (out,)
    return max(float((o.double() - r.double()).norm() / r.double().norm()) for r, o in zip(ref, out, strict=True))


def inference(names: list[str]) -> None:
    import amp_compiler.fx as ampfx
    from models.architectures import ARCHS, to_torch

    print("| model | FP16 rel L2 | FP8 rel L2 | FP8 GEMMs | FP8 FLOPs | params FP32 -> FP16 / FP8 | FP8 convert |")
    print("|---|---|---|---|---|---|---|")
    for name in names:
        arch = next(a for a in ARCHS if a.name == name)
        module, inputs, ref = arch.torch_example()
        cal = [tuple(to_torch(arch.make_inputs(np.random.default_rng(2000 + k))).values()) for k in range(4)]
        fp16 = ampfx.convert(module, inputs, target="fp16")
        start = time.perf_counter()
        fp8 = ampfx.convert(module, inputs, target="fp8", calibration=cal)
        seconds = time.perf_counter() - start
        with torch.no_grad():
            e16, e8 = _rel(ref, fp16(*inputs)), _rel(ref, fp8(*inputs))
        r16, r8 = ampfx.report(fp16), ampfx.report(fp8)
        chosen = sum(d.rule == "fp8.gemm" for d in r8.decisions)
        candidates = sum("with FP8 inputs vs FP16 inputs" in d.reason for d in r8.decisions)  # its statistics
        kb = 1000
        print(f"| {name} | {e16:.2%} | {e8:.2%} | {chosen}/{candidates} | {r8.flops_share('fp8'):.0%} | "
              f"{r16.parameter_bytes_before / kb:.0f} kB -> {r16.parameter_bytes_after / kb:.0f} / "
              f"{r8.parameter_bytes_after / kb:.0f} kB | {seconds:.1f} s |")


def training() -> None:
    from tests.support.fx_helpers import train

    print("| task | FP32 last-20 / held-out | FP16 | FP8 | FP8 time vs FP32 |")
    print("|---|---|---|---|---|")
    for kind, steps, lr, decay in (("cnn", 60, 0.1, False), ("gpt", 200, 3e-3, True)):
        row = []
        times = {}
        for target in ("fp32", "fp16", "fp8"):
            start = time.perf_counter()
            final, held, *_ = train(kind, target, steps, lr, decay)
            times[target] = time.perf_counter() - start
            row.append(f"{final:.4f} / {held:.4f}")
        print(f"| {kind} ({steps} steps) | {' | '.join(row)} | {times['fp8'] / times['fp32']:.1f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(SMALL))
    parser.add_argument("--training", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    inference([m for m in args.models.split(",") if m])
    if args.training:
        training()


if __name__ == "__main__":
    main()
