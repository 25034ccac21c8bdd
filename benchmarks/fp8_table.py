"""FP8 table: ``convert(target="fp8")`` next to ModelOpt 0.47's FP8 output on the catalog models.

    python -m benchmarks.fp8_table [--models NAME,...] [--budgets 0.05,0.1] [--anchor benchmarks/fp8_anchor.json]

Same protocol as ``benchmarks/fp8_anchor.py`` (branch fp8-research, whose measured ModelOpt numbers
``--anchor`` reads): 8 calibration batches of each entry's ``make_inputs`` (seeds 10000+i), accuracy
against FP32 on 8 other held-out batches (seeds 20000+i), the FP8 model run as
:func:`amp_compiler.emulate.emulate` makes it (exact FP16 storage) at onnxruntime's BASIC level (from
EXTENDED on, onnxruntime deletes a Relu feeding a float8 QuantizeLinear). Per model, over its float
outputs, the worst: max |error| as a share of the FP32 range, relative L2, cosine; the share of GEMM
FLOPs in FP8; Q/DQ and Cast counts; size. One row per model and ``fp8_budget``. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from amp_compiler import convert
from amp_compiler.emulate import emulate
from amp_compiler.fp8 import fp8_flop_share
from amp_compiler.plan import Rule
from amp_compiler.runner import InProcessRunner
from models import catalog

DEFAULT_MODELS = "bert-base-small,gpt2-small,vit-base-small,resnet50-small"


def _run(model, batches):
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    opts.log_severity_level = 4
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return [session.run(None, b) for b in batches]


def _worst(ref, got) -> dict[str, float]:
    worst = {"max_error_of_range": 0.0, "rel_l2": 0.0, "cosine": 1.0}
    for k in range(len(ref[0])):
        r = np.concatenate([np.ravel(b[k]).astype(np.float64) for b in ref])
        g = np.concatenate([np.ravel(b[k]).astype(np.float64) for b in got])
        if not np.issubdtype(ref[0][k].dtype, np.floating):
            continue
        span = r.max() - r.min()
        worst["max_error_of_range"] = max(worst["max_error_of_range"], float(np.abs(r - g).max() / span) if span else 0.0)
        worst["rel_l2"] = max(worst["rel_l2"], float(np.linalg.norm(r - g) / max(np.linalg.norm(r), 1e-30)))
        cos = float(r @ g / max(np.linalg.norm(r) * np.linalg.norm(g), 1e-30))
        worst["cosine"] = min(worst["cosine"], cos)
    return worst


def measure(name: str, budget: float = 0.05) -> dict:
    entry, fp32 = catalog.get(name), catalog.load(name)
    calib = [entry.make_inputs(np.random.default_rng(10_000 + i)) for i in range(8)]
    held = [entry.make_inputs(np.random.default_rng(20_000 + i)) for i in range(8)]
    with InProcessRunner() as runner:
        result = convert(fp32, target="fp8", samples=calib, runner=runner, fp8_budget=budget)
    worst = _worst(_run(fp32, held), _run(emulate(result.model), held))
    ops = [n.op_type for n in result.model.graph.node]
    return {
        "model": name, **worst, "fp8_flop_share": fp8_flop_share(result),
        "gemms_fp8": sum(d.rule == Rule.FP8_GEMM.value for d in result.decisions),
        "gemms_kept": sum(d.rule == Rule.FP8_KEPT.value for d in result.decisions),
        "qdq": ops.count("QuantizeLinear") + ops.count("DequantizeLinear"), "casts": ops.count("Cast"),
        "size": result.model.ByteSize(), "size_fp32": fp32.ByteSize(),
    }


def _anchor(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    out = {}
    for r in json.loads(path.read_text())["results"]:
        total = sum(g["flops"] for g in r["gemms"])
        share = sum(g["flops"] for g in r["gemms"] if g["fp8"]) / total if total else 0.0
        out[r["model"]] = {**r["worst"], "fp8_flop_share": share}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS)
    parser.add_argument("--budgets", default="0.05,0.1", help="fp8_budget values, one row each")
    parser.add_argument("--anchor", type=Path, default=Path(__file__).with_name("fp8_anchor.json"))
    args = parser.parse_args()
    anchor = _anchor(args.anchor)
    print("| model | budget | ours: max err / range | rel L2 | cosine | FP8 GEMM FLOPs | GEMMs FP8/kept | Q/DQ | Casts "
          "| size vs FP32 | ModelOpt: max err / range | rel L2 | cosine | FP8 GEMM FLOPs |")
    print("|" + "---|" * 14)
    for name, budget in ((n, float(b)) for n in args.models.split(",") for b in args.budgets.split(",")):
        r = measure(name, budget)
        a = anchor.get(name)
        theirs = (f"{a['max_error_of_range']:.2%} | {a['rel_l2']:.2%} | {a['cosine']:.4f} | {a['fp8_flop_share']:.0%}"
                  if a else "- | - | - | -")
        print(f"| {name} | {budget:g} | {r['max_error_of_range']:.2%} | {r['rel_l2']:.2%} | {r['cosine']:.4f} | "
              f"{r['fp8_flop_share']:.0%} | {r['gemms_fp8']}/{r['gemms_kept']} | {r['qdq']} | {r['casts']} | "
              f"{r['size'] / r['size_fp32']:.2f}x | {theirs} |", flush=True)


if __name__ == "__main__":
    main()
