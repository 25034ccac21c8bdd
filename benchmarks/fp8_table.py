"""FP8 table: ``convert(target="fp8")`` next to ModelOpt 0.47's FP8 output on the catalog models.

    python -m benchmarks.fp8_table [--models NAME,...] [--budgets 0.1] [--anchor benchmarks/fp8_anchor.json]

The protocol (data, runs, measures) is :mod:`benchmarks.fp8_protocol`, the same for both tools;
ModelOpt's numbers come from ``--anchor`` (written by ``python -m benchmarks.fp8_modelopt``, which
needs ModelOpt; this table does not). Per model and ``fp8_budget``: the worst float output's max
|error| as a share of the FP32 range, relative L2 and cosine on the held-out batches; top-1 agreement
for classifiers; the share of Tensor Core FLOPs (fused ops included) whose op reads FP8 inputs; ours
as GEMMs FP8 / kept in FP16 by their statistics (fp8.kept-fp16) / taking no FP8 (fp8.no-qdq); Q/DQ
and Cast counts; size vs FP32; and our FP8 share as a multiple of ModelOpt's. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from amp_compiler import convert
from amp_compiler.core.plan import Rule
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.runtime.runner import InProcessRunner
from benchmarks import fp8_protocol as protocol

DEFAULT_MODELS = (
    "bert-base-small,gpt2-small,vit-base-small,resnet50-small,"
    "bert-fused-small,bert-mha-fused-small,gpt2-fused-small,vit-fused-small,clip-vision-fused-small,"
    "t5-encoder-fused-small,llama-genai-fp32-small,llama-genai-int4-small,ppocr-cls,magika"
)
HEADER = (
    "| model | budget | ours: max err / range | rel L2 | cosine | top-1 | FP8 GEMM FLOPs | GEMMs FP8/kept/no-qdq "
    "| Q/DQ | Casts | size vs FP32 | ModelOpt: max err / range | rel L2 | cosine | top-1 | FP8 GEMM FLOPs | Q/DQ "
    "| Casts | size vs FP32 | our FP8 share / ModelOpt's |"
)


def measure(name: str, budget: float = 0.1) -> dict:
    """Ours on ``name`` at ``budget`` (see module doc)."""
    fp32, calib, held = protocol.batches(name)
    with InProcessRunner() as runner:
        result = convert(fp32, target="fp8", samples=calib, runner=runner, fp8_budget=budget)
    got = protocol.accuracy(protocol.run(fp32, held), protocol.run(emulate(result.model), held))
    rules = [d.rule for d in result.decisions]
    return {
        "model": name, **got, "fp8_flop_share": protocol.flop_share(protocol.gemms(fp32, calib[0]),
                                                                     protocol.fp8_outputs(result.model)),
        "gemms": (rules.count(Rule.FP8_GEMM.value), rules.count(Rule.FP8_KEPT.value), rules.count(Rule.FP8_NO_QDQ.value)),
        **protocol.counts(result.model), "size_fp32": fp32.ByteSize(),
    }


def anchor(path: Path) -> dict[str, dict]:
    """ModelOpt's entries by model, those measured by ``benchmarks.fp8_modelopt`` (the file also keeps
    older entries measured with another protocol on branch fp8-research; they are not shown)."""
    if not path.exists():
        return {}
    results = json.loads(path.read_text())["results"]
    return {r["model"]: r for r in results if r.get("protocol") == "benchmarks.fp8_modelopt"}


def pct(v: float | None, digits: int = 2) -> str:
    """A share as a percentage, "-" when there is none."""
    return "-" if v is None else f"{v:.{digits}%}"


def _failure(error: str) -> str:
    """ModelOpt's error line, short: ``ValidationError: No Op registered for ...``."""
    kind, _, message = error.partition(": ")
    return f"fails: {kind.rsplit('.', 1)[-1]}: {message[:70]}"


def row(ours: dict, budget: float, theirs: dict | None) -> str:
    cells = [
        ours["model"], f"{budget:g}", pct(ours["max_error_of_range"]), pct(ours["rel_l2"]), f"{ours['cosine']:.4f}",
        pct(ours["top1"], 1), pct(ours["fp8_flop_share"], 0), "/".join(map(str, ours["gemms"])),
        str(ours["qdq"]), str(ours["casts"]), f"{ours['size'] / ours['size_fp32']:.2f}x",
    ]
    if theirs is None or theirs.get("error"):
        cells += [_failure(theirs["error"]) if theirs else "-"] + ["-"] * 8
    else:
        share = theirs["fp8_flop_share"]
        cells += [
            pct(theirs["worst"]["max_error_of_range"]), pct(theirs["worst"]["rel_l2"]),
            f"{theirs['worst']['cosine']:.4f}", pct(theirs["top1_agreement"], 1), pct(share, 0),
            str(theirs["qdq"]), str(theirs["casts"]), f"{theirs['size'] / theirs['size_fp32']:.2f}x",
            f"{ours['fp8_flop_share'] / share:.2f}x" if share else "-",
        ]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--budgets", default="0.1", help="fp8_budget values, one row each")
    parser.add_argument("--anchor", type=Path, default=Path(__file__).with_name("fp8_anchor.json"))
    args = parser.parse_args()
    theirs = anchor(args.anchor)
    print(HEADER)
    print("|" + "---|" * 20)
    for name in args.models.split(","):
        for budget in (float(b) for b in args.budgets.split(",")):
            print(row(measure(name, budget), budget, theirs.get(name)), flush=True)


if __name__ == "__main__":
    main()
