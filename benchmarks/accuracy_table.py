"""Accuracy of the conversions people run, per catalog model, before and after the range probe (issue 23).

    python -m benchmarks.accuracy_table [--models a,b,c] [--tolerance 0.01] [--results]

For each model, scored under exact FP16 storage emulation on two of its own inputs (seeds 100, 101:
never the calibration samples) against FP32: max error <= 2% of the output's range, cosine >= 0.999,
no NaN/Inf (``ok``, else what failed). Columns:

- ``blind``: the conversion without the probe (``--no-probe``: what ``convert`` did before issue 23);
- ``default``: ``amp-compiler convert`` as it is now (the range probe on generated inputs), the nodes
  the probe kept FP32, and whether it warns of the outputs' accuracy (its own measure on generated inputs: a
  miss, an error concentrated in a few positions, a tie moved past the line);
- ``with data``: ``--calibration-data`` with 4 samples (seeds 0-3);
- ``--tolerance``: ``--calibration-data`` and ``--tolerance T`` (relative L2, 4 samples);

each with the share of Tensor Core FLOPs left in FP16. ``--results`` writes the table into
``benchmarks/RESULTS.md`` between the ``accuracy-table`` markers.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import numpy as np

from amp_compiler import convert
from amp_compiler.cli.convert import accuracy_warnings
from amp_compiler.core.plan import Rule
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.output_error import misses, output_accuracy
from amp_compiler.onnx.tolerance.refine import refine
from amp_compiler.runtime.runner import InProcessRunner
from benchmarks.tolerance_table import tensor_core_low_share
from models import catalog

MODELS = (
    "detect-head-overflow,text-det-sigmoid,ctc-wide-softmax,seg-sigmoid-edge,cqt-log,stft-power-mel,"
    "decomposed-activations,magika,ppocr-cls,ppocr-v4-det,ppocr-v4-rec,silero-vad,bert-base-small,"
    "convnext-tiny-small,efficientnet-b0-small,gpt2-small,mobilenetv2-small,resnet50-small,vit-base-small,"
    "whisper-tiny-encoder-small,tie-softmax-classifier"
)
_BEGIN = "<!-- accuracy-table:begin (python -m benchmarks.accuracy_table --results) -->"
_END = "<!-- accuracy-table:end -->"


def verdict(fp32, converted, samples, runner) -> str:
    """``ok``, or the worst output's failure: ``NaN/Inf``, its max error of range, or its cosine."""
    accuracy = output_accuracy(fp32, converted, samples, runner)
    bad = [a for a in accuracy if misses(a)]
    if not bad:
        worst = max((a.error_of_range for a in accuracy), default=0.0)
        return f"ok ({worst:.2%})"
    a = min(bad, key=lambda a: (a.finite, -a.error_of_range))
    return "NaN/Inf" if not a.finite else f"**{a.error_of_range:.2%}** cos {a.cosine:.5f}"


def row(name: str, tolerance: float | None) -> str:
    entry = catalog.get(name)
    fp32 = catalog.load(entry)
    scored = [entry.make_inputs(np.random.default_rng(s)) for s in (100, 101)]
    calibration = [entry.make_inputs(np.random.default_rng(s)) for s in range(4)]
    shapes = {k: v.shape for k, v in scored[0].items()}
    runner = InProcessRunner()  # the catalog's own models
    cells = [name]
    blind = convert(fp32, runner=runner, probe=False)
    cells.append(f"{verdict(fp32, blind.model, scored, runner)}, {tensor_core_low_share(blind, shapes):.0%}")
    start = time.perf_counter()
    default = convert(fp32, probe=True, runner=runner)
    probe_s = time.perf_counter() - start
    moved = sum(d.rule in (Rule.PROBE_OVERFLOW.value, Rule.PROBE_UNDERFLOW.value) for d in default.decisions)
    said = accuracy_warnings(default.accuracy, "generated inputs", Path(f"{name}.onnx"), Path(f"{name}.fp16.onnx"))
    warned = "warns" if said else "-"  # what `amp-compiler convert` prints: a miss, a concentrated error, a tie
    cells.append(
        f"{verdict(fp32, default.model, scored, runner)}, {tensor_core_low_share(default, shapes):.0%}, "
        f"{moved} moved, {warned}, {probe_s:.1f} s"
    )
    ranges = collect_ranges(fp32, calibration, runner=runner)
    data = convert(fp32, ranges=ranges, runner=runner)
    cells.append(f"{verdict(fp32, data.model, scored, runner)}, {tensor_core_low_share(data, shapes):.0%}")
    if tolerance is not None:
        refined = refine(fp32, calibration, tolerance, ranges=ranges, runner=runner)
        cells.append(
            f"{verdict(fp32, refined.result.model, scored, runner)}{'' if refined.met else ' (not met)'}, "
            f"{tensor_core_low_share(refined.result, shapes):.0%}, {refined.model_runs} runs"
        )
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=MODELS)
    parser.add_argument("--tolerance", type=float, default=None, help="add a --tolerance column (relative L2)")
    parser.add_argument("--results", action="store_true", help="write the table into benchmarks/RESULTS.md")
    args = parser.parse_args()
    head = ["model", "blind (before): accuracy, TC FLOPs FP16",
            "default (probe): accuracy, TC FLOPs FP16, nodes moved, warning, seconds",
            "with data (4 samples)"]
    if args.tolerance is not None:
        head.append(f"--tolerance {args.tolerance:g} (4 samples)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    print("\n".join(lines), flush=True)
    for name in args.models.split(","):
        lines.append(row(name, args.tolerance))
        print(lines[-1], flush=True)
    if args.results:
        path = Path(__file__).with_name("RESULTS.md")
        text = path.read_text()
        block = f"{_BEGIN}\n" + "\n".join(lines) + f"\n{_END}"
        if _BEGIN in text:
            text = re.sub(re.escape(_BEGIN) + ".*?" + re.escape(_END), lambda _: block, text, flags=re.S)
        else:
            text = text.rstrip("\n") + "\n\n## Accuracy by default (issue 23)\n\n" + block + "\n"
        path.write_text(text)


if __name__ == "__main__":
    main()
