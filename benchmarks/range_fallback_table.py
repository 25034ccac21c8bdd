"""FP16 with scaled-FP16 and BF16 range fallbacks against all-BF16, FP16 with FP32 fallbacks and onnxruntime's float16
converter with ``use_bfloat16_as_blocked_nodes_dtype`` (issue 26), on the catalog models whose values
leave FP16's range.

    python -m benchmarks.range_fallback_table            # print the table
    python -m benchmarks.range_fallback_table --results  # and write it into benchmarks/RESULTS.md

Per model, each conversion for CUDA (keep_io_types) given the same range information (calibration
ranges on two samples, or the int16 audio's stated input range), measured on ten held-out samples under
exact emulation (:func:`amp_compiler.onnx.measure.emulate.emulate`: every tensor rounded to its own
type): the mean over them of the worst relative L2 error of a float output against FP32 (also with
FP32 Tensor Core operands read as TF32, as GPUs run them by default), whether any output holds NaN/Inf,
the share of Tensor Core FLOPs (MatMul/Gemm/Conv, from the converted model's own tensor types) left
in FP32, and the Casts. onnxruntime's converter gets as ``node_block_list`` the nodes the mixed
conversion kept out of FP16 for their range (BF16 or FP32), the same blocked nodes.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import onnx
import onnx.shape_inference

from amp_compiler import convert
from amp_compiler.core.plan import RANGE_ONLY_RULES
from amp_compiler.core.tensor_error import accuracy
from amp_compiler.onnx.costs.costs import estimate, iter_nodes
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.checks import run_onnxruntime
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.policy import default_table
from benchmarks.cold import write_section
from models import catalog

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN = "<!-- range-fallback:begin (python -m benchmarks.range_fallback_table --results) -->"
END = "<!-- range-fallback:end -->"
INT16 = (-32768.0, 32767.0)
_RANGE_RULES = {r.value for r in RANGE_ONLY_RULES}


HEADER = (
    "Command: `python -m benchmarks.range_fallback_table --results`. Per model, conversions for the provider "
    "named (CUDA unless `tensorrt:`) with the same range information (calibration ranges of two samples; "
    "stft-power-mel: the int16 range stated for its input and the range probe's ranges on generated audio in it), measured on ten held-out samples (seeds 7-16) "
    "under exact emulation (every tensor rounded to its own type): the mean over them of each sample's worst "
    "relative L2 error of a float output against FP32, "
    "the same with the FP32 Tensor Core ops' operands read as TF32 (10 mantissa bits: what onnxruntime's CUDA "
    "provider, `use_tf32` on, and TensorRT, `BuilderFlag.TF32` on, do by default on Ampere and later; "
    "`emulate(..., tf32=True)`), "
    "NaN/Inf in an output, the share of Tensor Core FLOPs (MatMul/Gemm/Conv) whose input is FP32, and the "
    "Cast nodes. onnxruntime 1.32's `convert_float_to_float16(..., node_block_list=..., "
    "use_bfloat16_as_blocked_nodes_dtype=True)` gets as blocked nodes those amp-compiler kept out of FP16 "
    "for their range (BF16 or FP32): the same blocked nodes."
)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str  # catalog entry
    audio: bool = False  # int16-scale audio with a stated input range, instead of calibration


CASES = (
    Case("llama-massive-activations-small"),
    Case("detect-head-overflow"),
    Case("stft-power-mel", audio=True),
)


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    way: str
    error: float | None  # worst relative L2 of a float output; None: the conversion failed
    finite: bool
    error_tf32: float | None  # the same with FP32 Tensor Core operands read as TF32 (the GPU's default)
    fp32_tc: float  # share of Tensor Core FLOPs in FP32
    casts: int
    note: str = ""


def _inputs(case: Case, seed: int) -> dict[str, np.ndarray]:
    feeds = catalog.get(case.name).make_inputs(np.random.default_rng(seed))
    if case.audio:  # the same audio at int16 scale
        feeds = {k: np.clip(v / np.abs(v).max() * 32767.0, *INT16).astype(np.float32) for k, v in feeds.items()}
    return feeds


def tensor_core_fp32_share(model: onnx.ModelProto) -> float:
    """FLOPs of Tensor Core ops whose first input is FP32, over those of all Tensor Core ops."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in (
        *inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)}
    types.update({t.name: t.data_type for t in model.graph.initializer})
    table = default_table()
    total = fp32 = 0
    for node, cost in zip(iter_nodes(model), estimate(inferred).nodes, strict=True):
        if table.is_tensor_core(node.domain, node.op_type):
            total += cost.flops
            fp32 += cost.flops if types.get(node.input[0]) == onnx.TensorProto.FLOAT else 0
    return fp32 / total if total else 0.0


#: The held-out samples each conversion is measured on (seeds): one sample's error moved by 2x between
#: seeds on the audio front end (FP32 fallbacks: 3.7e-4 on seed 7, 7.2e-4 on seed 8).
HELD_OUT = tuple(range(7, 17))


def _errors(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]]
) -> tuple[float, bool, float]:
    """Over ``samples``, the mean of each sample's worst float output's relative L2 (inf with NaN/Inf
    where FP32 is finite), whether every float output is finite where FP32 is
    (:func:`amp_compiler.core.tensor_error.accuracy`), and the same mean with the FP32 Tensor Core ops'
    operands read as TF32, as onnxruntime's CUDA provider and TensorRT run them by default
    (:func:`emulate` with ``tf32``)."""
    references = [run_onnxruntime(fp32, feeds) for feeds in samples]
    means, finite = [], True
    for tf32 in (False, True):
        emulated = emulate(converted, tf32=tf32)
        worst = []
        for feeds, ref in zip(samples, references, strict=True):
            got = run_onnxruntime(emulated, feeds)
            found = [accuracy("output", [r], [g]) for r, g in zip(ref, got, strict=True)
                     if np.issubdtype(r.dtype, np.floating)]
            worst.append(max((a.rel_l2 or 0.0 for a in found), default=0.0))
            finite = finite and all(a.finite for a in found)
        means.append(float(np.mean(worst)))
    return means[0], finite, means[1]


def _casts(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "Cast" for n in iter_nodes(model))


def rows(case: Case) -> list[Row]:
    entry = catalog.get(case.name)
    fp32 = catalog.load(entry)
    calibration = [_inputs(case, 1000 + k) for k in range(2)]
    held_out = [_inputs(case, seed) for seed in HELD_OUT]
    # Each conversion has exactly this range information: calibration ranges, or the int16 range stated
    # for the audio and the range probe's observation of generated inputs in it.
    info: dict = {"input_ranges": {n: INT16 for n in calibration[0]}} if case.audio else {
        "ranges": collect_ranges(fp32, calibration)}
    out = []
    mixed = convert(fp32, provider="cuda", range_fallback="bf16", **info)
    blocked = sorted(d.node for d in mixed.decisions if d.rule in _RANGE_RULES and d.precision in ("bf16", "fp32"))
    ways = {
        "fp16 + scaled fp16 fallbacks (then bf16)": convert(fp32, provider="cuda", range_fallback="scaled", **info).model,
        "fp16 + bf16 fallbacks": mixed.model,
        "fp16 + fp32 fallbacks": convert(fp32, provider="cuda", range_fallback="fp32", **info).model,
        "all bf16": convert(fp32, provider="cuda", target="bf16", **info).model,
        "fp16, no range information": convert(fp32, provider="cuda", probe=False).model,
        "tensorrt: fp16 + scaled fp16 fallbacks (then bf16)": convert(
            fp32, provider="tensorrt", range_fallback="scaled", **info).model,
        "tensorrt: fp16 + bf16 fallbacks": convert(fp32, provider="tensorrt", range_fallback="bf16", **info).model,
        "tensorrt: fp16 + fp32 fallbacks": convert(fp32, provider="tensorrt", range_fallback="fp32", **info).model,
    }
    for way, model in ways.items():
        error, finite, error_tf32 = _errors(fp32, model, held_out)
        out.append(Row(case.name, way, error, finite, error_tf32, tensor_core_fp32_share(model), _casts(model)))
    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16

        ort = convert_float_to_float16(
            onnx.shape_inference.infer_shapes(fp32), keep_io_types=True, node_block_list=blocked,
            use_bfloat16_as_blocked_nodes_dtype=True,
        )
        note = f"{len(blocked)} blocked"
        try:
            error, finite, error_tf32 = _errors(fp32, ort, held_out)
        except onnx.shape_inference.InferenceError:  # its value_info keeps types it changed
            note += "; its output fails onnx's type inference (stale value_info), measured without it"
            del ort.graph.value_info[:]
            error, finite, error_tf32 = _errors(fp32, ort, held_out)
        out.append(Row(case.name, "onnxruntime float16.py, blocked nodes bf16", error, finite, error_tf32,
                       tensor_core_fp32_share(ort), _casts(ort), note))
    except Exception as exc:  # its converter refuses some graphs: say so in the row
        out.append(Row(case.name, "onnxruntime float16.py, blocked nodes bf16", None, False, None, 0.0, 0,
                       f"fails: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"))
    return out


def table(all_rows: list[Row]) -> str:
    lines = [
        "| model | conversion | worst rel. L2 | with TF32 | NaN/Inf | TC FLOPs in FP32 | Casts | note |",
        "| --- | --- | ---: | ---: | :---: | ---: | ---: | --- |",
    ]

    def shown(error: float | None) -> str:
        return "-" if error is None else ("inf" if not np.isfinite(error) else f"{error:.2e}")

    for r in all_rows:
        nan = "-" if r.error is None else ("no" if r.finite else "**yes**")
        lines.append(f"| {r.model} | {r.way} | {shown(r.error)} | {shown(r.error_tf32)} | {nan} | {r.fp32_tc:.1%} "
                     f"| {r.casts} | {r.note} |")
    return "\n".join(lines)




def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", action="store_true", help=f"write the table into {RESULTS.name}")
    args = parser.parse_args()
    all_rows = [r for case in CASES for r in rows(case)]
    text = table(all_rows)
    print(text)
    if args.results:
        write_section(RESULTS, f"## FP16 with BF16 range fallbacks (issue 26)\n\n{HEADER}\n\n{text}", BEGIN, END)


if __name__ == "__main__":
    main()
