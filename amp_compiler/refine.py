"""Error-driven refinement (``--tolerance``): pin to FP32 the nodes that remove the most error per
Tensor Core FLOP kept in FP32.

Each round converts the model, runs the converted and the FP32 model on the calibration samples
with every main-graph tensor exposed, and measures per node the error its output has against FP32
(relative L2, as the low-precision model stores it) and the error it *adds* (its output's error
minus the worst error among its inputs). When every float graph output is within ``tolerance``
(relative L2 against FP32), it stops. Otherwise it pins the ``2**round`` best candidates of
:mod:`amp_compiler.pin_ranking` (re-ranked every round: error removed per Tensor Core FLOP kept in
FP32, cheap ops whose result nothing low-precision reads first) and converts again. Once a round
meets the tolerance, bisection over that round's batch keeps the shortest prefix that still meets it.
A model of N nodes needs at most ``log2(N) + 1`` doubling rounds and ``log2(N)`` bisection rounds:
the model runs grow like log N (onnxconverter-common's auto_convert_mixed_precision needs up to
2N - 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx

from amp_compiler.calibrate import IntermediateRunner
from amp_compiler.convert import convert
from amp_compiler.costs import estimate
from amp_compiler.emulate import emulate, stored_values
from amp_compiler.errors import OptionError
from amp_compiler.options import ConvertOptions
from amp_compiler.pin_ranking import RANKINGS, rank
from amp_compiler.plan import Rule
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.report.model import NodeError, TensorRange
from amp_compiler.result import ConversionResult
from amp_compiler.runner import Runner, default_runner
from amp_compiler.targets import Target
from amp_compiler.tensor_error import ErrorStats

# Decisions that pinning cannot change.
_NOT_COMPUTE = frozenset(rule.value for rule in (Rule.CONSTANT, Rule.NONFLOAT, Rule.LOWERING_CAST))


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
    accs: dict[str, ErrorStats] = {}
    for sample in samples:
        ref = fp32_runner.run(sample)
        got = stored_values(intermediates.run(sample))
        for name, value in ref.items():
            if name in got and np.issubdtype(np.asarray(value).dtype, np.floating):
                accs.setdefault(name, ErrorStats()).add(value, got[name])
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
    ranking: str = "per-flop",
) -> Refinement:
    """Convert ``fp32`` so every float output is within ``tolerance`` of FP32 (see module doc).
    ``runner``: where the models run (default: a child process with the default budget).
    ``ranking``: ``"per-flop"`` (error removed per Tensor Core FLOP kept FP32) or ``"error"`` (added
    error alone, as before; for comparison)."""
    if not samples:
        raise OptionError("needs calibration samples (the inputs it measures error on)", option="tolerance")
    if ranking not in RANKINGS:
        raise ValueError(f"unknown ranking {ranking!r}; expected one of {', '.join(RANKINGS)}")
    runner, owned = default_runner(runner)
    try:
        return _refine(fp32, samples, tolerance, options or ConvertOptions(), ranges, policy, runner, ranking)
    finally:
        if owned:
            runner.close()


def _refine(
    fp32: onnx.ModelProto, samples: list[dict[str, np.ndarray]], tolerance: float, opts: ConvertOptions,
    ranges: dict[str, TensorRange] | None, policy: PolicyTable | None, runner: Runner, ranking: str,
) -> Refinement:
    table = policy or default_table()
    main_nodes = list(fp32.graph.node)
    costs = estimate(fp32, {k: v.shape for k, v in samples[0].items()}, table).nodes[: len(main_nodes)]
    flops = [c.flops for c in costs]
    tensor_core = [table.is_tensor_core(n.domain, n.op_type) for n in main_nodes]
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
        precision = {
            d.index: d.precision for d in result.decisions
            if d.index is not None and d.index < len(main_nodes) and d.rule not in _NOT_COMPUTE
        }
        candidates = [
            c for c in rank(ranking, fp32.graph, errors, precision, low, flops, tensor_core) if c.index not in taken
        ]
        if met or not candidates:
            return Refinement(result, rounds, runs, fp32_runner.runs, pinned, errors, outputs, history, met)
        batch = [(c.index, c.why(tolerance, rounds)) for c in candidates[: 2 ** (rounds - 1)]]
        pinned = pinned + batch
