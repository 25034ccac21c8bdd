"""Error-driven refinement (``--tolerance``): keep in low precision the units worth the most Tensor
Core throughput whose errors together fit the tolerance, and pin the rest to FP32.

    convert -> measure (every float output within tolerance? done: one conversion)
            -> units (amp_compiler.onnx.tolerance.units): each Tensor Core op with the cheap ops it feeds
            -> the switched probe (amp_compiler.onnx.measure.probe: a switch per group, one per FP8 candidate)
            -> each unit's levels measured alone (amp_compiler.onnx.tolerance.choice), the best set
               within the tolerance chosen and checked on the probe (amp_compiler.core.choice)
            -> one conversion with that choice fixed, measured

Ranking by an estimate of each node's effect (its *added* error) kept too little in FP16: on deep
CNNs every convolution adds a little, and what reaches the outputs differs by orders of magnitude
between them. The probe measures what reaches the outputs, unit by unit, in one loaded session.

With ``--target fp8`` the units come from the fallback (FP16/BF16) conversion of the model at the FP8
opset, and a unit whose Tensor Core op is an FP8 candidate may also take FP8: the plain conversion
is not tried first (its FP8 choice follows ``fp8_budget``, not the tolerance).

Held-out samples: ``options.holdout`` of the samples (:func:`amp_compiler.core.choice.hold_out`) are
held out: the choice is made on the rest (the calibration part) and tightened when it misses the
tolerance on the held-out part (:mod:`amp_compiler.core.choice`); the result's error is reported on
both. The error is ``options.metric``'s (relative L2 by default; :class:`amp_compiler.core.tensor_error.OutputErrors`).

Guarantees: the result is the conversion with the recorded choice; ``met`` is true only when its
measured worst output error (exact FP16/BF16 storage emulated, FP8 Q/DQ as onnxruntime computes it,
against FP32, on the calibration samples and on the held-out ones) is within the tolerance. When the
conversion misses what the probe measured, the choice is made again below that budget (at most three
times, and not when it gives a choice already converted). When no unit is left low although the plain
conversion missed, ``why_fp32`` says why in one line (the output, and how far off the unit that moves
it least is on its own). Model runs: at most two per unit and sample in the probe's session (a level's
runs stop as soon as its samples so far prove it beyond the tolerance; a unit whose Tensor Core op
alone is beyond it is not measured whole: :mod:`amp_compiler.onnx.tolerance.choice`), plus one per
conversion; conversions: usually 2. When the probe with every unit in FP32 already misses the
tolerance (what no unit controls: on inputs that drive a sigmoid output to ~1e-6, FP32's own rounding
in a graph fused otherwise moves it by 20%), no unit is measured: every unit is pinned, assuming
that a unit switched on adds to that error rather than cancels it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import onnx
import onnx.shape_inference
import onnx_ir as ir

from amp_compiler.core.choice import VerifiedChoice, hold_out
from amp_compiler.core.measures import NodeError, TensorRange
from amp_compiler.core.plan import Rule
from amp_compiler.core.tensor_error import ErrorMetric, ErrorStats, Metric, OutputErrors, metric_name
from amp_compiler.errors import OptionError
from amp_compiler.onnx.convert import convert
from amp_compiler.onnx.costs.costs import estimate
from amp_compiler.onnx.fp8.steps import local_choice
from amp_compiler.onnx.load.fused_ops import split_fused_ops
from amp_compiler.onnx.load.opset import for_bf16, fp8_opset, raise_opset
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.chain import ModelChain
from amp_compiler.onnx.measure.emulate import emulate, rounded_origin
from amp_compiler.onnx.measure.probe import SwitchProbe, build_probe
from amp_compiler.onnx.tolerance.choice import Choice, Decided, Level, decide, decide_fp32, switches_on, unit_choices
from amp_compiler.onnx.tolerance.units import Unit, partition
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.options import ConvertOptions
from amp_compiler.passes.onnx.qdq import Fp8Candidate
from amp_compiler.policy import PolicyTable, default_table
from amp_compiler.runtime.runner import Runner, default_runner
from amp_compiler.targets import Target

__all__ = ["Refinement", "measure", "refine"]

# Decisions that pinning cannot change (nodes the user forced low with --allow-op/--allow-node included).
_NOT_COMPUTE = frozenset(rule.value for rule in (Rule.CONSTANT, Rule.NONFLOAT, Rule.LOWERING_CAST, Rule.USER_ALLOW))
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
    low_flops_share: float = 1.0  # share of the units' Tensor Core FLOPs kept in low precision (FP8 included)
    fp8_flops_share: float = 0.0  # ... in FP8 (--target fp8)
    # Share of the units' Tensor Core FLOPs in units that can be low at all: whose cheapest
    # low-precision option alone keeps the outputs within the tolerance (no choice keeps more low).
    ceiling: float = 1.0
    fp32: onnx.ModelProto | None = dataclasses.field(default=None, repr=False)  # the FP32 model it refers to
    held_out_errors: dict[str, float] = dataclasses.field(default_factory=dict)  # ... on the held-out samples
    held_out: int = 0  # samples held out (the choice was made on the others)
    metric: str = Metric.REL_L2.value  # the error metric of output_errors and held_out_errors, in words
    why_fp32: str | None = None  # when no unit could stay low: why, in one line


def measure(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    target: Target, fp32_runner: ModelChain | None = None, *, runner: Runner | None = None,
    metric: ErrorMetric = Metric.REL_L2,
) -> tuple[dict[int, NodeError], dict[str, float], int]:
    """Per main-graph node of ``fp32``: the error of its output in ``converted``; per float output:
    its error under ``metric`` (default relative L2). Also returns the number of converted-model
    runs. ``fp32_runner``: ``fp32``'s chain, loaded in ``runner`` (default: loaded here); ``runner``:
    where the models run (default: a child process with the default budget)."""
    runner, owned = default_runner(runner)
    try:
        reference = fp32_runner or ModelChain(fp32, runner, samples[0] if samples else {})
        try:
            errors, outputs, _, runs = _measure_both(fp32, converted, samples, [], reference, runner, metric)
        finally:
            if reference is not fp32_runner:
                reference.close()
        return errors, outputs, runs
    finally:
        if owned:
            runner.close()


def _measure_both(
    fp32: onnx.ModelProto, converted: onnx.ModelProto, samples: list[dict[str, np.ndarray]],
    held: list[dict[str, np.ndarray]], reference: ModelChain, runner: Runner, metric: ErrorMetric,
) -> tuple[dict[int, NodeError], dict[str, float], dict[str, float], int]:
    """Node errors and output errors on ``samples``, output errors on ``held`` (empty when none), and
    the converted model's runs. Both models run where the runner runs them, as chains of pieces with
    every tensor exposed (``reference``: the FP32 model's, :class:`ModelChain`); on ``samples`` each
    (FP32, converted) pair is folded there into running error sums as soon as both are out
    (:func:`amp_compiler.runtime.child.compare_chains`): only the sums and the graph outputs cross to
    this process, and the runner holds a piece's tensors, not every tensor of both models. The
    converted model is emulated and loaded once for both sets."""
    runnable = emulate(converted)  # exact FP16/BF16 storage, whatever the CPU kernels do
    intermediates = ModelChain(runnable, runner, (samples or held)[0] if samples or held else {})
    try:
        # each FP32 tensor against what the converted model stores for it (its rounded copy, if any)
        stored = {name: name for name in intermediates.names}
        stored.update({origin: name for name in intermediates.names if (origin := rounded_origin(name)) is not None})
        pairs = [(name, stored[name]) for name in reference.names if name in stored]
        outputs = [(o.name, stored[o.name]) for o in fp32.graph.output if o.name in stored]
        key = id(intermediates)
        found: list[OutputErrors | None] = [None, None]  # on samples, on held
        graph_outputs: list[str] = []
        for k, sample in [(0, s) for s in samples] + [(1, s) for s in held]:
            reference.runs += 1
            intermediates.runs += 1
            # on held-out samples no pair is folded: node errors are the calibration samples'
            ref, got = runner.compare(reference.sessions, intermediates.sessions, sample,
                                      pairs if k == 0 else [], outputs, key)
            floats = [j for j, r in enumerate(ref) if np.issubdtype(r.dtype, np.floating)]
            graph_outputs = [outputs[j][0] for j in floats]
            at_outputs = found[k] = found[k] or OutputErrors(len(graph_outputs), metric, graph_outputs)
            at_outputs.add([np.asarray(ref[j], dtype=np.float64) for j in floats],
                           [np.asarray(got[j], dtype=np.float64) for j in floats])
            del ref, got
        accs = {name: _error_stats(sums) for name, sums in runner.errors(key).items()}
    finally:
        intermediates.close()
    rel = {name: acc.rel_l2 for name, acc in accs.items()}
    errors: dict[int, NodeError] = {}
    for i, node in enumerate(fp32.graph.node):
        out = next((o for o in node.output if o in accs), None)
        if out is None:
            continue
        worst_in = max((rel.get(x, 0.0) for x in node.input if x), default=0.0)
        errors[i] = NodeError(rel_l2=rel[out], max_abs=accs[out].max_abs, added=rel[out] - worst_in)
    errs = [dict(zip(graph_outputs, f.relative(), strict=True)) if f is not None else {} for f in found]
    return errors, errs[0], errs[1], intermediates.runs


def _error_stats(sums: list[float]) -> ErrorStats:
    """:class:`ErrorStats` from the runner's sums (:data:`amp_compiler.runtime.child_folds.ERROR_FIELDS`)."""
    diff2, ref2, got2, dot, max_abs, ref_min, ref_max, nonfinite, unmatched, count = sums
    return ErrorStats(diff2, ref2, got2, dot, max_abs, ref_min, ref_max, nonfinite=int(nonfinite),
                      unmatched=int(unmatched), count=int(count))


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
    opts = options or ConvertOptions()
    # Its units choose between the low type and FP32: BF16 or scaled range fallbacks are no level it
    # measures, so it converts them FP32 (the default here) and refuses them when asked for.
    if opts.range_fallback in ("scaled", "bf16"):
        raise OptionError(f"{opts.range_fallback} is not combined with --tolerance: its units choose between "
                          "the low type and FP32 (give fp32, or leave it out)", option="range_fallback")
    opts = dataclasses.replace(opts, range_fallback="fp32")
    # as each conversion splits them: positions refer to the split model
    fused = split_fused_ops(fp32, kept=opts.block_ops)
    fp32 = fused.model
    if opts.target is Target.FP8:  # positions and measurements refer to the model at the FP8 opset
        fp32 = raise_opset(fp32, fp8_opset(opts.low_target))
    elif opts.target is Target.BF16:  # ... and at the opset its conversions raise it to (Conv's bfloat16)
        fp32 = for_bf16(fp32, opts.provider).model
    runner, owned = default_runner(runner)
    try:
        refiner = _Refiner(fp32, samples, tolerance, opts, ranges, policy, runner)
        try:
            refinement = refiner.run()
            refinement.result.fused_split = fused.note
            return refinement
        finally:
            refiner.fp32_runner.close()
    finally:
        if owned:
            runner.close()


@dataclasses.dataclass
class _Chosen:
    """What the choice gave: the conversion, its measurement, what it fixed, why nothing stays low, the shares."""

    result: ConversionResult
    errors: dict[int, NodeError]
    outputs: dict[str, float]
    held: dict[str, float]
    decided: Decided
    why: str | None
    shares: dict[str, float]


class _Refiner:
    def __init__(self, fp32: onnx.ModelProto, samples: list[dict[str, np.ndarray]], tolerance: float,
                 opts: ConvertOptions, ranges: dict[str, TensorRange] | None, policy: PolicyTable | None,
                 runner: Runner):
        self.fp32, self.samples, self.tolerance, self.opts = fp32, samples, tolerance, opts
        self.fit, self.held = hold_out(samples, opts.holdout)
        self.policy, self.runner = policy, runner
        self.fp8 = opts.target is Target.FP8
        if self.fp8 and ranges is None:
            ranges = collect_ranges(fp32, samples, runner=runner)  # once, not per conversion
        self.ranges = ranges
        self.fp32_runner = ModelChain(fp32, runner, samples[0])  # loaded once, for every conversion's measure
        self.history: list[tuple[int, float]] = []
        self.runs = 0

    def convert(self, decided: Decided | None = None):
        """A conversion with ``decided`` fixed, and its measurement: (result, node errors, output
        errors on the calibration samples, output errors on the held-out ones)."""
        decided = decided or Decided()
        opts = dataclasses.replace(self.opts, pinned_nodes=tuple(decided.pinned), kept_nodes=tuple(decided.kept))
        if self.fp8:
            opts = dataclasses.replace(opts, fp8_nodes=tuple(decided.fp8))
        result = convert(self.fp32, opts, policy=self.policy, ranges=self.ranges,
                         samples=self.samples if self.fp8 else None, runner=self.runner if self.fp8 else None)
        metric = self.opts.metric
        errors, outputs, held, n = _measure_both(self.fp32, result.model, self.fit, self.held, self.fp32_runner,
                                                 self.runner, metric)
        self.runs += n
        self.history.append((len(decided.pinned), max([*outputs.values(), *held.values()], default=0.0)))
        return result, errors, outputs, held

    def within(self, outputs: dict[str, float], held: dict[str, float]) -> bool:
        """Whether every output is within the tolerance on both sample sets."""
        return max([*outputs.values(), *held.values()], default=0.0) <= self.tolerance

    def done(self, result, errors, outputs, held, pinned, **extra) -> Refinement:
        return Refinement(result, len(self.history), self.runs, self.fp32_runner.runs, pinned, errors, outputs,
                          self.history, self.within(outputs, held), fp32=self.fp32, held_out_errors=held,
                          held_out=len(self.held), metric=metric_name(self.opts.metric), **extra)

    def run(self) -> Refinement:
        low = self.opts.low_target
        if self.fp8:  # the units and the probe come from the fallback conversion
            plain = convert(self.fp32, dataclasses.replace(self.opts, target=low, fallback=None),
                            policy=self.policy, ranges=self.ranges)
        else:
            plain, errors, outputs, held = self.convert()
            if self.within(outputs, held):
                return self.done(plain, errors, outputs, held, [])
        units = self.units(plain)
        # Switch groups: a Tensor Core unit's root, and its followers; a cheap unit whole; FP8 switches.
        groups: list[tuple[int, ...]] = []
        parts: list[tuple[int, ...]] = []  # per unit: its groups, the root's first
        for unit in units:
            whole = not unit.tensor_core_flops or len(unit.nodes) == 1
            split = (unit.nodes,) if whole else (unit.nodes[:1], unit.nodes[1:])
            parts.append(tuple(range(len(groups), len(groups) + len(split))))
            groups += split
        candidates = self.fp8_candidates(units) if self.fp8 else {}
        fp8_group = {root: len(groups) + k for k, root in enumerate(sorted(candidates))}
        probe_model = build_probe(self.fp32, plain.model, plain.decisions, groups, fp8=candidates,
                                  fp8_switches=fp8_group)
        probe = SwitchProbe(self.fp32, probe_model, len(groups) + len(fp8_group), self.fit, self.runner,
                            held=self.held, metric=self.opts.metric)
        try:
            room = math.sqrt(max(self.tolerance ** 2 - probe.base ** 2, 0.0))
            if room > 0 or not units:
                chosen = self.choose(probe, units, parts, fp8_group, room)
            else:  # what no unit controls is beyond the tolerance already
                chosen = self.fp32_only(probe, units, _forced_low(plain, low.value))
        finally:
            self.runs += probe.runs
            probe.close()
        why = chosen.why if units else self.nothing_to_pin(plain)
        return self.done(chosen.result, chosen.errors, chosen.outputs, chosen.held, chosen.decided.pinned,
                         units=len(units), why_fp32=why, **chosen.shares)

    def nothing_to_pin(self, plain: ConversionResult) -> str | None:
        """Why the tolerance found no unit to pin, when the conversion's low-precision nodes all lie inside
        subgraphs (an Optimum merged decoder computes everything inside an If): units are the main
        graph's, and the tolerance cannot act there; None when there is no low-precision node at all."""
        low = self.opts.low_target.value
        inside = sum(1 for d in plain.decisions if d.graph != "main" and d.precision == low)
        if not inside:
            return None
        return (f"--tolerance pins nodes of the main graph only, and this model's {inside} {low} node(s) all lie "
                "inside If/Loop/Scan bodies: keep them FP32 with --block-node REGEX or --block-op OP")

    def choose(self, probe: SwitchProbe, units: list[Unit], parts: list[tuple[int, ...]], fp8_group: dict[int, int],
               room: float) -> _Chosen:
        """Each unit's levels measured alone, the set chosen on the probe, converted and measured."""
        low = self.opts.low_target
        items = [unit_choices(self.alone(probe, room), unit, part, fp8_group.get(unit.root), low, room,
                              self.opts.fp32_products) for unit, part in zip(units, parts, strict=True)]

        def error(picks: tuple[int, ...]) -> float:
            return probe.error(switches_on(items, picks), above=self.tolerance)

        def held_error(picks: tuple[int, ...]) -> float:
            return probe.held_error(switches_on(items, picks), above=self.tolerance)

        choice = VerifiedChoice([[c.option for c in item] for item in items], error, self.tolerance, probe.base,
                                held=held_error if self.held else None, held_base=probe.held_base)
        found = choice.choose(room)
        converted: set[tuple[int, ...]] = set()
        while True:
            picks = list(found.picks)
            decided = decide(self.fp32.graph, units, items, picks, self.tolerance, low)
            result, errors, outputs, held = self.convert(decided)
            converted.add(found.picks)
            if self.within(outputs, held) or not any(picks) or len(converted) > _CONVERSION_RETRIES:
                break
            found = choice.choose(room, found.budget)  # the conversion missed what the probe measured
            if found.picks in converted:
                break  # the same choice below that budget: the same conversion
        why = None if any(picks) or not units else self.why_fp32(probe, units, items, room)
        return _Chosen(result, errors, outputs, held, decided, why, _shares(units, items, picks, room))

    def fp32_only(self, probe: SwitchProbe, units: list[Unit], forced: Sequence[str] = ()) -> _Chosen:
        """Every unit pinned, unmeasured: with every switch off the probe already misses the tolerance
        (what no unit controls), and a unit switched on is assumed to add to that, never to cancel it.
        ``forced``: the nodes the user forced low (``--allow-op``/``--allow-node``), which no unit switches:
        the first thing the message names."""
        decided = decide_fp32(units, self.tolerance, probe.base, self.opts.low_target)
        result, errors, outputs, held = self.convert(decided)
        moved = probe.errors(())
        output = max(moved, key=lambda name: moved[name])
        what = "relative L2" if self.opts.metric is Metric.REL_L2 else metric_name(self.opts.metric)
        why = (f"no unit can stay {self.opts.low_target.value} within --tolerance {self.tolerance:g}: with every unit "
               f"in FP32 the probe already moves output '{output}' by {moved[output]:.3g} ({what}), what no unit "
               f"controls ({_forced_text(forced)}FP32's own rounding in a graph fused otherwise, roundings inside "
               f"subgraphs, tables stored low); inputs unlike the model's real ones (e.g. noise) can cause this")
        shares = {"low_flops_share": 0.0, "fp8_flops_share": 0.0, "ceiling": 0.0}
        return _Chosen(result, errors, outputs, held, decided, why, shares)

    def why_fp32(self, probe: SwitchProbe, units: list[Unit], items: list[list[Choice]], room: float) -> str:
        """One line: no unit stays low, the output the unit that moves the outputs least moves most,
        and by how much, on its own."""
        best = min(range(len(units)), key=lambda i: min(c.option.error for c in items[i][1:]))
        level = min(items[best][1:], key=lambda c: c.option.error)
        moved = probe.errors(level.groups)
        output = max(moved, key=lambda name: moved[name])
        node = self.fp32.graph.node[units[best].root]
        name = f"{node.op_type} '{node.name}'" if node.name else node.op_type
        what = "relative L2" if self.opts.metric is Metric.REL_L2 else metric_name(self.opts.metric)
        below = f" beyond what no unit controls ({probe.base:.3g})" if probe.base > 0 else ""
        return (
            f"no unit can stay {self.opts.low_target.value} within --tolerance {self.tolerance:g}: the one that moves "
            f"the outputs least, {name}, alone moves output '{output}' by {moved[output]:.3g} ({what}){below}; "
            f"inputs unlike the model's real ones (e.g. noise) can cause this"
        )

    @staticmethod
    def alone(probe: SwitchProbe, room: float):
        """What groups switched on alone add at the outputs, beyond what no group controls (squares
        add: see :mod:`amp_compiler.core.knapsack`); beyond ``room`` at least (a lower bound: the
        runs stop once it is proven)."""
        above = math.sqrt(room ** 2 + probe.base ** 2)

        def error(on: frozenset[int]) -> float:
            e = probe.error(on, above=above)
            return math.sqrt(max(e * e - probe.base ** 2, 0.0)) if math.isfinite(e) else math.inf
        return error

    def units(self, result: ConversionResult) -> list[Unit]:
        """The units of the conversion's low-precision nodes (main graph)."""
        table = self.policy or default_table()
        nodes = list(self.fp32.graph.node)
        low_name = self.opts.low_target.value
        low = {d.index for d in result.decisions
               if d.index is not None and d.index < len(nodes) and d.precision == low_name
               and d.rule not in _NOT_COMPUTE}
        shapes = {k: v.shape for k, v in self.samples[0].items()}
        flops = [c.flops for c in estimate(self.fp32, shapes, table).nodes[: len(nodes)]]
        tensor_core = [table.is_tensor_core(n.domain, n.op_type) for n in nodes]
        return partition(self.fp32.graph, low, tensor_core, flops)

    def fp8_candidates(self, units: list[Unit]) -> dict[int, Fp8Candidate]:
        """The units' Tensor Core roots whose local statistics allow FP8 inputs, by position."""
        ir_model = ir.from_proto(onnx.shape_inference.infer_shapes(self.fp32))
        passed, _ = local_choice(ir_model, self.fp32, self.samples, dict(self.ranges or {}), self.opts,
                                 self.runner, {})
        position = {id(node): i for i, node in enumerate(ir_model.graph)}
        roots = {u.root for u in units if u.tensor_core_flops}
        return {position[id(c.node)]: c for c in passed if position.get(id(c.node)) in roots}


def _forced_low(result: ConversionResult, low: str) -> list[str]:
    """The main-graph nodes the user forced low (rule ``user.allow``), by name or op."""
    return [d.node or d.op_type for d in result.decisions
            if d.graph == "main" and d.precision == low and d.rule == Rule.USER_ALLOW.value]


def _forced_text(forced: Sequence[str]) -> str:
    """``forced`` as the first thing no unit controls: 'the nodes --allow-op/--allow-node forced low (...), '."""
    if not forced:
        return ""
    names = ", ".join(forced[:3]) + (f" and {len(forced) - 3} more" if len(forced) > 3 else "")
    return f"the node(s) --allow-op/--allow-node forced low ({names}), "


def _shares(units: list[Unit], items: list[list[Choice]], picks: list[int], room: float) -> dict[str, float]:
    """The shares of the units' Tensor Core FLOPs in low precision, in FP8, and in units that could be
    low at all (whose cheapest low level alone fits)."""
    total = sum(u.tensor_core_flops for u in units) or 1
    levels = [item[k].level for item, k in zip(items, picks, strict=True)]
    low = sum(u.tensor_core_flops for u, level in zip(units, levels, strict=True) if level is not Level.FP32)
    fp8 = sum(u.tensor_core_flops for u, level in zip(units, levels, strict=True) if level.fp8)
    can = sum(u.tensor_core_flops for u, item in zip(units, items, strict=True)
              if min(c.option.error for c in item[1:]) <= room)
    return {"low_flops_share": low / total, "fp8_flops_share": fp8 / total, "ceiling": can / total}
