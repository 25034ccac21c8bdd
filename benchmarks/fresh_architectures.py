"""The default conversion on public architectures the catalog does not hold (nobody tuned the compiler
for them): small transformers configs with random, realistic weights (``benchmarks/fresh_specs.py``).

    python -m benchmarks.fresh_architectures                  # every architecture, print the table
    python -m benchmarks.fresh_architectures --models gemma,swin
    python -m benchmarks.fresh_architectures --list           # the names
    python -m benchmarks.fresh_architectures --results        # and write it into benchmarks/RESULTS.md

Per architecture: the FP32 export (cached under ``models/.cache``), then ``amp_compiler.convert(model)``
with its defaults (CUDA, the range probe on generated inputs, scaled FP16 range fallback; the probe's
runs in this process: ``InProcessRunner``, the models are ours), timed. Recorded:

- Tensor Core ops (``default_table().is_tensor_core``) the decisions put in FP16 (or BF16), of all;
- the error the conversion states on its probe inputs (``result.accuracy``: the worst output's max error
  as a share of its FP32 range) and whether the CLI warns (an output past
  :func:`amp_compiler.onnx.measure.output_error.misses`);
- the error measured on 3 held-out inputs of the model's own kind (seeds 100-102, never the probe's:
  token ids with padded masks; images as N(0, 1) noise, a smooth image in 0..1 and the same normalised
  with ImageNet's mean and std; audio as sines plus noise, as a waveform, AST's fbank or Whisper's
  log-mel), the converted model under exact emulation (:func:`amp_compiler.onnx.measure.emulate.emulate`)
  against FP32, both in onnxruntime CPU: the worst max error of range, the worst relative L2, the lowest
  cosine, NaN/Inf where FP32 is finite, and argmax agreement for class outputs (logits' last axis,
  SegFormer's class axis per pixel).

The goal each row is judged by: no NaN/Inf where FP32 has none; every output whose held-out error
exceeds 2% of its range (or whose cosine is below 0.999) is flagged by the conversion's own measure
(the CLI's warning), else it is a miss; and the share of Tensor Core ops in FP16.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import onnx

from amp_compiler import convert
from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.tensor_error import ArgmaxAgreement, accuracy
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.measure.output_error import MAX_ERROR_OF_RANGE, MIN_COSINE, misses
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.policy import default_table
from amp_compiler.runtime.runner import InProcessRunner
from benchmarks.cold import write_section
from benchmarks.fresh_specs import FRESH, FreshArch
from models.catalog import CACHE_DIR

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN = "<!-- fresh-architectures:begin (python -m benchmarks.fresh_architectures --results) -->"
END = "<!-- fresh-architectures:end -->"
HELD_OUT = (100, 101, 102)  # seeds of the held-out inputs
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)[None, :, None, None]
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)[None, :, None, None]
LOW = ("fp16", "bf16")


@dataclasses.dataclass(frozen=True)
class Measured:
    """One output's error over the held-out inputs: the worst input's for each figure."""

    name: str
    error_of_range: float
    rel_l2: float
    cosine: float
    nonfinite: int  # NaN/Inf values where FP32 is finite, over all inputs
    top1: float | None  # argmax agreement; None: not a class output

    @property
    def beyond(self) -> bool:
        """Past the line a warning is due for (NaN/Inf, max error of range, cosine)."""
        return self.nonfinite > 0 or self.error_of_range > MAX_ERROR_OF_RANGE or self.cosine < MIN_COSINE


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    family: str
    tc_low: int  # Tensor Core ops in FP16 (or BF16)
    tc_total: int
    tc_bf16: int
    stated: float | None  # the conversion's worst output error of range on its probe inputs (None: not measured)
    flagged: tuple[str, ...]  # outputs the conversion's own measure warns about
    outputs: tuple[Measured, ...]
    probe: str  # the probe's dynamic dims
    seconds: float  # the conversion's
    export_seconds: float = 0.0  # the export's (about 0 when cached)

    @property
    def misses(self) -> tuple[str, ...]:
        """Outputs past the line on held-out inputs that the conversion did not flag."""
        return tuple(m.name for m in self.outputs if m.beyond and m.name not in self.flagged)

    @property
    def finite(self) -> bool:
        return all(m.nonfinite == 0 for m in self.outputs)

    @property
    def goal_met(self) -> bool:
        return self.finite and not self.misses

    def worst(self) -> Measured:
        """The worst output's figures (each figure's worst over the outputs)."""
        tops = [m.top1 for m in self.outputs if m.top1 is not None]
        return Measured(
            "all", max(m.error_of_range for m in self.outputs), max(m.rel_l2 for m in self.outputs),
            min(m.cosine for m in self.outputs), sum(m.nonfinite for m in self.outputs), min(tops) if tops else None,
        )


# --------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------


def smooth_images(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Smooth images in [0, 1]: per channel a sum of four low-frequency 2-D cosines, min-max scaled."""
    batch, channels, height, width = shape
    yy, xx = np.meshgrid(np.linspace(0, 1, height), np.linspace(0, 1, width), indexing="ij")
    out = np.zeros(shape, np.float32)
    for b in range(batch):
        for c in range(channels):
            img = np.zeros((height, width))
            for _ in range(4):
                fx, fy = rng.uniform(0.5, 3.0, 2)
                img += rng.uniform(0.3, 1.0) * np.cos(2 * np.pi * (fx * xx + fy * yy) + rng.uniform(0, 2 * np.pi))
            out[b, c] = (img - img.min()) / (img.max() - img.min())
    return out


def held_out_inputs(arch: FreshArch) -> list[dict[str, np.ndarray]]:
    """The 3 held-out inputs: ``make_inputs`` at seeds 100-102, images in three styles (N(0, 1) noise,
    a smooth image in 0..1, the same ImageNet-normalised)."""
    samples = []
    for style, seed in enumerate(HELD_OUT):
        rng = np.random.default_rng(seed)
        feeds = arch.make_inputs(rng)
        for name, spec in arch.inputs.items():
            if spec.kind == "image" and style > 0:
                image = smooth_images(rng, feeds[name].shape)
                feeds[name] = image if style == 1 else ((image - IMAGENET_MEAN) / IMAGENET_STD).astype(np.float32)
        samples.append(feeds)
    return samples


# --------------------------------------------------------------------------------------------------
# Measures
# --------------------------------------------------------------------------------------------------


def tensor_core_ops(result: ConversionResult) -> tuple[int, int, int]:
    """(Tensor Core ops in FP16 or BF16, all of them, those in BF16), from the decisions."""
    table = default_table()
    heavy = [d for d in result.decisions if table.is_tensor_core(d.domain, d.op_type)]
    return (sum(d.precision in LOW for d in heavy), len(heavy), sum(d.precision == "bf16" for d in heavy))


def _measure_output(name: str, refs: list[np.ndarray], gots: list[np.ndarray], argmax_axis: int | None) -> Measured:
    each: list[OutputAccuracy] = [accuracy(name, [r], [g]) for r, g in zip(refs, gots)]
    nonfinite = sum(int(np.count_nonzero(np.isfinite(r) & ~np.isfinite(g))) for r, g in zip(refs, gots))
    top1 = None
    if argmax_axis is not None:
        agreement = ArgmaxAgreement()
        for r, g in zip(refs, gots):
            agreement.add(np.moveaxis(r, argmax_axis, -1), np.moveaxis(g, argmax_axis, -1))
        top1 = agreement.share
    return Measured(
        name,
        max(a.error_of_range for a in each),
        max(a.rel_l2 if a.rel_l2 is not None else float("inf") for a in each),
        min(a.cosine if a.finite else -1.0 for a in each),
        nonfinite,
        top1,
    )


def measure_held_out(
    arch: FreshArch, fp32: onnx.ModelProto, converted: onnx.ModelProto, runner: InProcessRunner
) -> tuple[Measured, ...]:
    """Each float output of ``converted`` under exact emulation against ``fp32`` on the held-out inputs."""
    samples = held_out_inputs(arch)
    runs = []
    for model in (fp32, emulate(converted)):
        session = runner.load(model)
        try:
            runs.append([session.run(feeds) for feeds in samples])
        finally:
            session.close()
    refs, gots = runs
    out = []
    for k, info in enumerate(fp32.graph.output):
        if not np.issubdtype(refs[0][k].dtype, np.floating):
            continue
        axis = arch.argmax_axis if k == 0 else None  # the class axis is the first output's
        out.append(_measure_output(info.name, [r[k] for r in refs], [g[k] for g in gots], axis))
    return tuple(out)


def row(arch: FreshArch, cache: Path = CACHE_DIR) -> Row:
    """Export (cached), convert with the defaults (timed), measure on the held-out inputs."""
    cache.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    fp32 = arch.build(cache)
    exported = time.perf_counter() - start
    runner = InProcessRunner()
    start = time.perf_counter()
    result = convert(fp32, runner=runner)
    seconds = time.perf_counter() - start
    low, total, bf16 = tensor_core_ops(result)
    stated = max((a.error_of_range for a in result.accuracy), default=None)
    return Row(
        arch.name, arch.family, low, total, bf16, stated,
        tuple(a.name for a in result.accuracy if misses(a)),
        measure_held_out(arch, fp32, result.model, runner),
        ", ".join(f"{k}={v}" for k, v in result.probe_dims.items()) or "-",
        seconds,
        exported,
    )


# --------------------------------------------------------------------------------------------------
# Table
# --------------------------------------------------------------------------------------------------


def verdict(r: Row) -> str:
    """``ok`` (within the line), ``flagged`` (past it, and the conversion warns), else what fails."""
    if not r.finite:
        return "**NaN/Inf**"
    if r.misses:
        return f"**miss** ({', '.join(r.misses)})"
    return "flagged" if any(m.beyond for m in r.outputs) else "ok"


def _pct(x: float) -> str:
    return f"{x:.2%}" if np.isfinite(x) else "inf"


def table_line(r: Row) -> str:
    w = r.worst()
    bf16 = f" (bf16 {r.tc_bf16})" if r.tc_bf16 else ""
    cells = [
        r.model, r.family, f"{r.tc_low}/{r.tc_total}{bf16}",
        "-" if r.stated is None else _pct(r.stated), "yes" if r.flagged else "no",
        _pct(w.error_of_range), f"{w.rel_l2:.1e}", f"{w.cosine:.7f}", str(w.nonfinite),
        "-" if w.top1 is None else f"{w.top1:.1%}", r.probe, f"{r.seconds:.1f}", verdict(r),
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| model | kind | TC ops FP16 | stated error (probe) | warns | held-out max-err/range | rel-L2 | cosine "
    "| NaN/Inf | top-1 | probe dims | convert s | goal |\n"
    "|---|---|---:|---:|:---:|---:|---:|---:|---:|---:|---|---:|---|"
)

GOAL = (
    "Goal per row: no NaN/Inf where FP32 has none; every output whose held-out error exceeds 2% of its range "
    "(or whose cosine is below 0.999) is flagged by the conversion's own measure (the CLI's warning), else it "
    "is a **miss**; Tensor Core ops in FP16 (column 3). `ok`: every output within the line; `flagged`: past "
    "it, and the conversion warns."
)


def section(rows: list[Row], failed: dict[str, str], seconds: float) -> str:
    lines = [HEADER, *(table_line(r) for r in rows)]
    met = sum(r.goal_met for r in rows)
    notes = [f"- {name}: failed: {why}" for name, why in failed.items()]
    return "\n".join([
        "## Fresh architectures: the default conversion on models nobody tuned it for",
        "",
        "Command: `python -m benchmarks.fresh_architectures --results`. Public transformers architectures the "
        "catalog does not hold, built small with random, realistic weights (`benchmarks/fresh_specs.py`: "
        "2-4 layers, widths 16-128; `-big`: LLM-scale residual streams), converted with the defaults "
        "(`amp_compiler.convert(model)`: CUDA, the range probe). *stated error*: the conversion's own "
        "measure on its probe inputs (worst output's max error of range); *warns*: whether it flags an "
        "output (the CLI's warning). Held-out columns: 3 inputs of the model's kind (seeds 100-102; images "
        "as noise, a smooth image and the same ImageNet-normalised; audio as sines plus noise), the converted "
        "model under exact emulation against FP32, worst input and output (top-1: argmax agreement of the "
        "class output).",
        "",
        *lines,
        "",
        GOAL,
        "",
        f"{met} of {len(rows)} rows meet the goal; {len(rows) + len(failed)} architectures in {seconds:.0f} s, of "
        f"which {sum(r.export_seconds for r in rows):.0f} s exporting (cached exports take none) and "
        f"{sum(r.seconds for r in rows):.0f} s converting.",
        *notes,
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(FRESH), help="comma-separated names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the architectures and exit")
    parser.add_argument("--results", action="store_true", help=f"write the table into {RESULTS.name}")
    args = parser.parse_args()
    if args.list:
        for arch in FRESH.values():
            print(f"{arch.name}\t{arch.family}\t{arch.description}")
        return
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in FRESH]
    if unknown:
        parser.error(f"unknown architectures {unknown} (--list names them)")
    start = time.perf_counter()
    rows, failed = [], {}
    print(HEADER, flush=True)
    for name in names:
        try:
            rows.append(row(FRESH[name]))
        except Exception as exc:  # noqa: BLE001 - a failure is a finding: name it, go on with the rest
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            print(f"| {name} | failed: {failed[name]} |", flush=True)
            continue
        print(table_line(rows[-1]), flush=True)
    text = section(rows, failed, time.perf_counter() - start)
    print("\n" + text.rsplit(GOAL, 1)[1].strip())
    if args.results:
        write_section(RESULTS, text, BEGIN, END)


if __name__ == "__main__":
    main()
