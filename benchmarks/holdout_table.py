"""Whether ``--tolerance`` and the FP8 budget hold on inputs they never saw, per catalog model (issue 23).

    python -m benchmarks.holdout_table [--models a,b,c] [--tolerance 0.01 | --relative 0.5] [--fp8] [--results]

Per model (every small catalog entry with a float output, the wheel models included): calibration
samples from the entry's own ``make_inputs`` (seeds 0..N-1, N = ``--samples``, 4 by default), of which
``holdout`` (half, the default) are held out by the choice; **fresh** samples (seeds 500.., 16 by
default), used neither for the choice nor held out, score the result. Every error is the worst float output's relative
L2 against FP32 under exact emulation (FP16/BF16 storage, FP8 Q/DQ as onnxruntime computes them).

- ``--tolerance T``: :func:`amp_compiler.onnx.tolerance.refine.refine` with the calibration ranges,
  its error on the choice samples and on the held-out ones (as it reports them), the result's error
  on the fresh samples, the share of Tensor Core FLOPs kept in FP16, and the model runs it took.
  ``--relative F`` instead: per model, F times the plain conversion's error on the choice samples
  (a tolerance the choice must work for, on every model).
- ``--fp8``: ``convert(target="fp8")`` with the default FP8 budget (10%): the error the chosen FP8
  GEMMs add, measured as the FP8 result against the same conversion with no GEMM in FP8 (its FP16
  fallback), on the choice samples, the held-out ones and the fresh ones; the FP8 share of Tensor
  Core FLOPs. The budget itself is judged with only the FP8 GEMMs switched, the rest FP32: another
  quantity (FP8 next to FP16 rounding can add more), so this table compares the three sample sets
  with each other, and its 10% line is indicative only.

``--results`` writes the tables into ``benchmarks/RESULTS.md`` between the ``holdout-table`` markers.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from amp_compiler import convert
from amp_compiler.core.choice import hold_out
from amp_compiler.core.tensor_error import OutputErrors
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.onnx.tolerance.refine import refine
from amp_compiler.options import ConvertOptions
from amp_compiler.runtime.runner import InProcessRunner, Runner
from amp_compiler.targets import FP8_BUDGET, HOLDOUT, Target
from benchmarks import fp8_protocol
from benchmarks.cold import write_section
from benchmarks.tolerance_table import tensor_core_low_share
from models import catalog
from models.deployment import feeds_for

RESULTS = Path(__file__).with_name("RESULTS.md")
BEGIN = "<!-- holdout-table:begin (python -m benchmarks.holdout_table --fp8 --results) -->"
END = "<!-- holdout-table:end -->"
FRESH_SEED = 500
_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def float_output_models() -> list[str]:
    """Every small catalog entry whose model has a float output (the wheel models are small entries)."""
    return [e.name for e in catalog.entries("small")
            if any(o.type.tensor_type.elem_type in _FLOATS for o in catalog.load(e).graph.output)]


@dataclasses.dataclass(frozen=True)
class Held:
    """One model's choice scored on three sets of samples."""

    model: str
    limit: float  # the tolerance or the FP8 budget
    met: bool | None  # as the choice reports it (None: the FP8 budget has no such flag)
    choice: float  # worst output error on the samples it chose on
    held: float  # ... on the samples it held out
    fresh: float  # ... on samples it never saw
    low_share: float  # Tensor Core FLOPs kept low (FP16 for --tolerance, FP8 for the budget)
    runs: int  # model runs the choice took (--tolerance)
    seconds: float

    @property
    def holds(self) -> bool:
        """The limit holds on the fresh samples, or the choice said honestly that it did not meet it."""
        return self.fresh <= self.limit or self.met is False


def samples(name: str, count: int, first_seed: int = 0) -> list[dict[str, np.ndarray]]:
    entry = catalog.get(name)
    fp32 = catalog.load(entry)
    return [feeds_for(fp32, entry.make_inputs(np.random.default_rng(first_seed + k)))
            for k in range(count)]


def worst_error(reference: onnx.ModelProto, converted: onnx.ModelProto, feeds: Sequence[dict[str, np.ndarray]],
                runner: Runner) -> float:
    """The worst float output's relative L2 of ``converted`` (emulated exactly) against ``reference``
    (emulated too: a no-op for an FP32 model) over ``feeds``."""
    names = [o.name for o in reference.graph.output]
    floats = [k for k, o in enumerate(reference.graph.output) if o.type.tensor_type.elem_type in _FLOATS]
    errors = OutputErrors(len(floats), names=[names[k] for k in floats])
    ref, got = runner.load(emulate(reference)), runner.load(emulate(converted))
    try:
        for feed in feeds:
            r, g = ref.run(feed), got.run(feed)
            errors.add([np.asarray(r[k], np.float64) for k in floats], [np.asarray(g[k], np.float64) for k in floats])
    finally:
        ref.close()
        got.close()
    return errors.worst()


def tolerance_row(name: str, tolerance: float, count: int, fresh: int, relative: bool = False) -> Held:
    """``--tolerance`` on ``name`` (``relative``: ``tolerance`` times the plain conversion's error)."""
    fp32 = catalog.load(name)
    calibration, unseen = samples(name, count), samples(name, fresh, FRESH_SEED)
    shapes = {k: v.shape for k, v in calibration[0].items()}
    runner = InProcessRunner()  # the catalog's own models
    ranges = collect_ranges(fp32, calibration, runner=runner)
    if relative:
        plain = convert(fp32, ranges=ranges, runner=runner, range_fallback="fp32")  # as refine converts
        tolerance *= worst_error(fp32, plain.model, hold_out(calibration, HOLDOUT)[0], runner)
    start = time.perf_counter()
    r = refine(fp32, calibration, tolerance, ranges=ranges, runner=runner)
    seconds = time.perf_counter() - start
    return Held(name, tolerance, r.met, max(r.output_errors.values(), default=0.0),
                max(r.held_out_errors.values(), default=0.0), worst_error(fp32, r.result.model, unseen, runner),
                tensor_core_low_share(r.result, shapes), r.model_runs, seconds)


def fp8_row(name: str, count: int, fresh: int) -> Held:
    fp32 = catalog.load(name)
    calibration, unseen = samples(name, count), samples(name, fresh, FRESH_SEED)
    fit, held = hold_out(calibration, HOLDOUT)
    runner = InProcessRunner()
    start = time.perf_counter()
    result = convert(fp32, ConvertOptions(target=Target.FP8), samples=calibration, runner=runner)
    seconds = time.perf_counter() - start
    fallback = convert(fp32, ConvertOptions(target=Target.FP8, fp8_nodes=()), samples=calibration, runner=runner)
    gemms = fp8_protocol.gemms(fp32, calibration[0])
    share = fp8_protocol.flop_share(gemms, fp8_protocol.fp8_outputs(result.model))
    errors = [worst_error(fallback.model, result.model, feeds, runner) if feeds else math.nan
              for feeds in (fit, held, unseen)]
    return Held(name, FP8_BUDGET, None, *errors, share, 0, seconds)


def pct(x: float) -> str:
    return "-" if math.isnan(x) else ("inf" if math.isinf(x) else f"{x:.2%}")


def table(rows: Sequence[Held], low: str) -> str:
    lines = [f"| model | limit | met (its word) | choice samples | held out | fresh | holds on fresh | TC FLOPs {low} "
             "| model runs | s |", "|---|---:|:---:|---:|---:|---:|:---:|---:|---:|---:|"]
    for h in rows:
        fresh = pct(h.fresh) if h.fresh <= h.limit else f"**{pct(h.fresh)}**"
        lines.append(
            f"| {h.model} | {h.limit:.2g} | {'-' if h.met is None else 'yes' if h.met else 'no'} | {pct(h.choice)} | {pct(h.held)} | {fresh} | "
            f"{'yes' if h.holds else '**no**'} | {h.low_share:.0%} | {h.runs or '-'} | {h.seconds:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated catalog entries (default: every small "
                        "entry with a float output)")
    parser.add_argument("--tolerance", type=float, default=0.01)
    parser.add_argument("--relative", type=float, default=None,
                        help="per model, this times the plain conversion's error as the tolerance")
    parser.add_argument("--samples", type=int, default=4, help="calibration samples (half held out)")
    parser.add_argument("--fresh", type=int, default=16, help="fresh samples that score the result")
    parser.add_argument("--fp8", action="store_true", help="also the FP8 budget's table")
    parser.add_argument("--results", action="store_true", help=f"write the tables into {RESULTS.name}")
    args = parser.parse_args()
    names = args.models.split(",") if args.models else float_output_models()
    sections = []
    rows = []
    print(table([], "FP16"), flush=True)
    for name in names:
        try:
            if args.relative is not None:
                rows.append(tolerance_row(name, args.relative, args.samples, args.fresh, relative=True))
            else:
                rows.append(tolerance_row(name, args.tolerance, args.samples, args.fresh))
            print(table(rows[-1:], "FP16").splitlines()[-1], flush=True)
        except Exception as exc:  # a model the refinement refuses: say so and go on
            print(f"| {name} | fails: {type(exc).__name__}: {str(exc).splitlines()[0][:100]} |", flush=True)
    told = f"--tolerance {args.tolerance:g}" if args.relative is None else \
        f"--tolerance {args.relative:g} x the plain conversion's error"
    sections.append(f"`{told}` ({args.samples} calibration samples, "
                    f"{hold_out(range(args.samples), HOLDOUT)[1].__len__()} of them held out; "
                    f"{args.fresh} fresh):\n\n{table(rows, 'FP16')}")
    if args.fp8:
        fp8_rows = []
        print(table([], "FP8"), flush=True)
        for name in names:
            try:
                fp8_rows.append(fp8_row(name, args.samples, args.fresh))
                print(table(fp8_rows[-1:], "FP8").splitlines()[-1], flush=True)
            except Exception as exc:
                print(f"| {name} | fails: {type(exc).__name__}: {str(exc).splitlines()[0][:100]} |", flush=True)
        sections.append(f"FP8 budget {FP8_BUDGET:g} (`--target fp8`, the same samples; the error the FP8 GEMMs "
                        f"add against the same conversion with none in FP8):\n\n{table(fp8_rows, 'FP8')}")
    if args.results:
        write_section(RESULTS, "## Held-out and fresh inputs (issue 23)\n\n" + __doc__.split("\n\n", 2)[2].split(
            "``--results``")[0].strip() + "\n\n" + "\n\n".join(sections), BEGIN, END)


if __name__ == "__main__":
    main()
