"""Per-model conversion numbers over the catalog, as a markdown table.

    python -m benchmarks.catalog_table [--size small|full|all] [--kind KIND]

For each model and target: Tensor Core ops (the policy table's ``tensor_core`` entries) in low
precision, Casts inserted, model size before/after, accuracy against FP32 on onnxruntime CPU (worst
float output: cosine, max error as a share of the output's range; both targets through the exact
FP32 emulation of their storage, amp_compiler.onnx.measure.emulate), conversion time; and whether onnxconverter-common's FP16 model runs, with its accuracy.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time
import warnings

import numpy as np

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.policy import default_table
from models import catalog


def _worst(reference, outputs) -> tuple[float, float]:
    accs = [
        compare("o", r, o)
        for r, o in zip(reference, outputs)
        if np.issubdtype(np.asarray(r).dtype, np.floating)
    ]
    if not accs:
        return 1.0, 0.0
    return min(a.cosine for a in accs), max(a.error_of_range for a in accs)


def _occ(model, feeds, reference) -> str:
    try:
        from onnxconverter_common import float16

        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            out = float16.convert_float_to_float16(model, keep_io_types=True)
        run_onnxruntime(out, feeds)  # its model must load and run as written
        cos, err = _worst(reference, run_onnxruntime(emulate(out), feeds))
        return f"{cos:.5f} / {err:.2%}"
    except Exception:
        return "does not run"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="small", choices=["small", "full", "all"])
    parser.add_argument("--kind", default=None)
    args = parser.parse_args()
    entries = catalog.entries(None if args.size == "all" else args.size, args.kind)
    print(
        "| model | TC ops fp16 | TC ops bf16 | casts fp16 | size fp16 | fp16 cos / max err | "
        "bf16 cos / max err | time s | onnxconverter-common fp16 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    totals = {"fp16": [0, 0], "bf16": [0, 0]}
    table = default_table()
    for entry in entries:
        model = catalog.load(entry)
        feeds = entry.make_inputs(np.random.default_rng(0))
        reference = run_onnxruntime(model, feeds)
        row = {}
        for target in ("fp16", "bf16"):
            start = time.perf_counter()
            result = convert(model, target=target, probe=False)
            seconds = time.perf_counter() - start
            heavy = [d for d in result.decisions if table.is_tensor_core(d.domain, d.op_type)]
            low = sum(d.precision == target for d in heavy)
            totals[target][0] += low
            totals[target][1] += len(heavy)
            runnable = emulate(result.model)  # exact low-precision storage on a CPU
            cos, err = _worst(reference, run_onnxruntime(runnable, feeds))
            row[target] = (f"{low}/{len(heavy)}", result, f"{cos:.5f} / {err:.2%}", seconds)
        fp16 = row["fp16"][1]
        size = fp16.model.ByteSize() / model.ByteSize()
        print(
            f"| {entry.name} | {row['fp16'][0]} | {row['bf16'][0]} | {fp16.casts_inserted} | "
            f"{size:.2f}x | {row['fp16'][2]} | {row['bf16'][2]} | {row['fp16'][3]:.2f} | "
            f"{_occ(model, feeds, reference)} |"
        )
    for target, (low, total) in totals.items():
        print(f"\n{target}: {low}/{total} Tensor Core ops in low precision ({low / max(total, 1):.1%})")


if __name__ == "__main__":
    main()
