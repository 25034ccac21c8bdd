"""What the FP32 nodes of a conversion are worth on a GPU that reads FP32 products as TF32, as
onnxruntime's CUDA provider and TensorRT do by default from Ampere on.

    python -m benchmarks.tf32_table            # print the table
    python -m benchmarks.tf32_table --results  # and write it into benchmarks/RESULTS.md

Per case, a conversion for CUDA whose Tensor Core ops are kept in FP32 for their precision (the
default conversion's rules, or ``--tolerance``'s pins on eight calibration samples), measured on six
held-out samples under exact emulation twice: FP32 products exact (``emulate(model)``: what the
summary line, ``compare`` and ``--tolerance`` measure) and with their operands read as TF32
(``emulate(model, tf32=True)``: what the GPU runs unless TF32 is turned off). The worst held-out
relative L2 of a float output against FP32 is given for both, for the same conversion with those
Tensor Core ops allowed into FP16 (what the FP32 choice is for), and for the conversion with
``--fp32-products split`` (those ops written TF32-proof: :mod:`amp_compiler.passes.onnx.split_products`)
read as TF32.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import onnx

from amp_compiler import convert, refine
from amp_compiler.core.tensor_error import accuracy
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.options import ConvertOptions
from amp_compiler.policy import default_table
from benchmarks.cold import write_section
from models import catalog

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN = "<!-- tf32:begin (python -m benchmarks.tf32_table --results) -->"
END = "<!-- tf32:end -->"


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # catalog entry
    tolerance: float | None = None  # None: the default conversion


CASES = (
    Case("cqt-log"),
    Case("quantized-encoder"),
    Case("cqt-log", 0.01),
    Case("resnet50-small", 0.0015),
    Case("gpt2-small", 0.0004),
)


def _worst(fp32: onnx.ModelProto, model: onnx.ModelProto, held: list[dict[str, np.ndarray]]) -> float:
    worst = 0.0
    for feeds in held:
        ref, got = run_onnxruntime(fp32, feeds), run_onnxruntime(model, feeds)
        found = [accuracy("output", [r], [g]) for r, g in zip(ref, got, strict=True) if np.issubdtype(r.dtype, np.floating)]
        worst = max([worst, *(a.rel_l2 if a.rel_l2 is not None else float("inf") for a in found)])
    return worst


def row(case: Case) -> str:
    entry, fp32 = catalog.get(case.name), catalog.load(case.name)
    held = [entry.make_inputs(np.random.default_rng(100 + s)) for s in range(6)]
    samples = [entry.make_inputs(np.random.default_rng(s)) for s in range(8)]

    def conversion(products: str) -> ConversionResult:
        options = ConvertOptions(provider="cuda", fp32_products=products)
        if case.tolerance is None:
            return convert(fp32, options)
        return refine(fp32, samples, case.tolerance, options).result

    how = "default" if case.tolerance is None else f"--tolerance {case.tolerance}"
    result = conversion("plain")
    table = default_table()
    kept = [d for d in result.decisions if d.precision == "fp32" and d.index is not None
            and table.is_tensor_core(d.domain, d.op_type)]
    rules = ", ".join(dict.fromkeys(d.rule for d in kept))
    exact, tf32 = _worst(fp32, emulate(result.model), held), _worst(fp32, emulate(result.model, tf32=True), held)
    names = tuple(f"^{d.node}$" for d in kept)
    low = convert(fp32, provider="cuda", allow_nodes=names).model if names else result.model
    fp16 = _worst(fp32, emulate(low), held)
    split = _worst(fp32, emulate(conversion("split").model, tf32=True), held)
    limit = f" (limit {case.tolerance:g})" if case.tolerance is not None else ""
    return (f"| {case.name} | {how} | {len(kept)} ({rules}) | {exact:.2e}{limit} | **{tf32:.2e}** | {fp16:.2e} "
            f"| {split:.2e} |")


def table() -> str:
    lines = [
        "| model | conversion | Tensor Core ops kept FP32 (rule) | held-out error, FP32 exact | as TF32 | those ops in FP16 "
        "| `--fp32-products split`, as TF32 |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    return "\n".join(lines + [row(case) for case in CASES])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", action="store_true", help=f"write the table into {RESULTS.name}")
    args = parser.parse_args()
    text = table()
    print(text)
    if args.results:
        header = ("## FP32 nodes on a GPU: TF32\n\nCommand: `python -m benchmarks.tf32_table --results` (see its "
                  "docstring): worst relative L2 of a float output over six held-out samples.\n\n")
        write_section(RESULTS, header + text, BEGIN, END)


if __name__ == "__main__":
    main()
