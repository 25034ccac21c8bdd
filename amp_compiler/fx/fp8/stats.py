"""The FX path's per-layer FP8 choice: the ONNX path's statistics, measured by running the FP32 graph.

The same three steps as :mod:`amp_compiler.onnx.fp8.steps` (see docs/fp8.md), on the calibration
samples, with a ``torch.fx.Interpreter`` over the FP32 graph instead of onnxruntime probes:

1. scales: the amax of every activation operand (one run per sample);
2. local statistics per candidate (one run per sample): relative L2 of its output with FP8 inputs
   against FP16 inputs, and the share of nonzero scaled activation values below 2^-6; a candidate
   goes on if both are within their limits (:class:`amp_compiler.core.fp8_choice.LocalChoice`);
3. end to end: each remaining candidate alone in FP8, the rest of the graph FP32, measured at the
   model's float outputs (worst relative L2 against FP32, :class:`amp_compiler.core.tensor_error.OutputErrors`);
   the set with the most FLOPs within the budget, verified by measurement
   (:func:`amp_compiler.core.fp8_choice.choose_within_budget`, the ONNX path's and ``--tolerance``'s loop).

Guarantees: every candidate gets a reason (statistics and, past step 2, end-to-end numbers); the
chosen set's measured error is within the budget; the graph is not modified.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from amp_compiler.core.choice import hold_out
from amp_compiler.core.fp8_choice import Fp8Stats, LocalChoice, budget_reason, choose_within_budget, negligible_share
from amp_compiler.core.fp8_numbers import Fp8Format
from amp_compiler.core.tensor_error import ErrorMetric, Metric, OutputErrors
from amp_compiler.fx.fp8.candidates import FALLBACK, Candidate, argument_values
from amp_compiler.options import ConvertOptions

__all__ = ["EndToEnd", "Fp8Choice", "calibrate", "choose", "local_stats"]

Action = Callable[[Candidate, tuple, dict], Any]


class _Probe(fx.Interpreter):
    """Runs the graph; at a candidate, ``action(candidate, args, kwargs)`` gives the node's value."""

    def __init__(self, gm: fx.GraphModule, candidates: Sequence[Candidate], action: Action):
        super().__init__(gm)
        self.by_node = {c.node: c for c in candidates}
        self.action = action

    def run_node(self, n: fx.Node) -> Any:
        cand = self.by_node.get(n)
        if cand is None:
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        return self.action(cand, args, kwargs)


def _run(gm: fx.GraphModule, candidates: Sequence[Candidate], action: Action, sample: tuple) -> list[torch.Tensor]:
    with torch.no_grad():
        out = _Probe(gm, candidates, action).run(*sample)
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _plain(cand: Candidate, args: tuple, kwargs: dict) -> Any:
    return cast(Callable[..., Any], cand.node.target)(*args, **kwargs)


def calibrate(gm: fx.GraphModule, candidates: Sequence[Candidate], samples: Sequence[tuple], margin: int) -> None:
    """Set every activation operand's scale from its amax over ``samples`` (FP32 values)."""
    amax: dict[tuple[int, int], float] = {}

    def record(cand: Candidate, args: tuple, kwargs: dict) -> Any:
        values = argument_values(cand.node, args, kwargs)
        for op in cand.activations:
            key = (id(cand), op.position)
            amax[key] = max(amax.get(key, 0.0), float(values[op.arg].detach().abs().max()))
        return _plain(cand, args, kwargs)

    for sample in samples:
        _run(gm, candidates, record, sample)
    for cand in candidates:
        for op in cand.activations:
            op.calibrate(amax.get((id(cand), op.position), 0.0), margin)


def local_stats(gm: fx.GraphModule, candidates: Sequence[Candidate], samples: Sequence[tuple]) -> list[Fp8Stats]:
    """Per candidate (all calibrated), its :class:`Fp8Stats` over ``samples``."""
    sums = {id(c): [0.0, 0.0, 0, 0] for c in candidates}  # err^2, ref^2, below 2^-6, nonzero
    normal = Fp8Format.E4M3.smallest_normal

    def measure(cand: Candidate, args: tuple, kwargs: dict) -> Any:
        values = argument_values(cand.node, args, kwargs)
        y8 = cand.fp8_output(values).double()
        y16 = cand.fp16_output(args, kwargs).double()
        s = sums[id(cand)]
        s[0] += float(((y8 - y16) ** 2).sum())
        s[1] += float((y16**2).sum())
        for op in cand.activations:
            scaled = (values[op.arg].to(FALLBACK).to(torch.float32) / op.scale).abs()
            s[2] += int(((scaled < normal) & (scaled > 0)).sum())
            s[3] += int((scaled > 0).sum())
        return _plain(cand, args, kwargs)

    for sample in samples:
        _run(gm, candidates, measure, sample)
    return [Fp8Stats.from_sums(*sums[id(cand)]) for cand in candidates]


def _numpy(outputs: Sequence[torch.Tensor]) -> list[np.ndarray]:
    return [t.detach().to(device="cpu", dtype=torch.float64).numpy() for t in outputs]


class EndToEnd:
    """The FP32 graph with a set of candidates in FP8: its outputs' worst relative L2 against FP32."""

    def __init__(self, gm: fx.GraphModule, candidates: Sequence[Candidate], samples: Sequence[tuple],
                 metric: ErrorMetric = Metric.REL_L2):
        self.gm, self.candidates, self.samples, self.metric = gm, list(candidates), list(samples), metric
        self.reference = [_numpy(_run(gm, [], _plain, s)) for s in self.samples]
        self.runs = len(self.samples)

    def error(self, on: frozenset[int]) -> float:
        """The worst relative L2 with the candidates ``on`` in FP8 (infinite as soon as an output is
        not finite where FP32's is)."""
        chosen = [self.candidates[k] for k in sorted(on)]

        def fp8(cand: Candidate, args: tuple, kwargs: dict) -> Any:
            return cand.fp8_output(argument_values(cand.node, args, kwargs))

        found = OutputErrors(len(self.reference[0]) if self.reference else 0, self.metric)
        for sample, reference in zip(self.samples, self.reference, strict=True):
            self.runs += 1
            if not found.add(reference, _numpy(_run(self.gm, chosen, fp8, sample))):
                break
        return found.worst()


@dataclasses.dataclass
class Fp8Choice:
    """The candidates, the chosen ones, why each is in FP8 or not, and the model runs it took."""

    candidates: list[Candidate]
    chosen: list[Candidate]
    reasons: dict[fx.Node, str]
    runs: int = 0
    total_error: float = 0.0


def _local_choice(cand: Candidate, stats: Fp8Stats, opts: ConvertOptions) -> LocalChoice:
    """A candidate's choice by its local statistics, with how its operands are scaled."""
    return LocalChoice(stats, opts.fp8_max_error, opts.fp8_max_subnormal, tuple(op.describe() for op in cand.operands))


def choose(
    gm: fx.GraphModule, candidates: list[Candidate], samples: Sequence[tuple], opts: ConvertOptions,
    tensor_core_flops: int = 0,
) -> Fp8Choice:
    """Calibrate, measure and choose (see module doc); ``gm`` is the FP32 graph, ``tensor_core_flops`` its
    Tensor Core ops' FLOPs (a candidate under :data:`~amp_compiler.core.fp8_choice.LEAST_FLOP_SHARE` of them
    stays in the fallback: :func:`~amp_compiler.core.fp8_choice.negligible_share`; 0: none is left out)."""
    calibrate(gm, candidates, samples, opts.fp8_margin)
    reasons: dict[fx.Node, str] = {}
    passed: list[tuple[Candidate, LocalChoice]] = []
    for cand, stats in zip(candidates, local_stats(gm, candidates, samples), strict=True):
        local = _local_choice(cand, stats, opts)
        negligible = negligible_share(max(cand.flops, 1), tensor_core_flops, local.low) if local.allowed else ""
        reasons[cand.node] = negligible or local.reason
        if local.allowed and not negligible:
            passed.append((cand, local))
    runs = 2 * len(samples)
    if not passed:
        return Fp8Choice(candidates, [], reasons, runs)
    fit, held = hold_out(samples, opts.holdout)
    e2e = EndToEnd(gm, [c for c, _ in passed], fit, opts.metric)
    check = EndToEnd(gm, [c for c, _ in passed], held, opts.metric) if held else None
    singles = [e2e.error(frozenset({k})) for k in range(len(passed))]
    flops = [max(c.flops, 1) for c, _ in passed]
    found = choose_within_budget(e2e.error, singles, flops, opts.fp8_budget,
                                 held=check.error if check is not None else None)
    for k, (cand, local) in enumerate(passed):
        reasons[cand.node] = budget_reason(local, singles[k], flops[k], opts.fp8_budget, found, k in found.chosen,
                                           opts.metric)
    runs += e2e.runs + (check.runs if check is not None else 0)
    return Fp8Choice(candidates, [passed[k][0] for k in sorted(found.chosen)], reasons, runs, found.error)
