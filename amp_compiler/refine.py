"""Error-driven refinement (``--tolerance``): keep in low precision the units worth the most Tensor
Core FLOPs whose errors together fit the tolerance, and pin the rest to FP32.

    convert -> measure (every float output within tolerance? done: one conversion)
            -> units (amp_compiler.tolerance_units): each Tensor Core op with the cheap ops it feeds
            -> the switched probe (amp_compiler.tolerance_probe): each unit's error at the outputs, alone
            -> the knapsack (amp_compiler.knapsack): the units kept low, most Tensor Core FLOPs first,
               whose errors summed in quadrature fit the tolerance
            -> that set checked on the probe, then converted with the other units pinned and measured

Ranking by an estimate of each node's effect (its *added* error) kept too little in FP16: on deep
CNNs every convolution adds a little, and what reaches the outputs differs by orders of magnitude
between them. The probe measures what reaches the outputs, unit by unit, in one loaded session.

Guarantees: the result is the conversion with the recorded pins; ``met`` is true only when its
measured worst output error (exact FP16/BF16 storage emulated, against FP32, on the samples) is
within the tolerance. When the set the knapsack chose misses it (the prediction is not exact), the
budget shrinks by the miss and the choice is made again (on the probe, then by converting), so the
model runs are the units' count plus a few per sample, and the conversions 2 to 6.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx

from amp_compiler.calibrate import IntermediateRunner
from amp_compiler.convert import convert
from amp_compiler.costs import estimate
from amp_compiler.emulate import emulate, stored_values
from amp_compiler.errors import OptionError
from amp_compiler.knapsack import Option, choose
from amp_compiler.options import ConvertOptions
from amp_compiler.plan import Rule
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.report.model import NodeError, TensorRange
from amp_compiler.result import ConversionResult
from amp_compiler.runner import Runner, default_runner
from amp_compiler.targets import Target
from amp_compiler.tensor_error import ErrorStats
from amp_compiler.tolerance_probe import SwitchProbe, build_probe
from amp_compiler.tolerance_units import Unit, partition

# Decisions that pinning cannot change.
_NOT_COMPUTE = frozenset(rule.value for rule in (Rule.CONSTANT, Rule.NONFLOAT, Rule.LOWERING_CAST))
_SEARCH_STEPS = 8  # budgets tried on the probe per choice (each: one probe run per sample)
_FILL_TRIES = 16  # single-unit upgrades tried on the probe after the search (the same)
_CONVERSION_RETRIES = 3  # conversions after the first pinned one, when the real model misses


@dataclasses.dataclass
class Refinement:
    result: ConversionResult
    rounds: int  # conversions made (the last one is the result)
    model_runs: int  # runs of a converted model or of the probe (once per sample each)
    fp32_runs: int
    pinned: list[tuple[int, str]]
    node_errors: dict[int, NodeError]  # by position in the main graph, from the last conversion
    output_errors: dict[str, float]  # relative L2 of each float graph output, last conversion
    history: list[tuple[int, float]]  # (nodes pinned, worst output error) per conversion
    met: bool
    units: int = 0  # units the probe measured (0: the plain conversion met the tolerance)
    low_flops_share: float = 1.0  # share of the units' Tensor Core FLOPs kept in low precision
    # Share of the units' Tensor Core FLOPs in units that can be low at all: whose cheapest
    # low-precision option alone keeps the outputs within the tolerance (no choice keeps more low).
    ceiling: float = 1.0


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
) -> Refinement:
    """Convert ``fp32`` so every float output is within ``tolerance`` of FP32 (see module doc).
    ``runner``: where the models run (default: a child process with the default budget)."""
    if not samples:
        raise OptionError("needs calibration samples (the inputs it measures error on)", option="tolerance")
    runner, owned = default_runner(runner)
    try:
        return _Refiner(fp32, samples, tolerance, options or ConvertOptions(), ranges, policy, runner).run()
    finally:
        if owned:
            runner.close()


class _Refiner:
    def __init__(self, fp32: onnx.ModelProto, samples: list[dict[str, np.ndarray]], tolerance: float,
                 opts: ConvertOptions, ranges: dict[str, TensorRange] | None, policy: PolicyTable | None,
                 runner: Runner):
        self.fp32, self.samples, self.tolerance, self.opts = fp32, samples, tolerance, opts
        self.ranges, self.policy, self.runner = ranges, policy, runner
        self.fp32_runner = IntermediateRunner(fp32, runner)
        self.history: list[tuple[int, float]] = []
        self.runs = 0

    def convert(self, pinned: list[tuple[int, str]], kept: list[tuple[int, str]] | None = None):
        """A conversion with ``pinned`` (FP32) and ``kept`` (low) nodes, and its measurement: (result,
        node errors, output errors)."""
        opts = dataclasses.replace(self.opts, pinned_nodes=tuple(pinned), kept_nodes=tuple(kept or ()))
        result = convert(self.fp32, opts, policy=self.policy, ranges=self.ranges)
        errors, outputs, n = _measure(self.fp32, result.model, self.samples, self.fp32_runner, self.runner)
        self.runs += n
        self.history.append((len(pinned), max(outputs.values(), default=0.0)))
        return result, errors, outputs

    def done(self, result, errors, outputs, pinned, units=0, share=1.0, ceiling=1.0) -> Refinement:
        met = max(outputs.values(), default=0.0) <= self.tolerance
        return Refinement(result, len(self.history), self.runs, self.fp32_runner.runs, pinned, errors, outputs,
                          self.history, met, units, share, ceiling)

    def run(self) -> Refinement:
        result, errors, outputs = self.convert([])
        if max(outputs.values(), default=0.0) <= self.tolerance:
            return self.done(result, errors, outputs, [])
        units = self.units(result)
        # Switch groups: a Tensor Core unit's root, and its followers; a cheap unit whole.
        groups: list[tuple[int, ...]] = []
        parts: list[tuple[int, ...]] = []  # per unit: its groups, the root's first
        for unit in units:
            whole = not unit.tensor_core_flops or len(unit.nodes) == 1
            split = (unit.nodes,) if whole else (unit.nodes[:1], unit.nodes[1:])
            parts.append(tuple(range(len(groups), len(groups) + len(split))))
            groups += split
        probe = SwitchProbe(self.fp32, build_probe(self.fp32, result.model, result.decisions, groups), len(groups),
                            self.samples, self.runner)
        try:
            items = [self.options(probe, unit, part) for unit, part in zip(units, parts, strict=True)]
            room = math.sqrt(max(self.tolerance ** 2 - probe.base ** 2, 0.0))
            above = math.sqrt(sum(max(o.error ** 2 for o, _ in item) for item in items))  # every unit fits
            for _ in range(_CONVERSION_RETRIES + 1):
                picks, budget = self.fit(probe, items, room, above)
                pinned, kept = self.choices(units, items, picks)
                result, errors, outputs = self.convert(pinned, kept)
                if max(outputs.values(), default=0.0) <= self.tolerance or not any(picks):
                    break
                above = budget  # the pins changed more than the probe saw: search below this budget
        finally:
            self.runs += probe.runs
            probe.close()
        total = sum(u.tensor_core_flops for u in units) or 1
        low = sum(u.tensor_core_flops for u, pick in zip(units, picks, strict=True) if pick)
        can = sum(u.tensor_core_flops for u, item in zip(units, items, strict=True)
                  if min(o.error for o, _ in item[1:]) <= room)
        return self.done(result, errors, outputs, pinned, len(units), low / total, can / total)

    def options(self, probe: SwitchProbe, unit: Unit, part: tuple[int, ...]) -> list[tuple[Option, frozenset[int]]]:
        """A unit's choices, each with its error alone at the outputs (beyond what no group controls:
        squares add, see :mod:`amp_compiler.knapsack`) and the groups it switches on: FP32; for a
        Tensor Core unit with followers, its root low and its followers FP32; everything low."""
        def alone(on: frozenset[int]) -> float:
            e = probe.error(on)
            return math.sqrt(max(e * e - probe.base ** 2, 0.0)) if math.isfinite(e) else math.inf

        found: list[tuple[Option, frozenset[int]]] = [(Option(0.0, 0), frozenset())]
        if len(part) > 1:
            found.append((Option(alone(frozenset(part[:1])), unit.tensor_core_flops), frozenset(part[:1])))
        found.append((Option(alone(frozenset(part)), unit.tensor_core_flops + 1), frozenset(part)))
        return found

    def units(self, result: ConversionResult) -> list[Unit]:
        """The units of the conversion's low-precision nodes (main graph)."""
        table = self.policy or default_table()
        nodes = list(self.fp32.graph.node)
        low_name = self.opts.target.value
        low = {d.index for d in result.decisions
               if d.index is not None and d.index < len(nodes) and d.precision == low_name
               and d.rule not in _NOT_COMPUTE}
        shapes = {k: v.shape for k, v in self.samples[0].items()}
        flops = [c.flops for c in estimate(self.fp32, shapes, table).nodes[: len(nodes)]]
        tensor_core = [table.is_tensor_core(n.domain, n.op_type) for n in nodes]
        return partition(self.fp32.graph, low, tensor_core, flops)

    def fit(self, probe: SwitchProbe, items: list[list[tuple[Option, frozenset[int]]]], first: float,
            above: float) -> tuple[list[int], float]:
        """The option picked per unit and the budget that picked them: the knapsack's choice for the
        largest budget below ``above`` whose groups the probe finds within the tolerance (a geometric
        search from ``first``: the prediction is not exact, in either direction)."""
        options = [[o for o, _ in item] for item in items]
        best, best_value, best_budget = [0] * len(items), -1, 0.0
        below, budget = 0.0, min(first, above * 0.99)
        for _ in range(_SEARCH_STEPS):
            picks = choose(options, budget)
            on = frozenset().union(*(item[k][1] for item, k in zip(items, picks, strict=True)))
            if probe.error(on) <= self.tolerance:
                value = sum(item[k][0].value for item, k in zip(items, picks, strict=True))
                if value > best_value:
                    best, best_value, best_budget = picks, value, budget
                below = budget
            else:
                above = budget
            budget = math.sqrt(below * above) if below > 0 else above / 2
        return self.fill(probe, items, best), best_budget

    def fill(self, probe: SwitchProbe, items: list[list[tuple[Option, frozenset[int]]]],
             picks: list[int]) -> list[int]:
        """``picks`` with units moved up one option at a time (most value per predicted error first),
        each kept when the probe still finds the whole within the tolerance: the knapsack's choices
        jump as the budget grows, and what lies between two of them is often still within it."""
        picks = list(picks)
        ups = []
        for i, item in enumerate(items):
            for k in range(picks[i] + 1, len(item)):
                gain = item[k][0].value - item[picks[i]][0].value
                cost = item[k][0].error ** 2 - item[picks[i]][0].error ** 2
                if gain > 0 and math.isfinite(cost):
                    ups.append((gain / max(cost, 1e-300), i, k))
        for _, i, k in sorted(ups, reverse=True)[:_FILL_TRIES]:
            if k <= picks[i]:
                continue
            trial = picks[:i] + [k] + picks[i + 1:]
            on = frozenset().union(*(item[j][1] for item, j in zip(items, trial, strict=True)))
            if probe.error(on) <= self.tolerance:
                picks = trial
        return picks

    def choices(self, units: list[Unit], items: list[list[tuple[Option, frozenset[int]]]], picks: list[int]):
        """The nodes pinned to FP32 and those kept low, each with why."""
        nodes = self.fp32.graph.node
        pinned, kept = [], []
        for unit, item, pick in zip(units, items, picks, strict=True):
            root = nodes[unit.root]
            name = f"{root.op_type} '{root.name}'" if root.name else root.op_type
            everything = f"{name} and the {len(unit.nodes) - 1} op(s) it feeds" if len(unit.nodes) > 1 else name
            last = item[-1][0]
            effect = f"in low precision alone {everything} move(s) the outputs by {last.error:.2e} (relative L2)"
            cost = (f"{unit.tensor_core_flops:.3g} Tensor Core FLOPs" if unit.tensor_core_flops
                    else "no Tensor Core FLOPs")
            tol = f"--tolerance {self.tolerance:g}"
            if pick == len(item) - 1:
                kept += [(i, f"kept by {tol}: {effect}, within the budget for {cost}") for i in unit.nodes]
            elif pick == 0:
                pinned += [(i, f"pinned by {tol}: {effect}, too much for {cost}") for i in unit.nodes]
            else:  # the root low, its followers FP32
                root_only = item[pick][0].error
                kept.append((unit.root, f"kept by {tol}: {effect}; with the ops it feeds in FP32, "
                             f"{root_only:.2e}, within the budget for {cost}"))
                pinned += [(i, f"pinned by {tol} after {name}: {effect}; with them in FP32 it moves them by "
                            f"{root_only:.2e}, enough to keep its {cost} low") for i in unit.nodes[1:]]
        return sorted(pinned), sorted(kept)
