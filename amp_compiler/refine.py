"""Error-driven refinement (``--tolerance``): pin to FP32 the nodes that add the most error.

Each round converts the model, runs the converted and the FP32 model on the calibration samples
with every main-graph tensor exposed, and measures per node the error its output has against FP32
(relative L2) and the error it *adds* (its output's error minus the worst error among its inputs).
When every float graph output is within ``tolerance`` (relative L2 against FP32), it stops. Otherwise
it pins the ``2**round`` low-precision nodes that add the most error (re-ranked every round) and
converts again. Once a round meets the tolerance, bisection over that round's batch keeps the
shortest prefix that still meets it. A model of N nodes needs at most ``log2(N) + 1`` doubling rounds
and ``log2(N)`` bisection rounds: the model runs grow like log N (onnxconverter-common's
auto_convert_mixed_precision needs up to 2N - 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from amp_compiler.calibrate import IntermediateRunner
from amp_compiler.convert import convert
from amp_compiler.emulate import emulate
from amp_compiler.errors import OptionError
from amp_compiler.options import ConvertOptions
from amp_compiler.plan import Rule
from amp_compiler.policy import PolicyTable
from amp_compiler.report.model import NodeError, TensorRange
from amp_compiler.result import ConversionResult
from amp_compiler.runner import Runner, default_runner
from amp_compiler.targets import Target

# Decisions that pinning cannot change.
_NOT_COMPUTE = frozenset(rule.value for rule in (Rule.CONSTANT, Rule.NONFLOAT, Rule.LOWERING_CAST))


@dataclasses.dataclass
class _ErrAcc:
    diff2: float = 0.0
    ref2: float = 0.0
    max_abs: float = 0.0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        r = np.asarray(ref, dtype=np.float64)
        g = np.asarray(got, dtype=np.float64)
        if r.shape != g.shape:
            return
        finite = np.isfinite(r)
        d = np.where(finite, g - r, np.where(r == g, 0.0, np.inf))
        self.diff2 += float(np.sum(d * d))
        self.ref2 += float(np.sum(np.where(finite, r * r, 0.0)))
        self.max_abs = max(self.max_abs, float(np.max(np.abs(d))) if d.size else 0.0)

    @property
    def rel_l2(self) -> float:
        if self.ref2 == 0:
            return 0.0 if self.diff2 == 0 else float("inf")
        return float(np.sqrt(self.diff2 / self.ref2))


@dataclasses.dataclass
class Refinement:
    result: ConversionResult
    rounds: int  # conversions made (the last one is the result)
    model_runs: int  # runs of a converted model (each round runs it once per sample)
    fp32_runs: int
    pinned: list[tuple[int, str]]
    node_errors: dict[int, NodeError]  # by position in the main graph, from the last round
    output_errors: dict[str, float]  # relative L2 of each float graph output, last round
    history: list[tuple[int, float]]  # (nodes pinned, worst output error) per round
    met: bool


def measure(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    target: Target, fp32_runner: IntermediateRunner | None = None, *, runner: Runner | None = None,
) -> tuple[dict[int, NodeError], dict[str, float], int]:
    """Per main-graph node of ``fp32``: the error of its output in ``converted``; per float output:
    its relative L2 error. Also returns the number of converted-model runs. ``runner``: where the
    models run (default: a child process with the default budget)."""
    runner, owned = default_runner(runner)
    try:
        return _measure(fp32, converted, samples, fp32_runner or IntermediateRunner(fp32, runner), runner)
    finally:
        if owned:
            runner.close()


def _measure(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    fp32_runner: IntermediateRunner, runner: Runner,
) -> tuple[dict[int, NodeError], dict[str, float], int]:
    runnable = emulate(converted)  # exact FP16/BF16 storage, whatever the CPU kernels do
    intermediates = IntermediateRunner(runnable, runner)
    accs: dict[str, _ErrAcc] = {}
    for sample in samples:
        ref = fp32_runner.run(sample)
        got = intermediates.run(sample)
        for name, value in ref.items():
            if name in got and np.issubdtype(np.asarray(value).dtype, np.floating):
                accs.setdefault(name, _ErrAcc()).add(value, got[name])
        del ref, got
    intermediates.close()
    rel = {name: acc.rel_l2 for name, acc in accs.items()}
    errors: dict[int, NodeError] = {}
    for i, node in enumerate(fp32.graph.node):
        out = next((o for o in node.output if o in accs), None)
        if out is None:
            continue
        worst_in = max((rel.get(x, 0.0) for x in node.input if x), default=0.0)
        errors[i] = NodeError(rel_l2=rel[out], max_abs=accs[out].max_abs, added=rel[out] - worst_in)
    outputs = {o.name: rel[o.name] for o in fp32.graph.output if o.name in rel}
    return errors, outputs, intermediates.runs


def refine(
    fp32: onnx.ModelProto,
    samples: list[dict[str, np.ndarray]],
    tolerance: float,
    options: ConvertOptions | None = None,
    *,
    ranges: dict[str, TensorRange] | None = None,
    policy: PolicyTable | None = None,
    runner: Runner | None = None,
) -> Refinement:
    """Convert ``fp32`` so every float output is within ``tolerance`` of FP32 (see module doc).
    ``runner``: where the models run (default: a child process with the default budget)."""
    if not samples:
        raise OptionError("needs calibration samples (the inputs it measures error on)", option="tolerance")
    runner, owned = default_runner(runner)
    try:
        return _refine(fp32, samples, tolerance, options or ConvertOptions(), ranges, policy, runner)
    finally:
        if owned:
            runner.close()


def _refine(
    fp32: onnx.ModelProto, samples: list[dict[str, np.ndarray]], tolerance: float, opts: ConvertOptions,
    ranges: dict[str, TensorRange] | None, policy: PolicyTable | None, runner: Runner,
) -> Refinement:
    fp32_runner = IntermediateRunner(fp32, runner)
    pinned: list[tuple[int, str]] = []
    history: list[tuple[int, float]] = []
    runs = rounds = 0
    low = opts.target.value
    batch: list[tuple[int, str]] = []  # the pins added by the last round

    def attempt(pins: list[tuple[int, str]]):
        nonlocal runs, rounds
        attempt_opts = dataclasses.replace(opts, pinned_nodes=tuple(pins))
        result = convert(fp32, attempt_opts, policy=policy, ranges=ranges)
        rounds += 1
        errors, outputs, n = _measure(fp32, result.model, samples, fp32_runner, runner)
        runs += n
        worst = max(outputs.values(), default=0.0)
        history.append((len(pins), worst))
        return result, errors, outputs, worst <= tolerance

    while True:
        result, errors, outputs, met = attempt(pinned)
        if met and len(batch) > 1:
            # The last doubling may have pinned more than needed: keep the shortest prefix of the
            # last batch (by rank) that still meets the tolerance, by bisection (log2 of the batch).
            kept = pinned[: len(pinned) - len(batch)]
            lo, hi, best = 0, len(batch), (result, errors, outputs)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                trial = attempt(kept + batch[:mid])
                if trial[3]:
                    hi, best = mid, trial[:3]
                else:
                    lo = mid
            pinned = kept + batch[:hi]
            result, errors, outputs = best
            return Refinement(result, rounds, runs, fp32_runner.runs, pinned, errors, outputs, history, True)
        taken = {i for i, _ in pinned}
        main = {
            d.index for d in result.decisions
            if d.index is not None and d.precision == low and d.rule not in _NOT_COMPUTE
        }
        candidates = sorted(
            (i for i in errors if i in main and i not in taken and errors[i].added > 0),
            key=lambda i: -errors[i].added,
        )
        if met or not candidates:
            return Refinement(result, rounds, runs, fp32_runner.runs, pinned, errors, outputs, history, met)
        batch = [
            (i, f"pinned by --tolerance {tolerance:g}: adds {errors[i].added:.2e} relative error "
                f"(round {rounds})")
            for i in candidates[: 2 ** (rounds - 1)]
        ]
        pinned = pinned + batch
