"""The FP8 budget (ONNX): the error each GEMM in FP8 adds at the model's outputs, and the FP8 set with
the most FLOPs within the error budget, verified by measurement.

Guarantees: :func:`within_budget` runs one switched probe (:mod:`amp_compiler.onnx.measure.probe`: the
FP32 model with an FP8 switch per candidate GEMM) over the samples: once with every switch off (the
reference), once per candidate with its switch alone on, then for the sets the verified choice
(:func:`amp_compiler.core.fp8_choice.choose_within_budget`) measures. The samples are split
(:func:`amp_compiler.core.choice.hold_out`, ``holdout``): the choice is made on the calibration part
and its set measured on the held-out part, tightened when it misses the budget there. The error of a
run is the worst output error under ``metric`` (relative L2 by default) over the float outputs,
against the all-off run; the chosen set's is within the budget on both parts. A candidate under
:data:`~amp_compiler.core.fp8_choice.LEAST_FLOP_SHARE` of the model's Tensor Core FLOPs is left out first
(kept in the fallback type).
Every candidate's reason carries its numbers, built once from their parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from amp_compiler.core.choice import hold_out
from amp_compiler.core.fp8_choice import (
    LocalChoice,
    budget_reason,
    choose_within_budget,
    negligible_share,
)
from amp_compiler.core.tensor_error import ErrorMetric, Metric
from amp_compiler.onnx.costs.costs import estimate, iter_nodes
from amp_compiler.onnx.measure.probe import SwitchProbe, build_probe
from amp_compiler.passes.onnx.qdq import Fp8Candidate
from amp_compiler.policy import default_table
from amp_compiler.runtime.runner import Runner

__all__ = ["candidate_flops", "within_budget"]


def candidate_flops(model: onnx.ModelProto, candidates: Sequence[Fp8Candidate],
                    sample: dict[str, np.ndarray]) -> tuple[list[int], int]:
    """Estimated FLOPs of each candidate at the sample's input shapes (at least 1), and of every Tensor
    Core op of the model's main graph together."""
    shapes = {k: tuple(v.shape) for k, v in sample.items()}
    costs = estimate(model, shapes)
    table = default_table()
    by_output = {n.output[0]: c.flops for n, c in zip(iter_nodes(model), costs.nodes, strict=False) if n.output}
    total = sum(c.flops for n, c in zip(iter_nodes(model), costs.nodes, strict=False)
                if table.is_tensor_core(n.domain or "ai.onnx", n.op_type))
    return [max(int(by_output.get(c.node.outputs[0].name, 0)), 1) for c in candidates], int(total)


def within_budget(
    model: onnx.ModelProto, passed: Sequence[Fp8Candidate], local: Mapping[int, LocalChoice],
    samples: Sequence[dict[str, np.ndarray]], runner: Runner, budget: float, *,
    metric: ErrorMetric = Metric.REL_L2, holdout: float = 0.0,
) -> tuple[list[Fp8Candidate], dict[int, str]]:
    """Of the candidates that passed their local statistics (``local``: their choices by ``id`` of
    the node), those in FP8 (see module doc) and every one's reason (by ``id`` of its node).
    ``model``: the FP32 model they come from; ``holdout``: the share of ``samples`` held out."""
    if not passed:
        return [], {}
    flops, total = candidate_flops(model, passed, samples[0])
    why = [negligible_share(f, total, local[id(c.node)].low) for f, c in zip(flops, passed, strict=True)]
    small = {k for k, reason in enumerate(why) if reason}
    dropped = {id(passed[k].node): why[k] for k in small}
    flops = [f for k, f in enumerate(flops) if k not in small]
    passed = [c for k, c in enumerate(passed) if k not in small]
    if not passed:
        return [], dropped
    position = {node.output[0]: i for i, node in enumerate(model.graph.node) if node.output}
    at = {position[c.node.outputs[0].name]: c for c in passed}
    switch = {p: k for k, p in enumerate(position[c.node.outputs[0].name] for c in passed)}
    fit, held = hold_out(samples, holdout)
    probe = SwitchProbe(None, build_probe(model, fp8=at, fp8_switches=switch), len(passed), fit, runner,
                        held=held, metric=metric)
    try:
        singles = [probe.error({k}) for k in range(len(passed))]
        found = choose_within_budget(probe.error, singles, flops, budget, probe.base,
                                     held=probe.held_error if held else None)
    finally:
        probe.close()
    reasons = {id(c.node): budget_reason(local[id(c.node)], singles[k], flops[k], budget, found, k in found.chosen,
                                         metric)
               for k, c in enumerate(passed)} | dropped
    chosen = found.chosen
    return [c for k, c in enumerate(passed) if k in chosen], reasons
