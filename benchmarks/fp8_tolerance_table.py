"""FP8 under ``--tolerance``: the FP8 share of Tensor Core FLOPs it reaches per tolerance, and whether the
tolerance holds on held-out inputs, next to ModelOpt 0.47's single point.

    python -m benchmarks.fp8_tolerance_table [--models NAME,...] [--tolerances 0.02,0.05,0.1]

Same protocol as :mod:`benchmarks.fp8_table` (:mod:`benchmarks.fp8_protocol`: calibration and held-out
batches, FLOPs counted the same way for both tools). Per model and tolerance: the refinement on the
calibration batches (FP8 / FP16 / FP32 per Tensor Core unit, :mod:`amp_compiler.onnx.tolerance.refine`), its worst
output relative L2 there, then on the held-out batches (relative L2, max error of range, top-1 for
classifiers), the share of Tensor Core FLOPs whose op reads FP8 inputs, conversions, model runs and
seconds; ModelOpt's relative L2 and FP8 share on the same held-out batches (``fp8_anchor.json``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.tolerance.refine import refine
from amp_compiler.options import ConvertOptions
from amp_compiler.runtime.runner import InProcessRunner
from amp_compiler.targets import Target
from benchmarks import fp8_protocol as protocol
from benchmarks.fp8_table import anchor, pct

DEFAULT_MODELS = "bert-base-small,gpt2-small,vit-base-small,resnet50-small,ppocr-cls,magika"
HEADER = (
    "| model | tolerance | calibration rel L2 | held-out rel L2 | held-out max err / range | top-1 | FP8 GEMM FLOPs "
    "| conversions | model runs | s | ModelOpt: held-out rel L2 | FP8 GEMM FLOPs |"
)


def measure(name: str, tolerance: float) -> dict:
    """Ours on ``name`` at ``tolerance`` (see module doc)."""
    fp32, calib, held = protocol.batches(name)
    start = time.perf_counter()
    with InProcessRunner() as runner:
        r = refine(fp32, calib, tolerance, ConvertOptions(target=Target.FP8), runner=runner)
    seconds = time.perf_counter() - start
    got = protocol.accuracy(protocol.run(fp32, held), protocol.run(emulate(r.result.model), held))
    share = protocol.flop_share(protocol.gemms(fp32, calib[0]), protocol.fp8_outputs(r.result.model))
    return {"model": name, **got, "calibration": max(r.output_errors.values(), default=0.0), "met": r.met,
            "fp8_flop_share": share, "rounds": r.rounds, "runs": r.model_runs, "seconds": seconds}


def row(ours: dict, tolerance: float, theirs: dict | None) -> str:
    calibration = pct(ours["calibration"]) + ("" if ours["met"] else " (not met)")
    cells = [
        ours["model"], f"{tolerance:g}", calibration, pct(ours["rel_l2"]), pct(ours["max_error_of_range"]),
        pct(ours["top1"], 1), pct(ours["fp8_flop_share"], 0), str(ours["rounds"]), str(ours["runs"]),
        f"{ours['seconds']:.0f}",
    ]
    if theirs is None or theirs.get("error"):
        cells += ["-", "-"]
    else:
        cells += [pct(theirs["worst"]["rel_l2"]), pct(theirs["fp8_flop_share"], 0)]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--tolerances", default="0.02,0.05,0.1")
    parser.add_argument("--anchor", type=Path, default=Path(__file__).with_name("fp8_anchor.json"))
    args = parser.parse_args()
    theirs = anchor(args.anchor)
    print(HEADER)
    print("|" + "---|" * 12)
    for name in args.models.split(","):
        for tolerance in (float(t) for t in args.tolerances.split(",")):
            print(row(measure(name, tolerance), tolerance, theirs.get(name)), flush=True)


if __name__ == "__main__":
    main()
