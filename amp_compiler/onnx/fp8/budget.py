"""FP8 end to end: the error each GEMM in FP8 adds at the model's outputs, and the FP8 set that fits
an error budget with the most FP8 FLOPs.

Why: a GEMM's own output error with FP8 inputs is about the same 2-5% everywhere (3 mantissa bits);
what differs is how much of it reaches the outputs (a classifier or an LM head next to the output,
a CNN's stem). The fp8-research measurements (benchmarks/notes_fp8.md, section 5) show that the
single-GEMM end-to-end error on calibration data predicts held-out data (rank correlation 0.97-0.99)
and that errors add in quadrature.

Guarantees:
- :func:`end_to_end_errors` runs one probe model (the FP32 model with each candidate's data inputs
  switched between FP32 and their FP8 values by a bool input per candidate, ``Where``) over the
  samples: once with every switch off, once per candidate with its switch alone on, and (for
  :func:`verified_error`) with a set's switches on. The error of a run is the worst relative L2 over
  the float outputs, against the all-off run.
- :func:`choose_within_budget` returns the set with the most FLOPs whose predicted error (the
  quadrature sum of single errors) is within the budget: an exact 0/1 knapsack over errors^2 rounded
  up to 1/1000 of the budget^2 (never over the budget as predicted).
- :func:`grow_within_budget` adds to a set that fits the budget, one at a time, the GEMMs left out whose
  measured total with the set still fits: errors of different GEMMs partly cancel, so the quadrature
  prediction can leave budget unused (resnet50-small: 9.4% used of 10%, and its classifier, predicted
  at 10.15%, measures 9.96%). It tries at most :data:`GROW_TRIES` of them (one run over the samples
  each), those whose predicted total is within :data:`GROW_REACH` times the budget, the most FLOPs
  per error^2 first; the total never exceeds the budget as measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx.helper as oh

from amp_compiler.core.knapsack import Option, choose
from amp_compiler.core.tensor_error import OutputErrors
from amp_compiler.onnx.costs.costs import estimate, iter_nodes
from amp_compiler.onnx.fp8.stats import fp8_view
from amp_compiler.passes.onnx.qdq import Fp8Candidate
from amp_compiler.runtime.runner import Runner

_STEPS = 1000  # knapsack resolution: budget^2 in this many units
GROW_TRIES = 8  # end-to-end runs spent trying GEMMs the prediction left out
GROW_REACH = 1.25  # ... whose predicted total with the set is at most this many times the budget


def _switch(k: int) -> str:
    return f"fp8e2e_on{k}"


def _probe(model: onnx.ModelProto, candidates: Sequence[Fp8Candidate]) -> onnx.ModelProto:
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    graph = probe.graph
    by_output = {c.node.outputs[0].name: k for k, c in enumerate(candidates)}
    new_nodes = []
    for node in graph.node:
        k = by_output.get(node.output[0]) if node.output else None
        if k is not None:
            cand = candidates[k]
            for inp in cand.inputs:
                view = fp8_view(inp, f"fp8e2e{k}_{inp.index}_")
                new_nodes += view.nodes
                graph.initializer.extend(view.initializers)
                chosen = f"fp8e2e{k}_{inp.index}_in"
                new_nodes.append(oh.make_node("Where", [_switch(k), view.fp8, inp.name], [chosen]))
                node.input[inp.index] = chosen
        new_nodes.append(node)
    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.input.extend(oh.make_tensor_value_info(_switch(k), onnx.TensorProto.BOOL, []) for k in range(len(candidates)))
    return probe


class EndToEnd:
    """A loaded probe (see module doc); :meth:`error` measures a set of switched-on candidates."""

    def __init__(self, model: onnx.ModelProto, candidates: Sequence[Fp8Candidate],
                 samples: Sequence[dict[str, np.ndarray]], runner: Runner):
        self.n, self.samples = len(candidates), list(samples)
        self.floats = [i for i, o in enumerate(model.graph.output)
                       if o.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
        self.session = runner.load(_probe(model, candidates))
        self.reference = [self._run(sample, frozenset()) for sample in self.samples]
        self.runs = len(self.samples)

    def _run(self, sample: dict[str, np.ndarray], on: frozenset[int]) -> list[np.ndarray]:
        feeds = {k: v for k, v in sample.items() if k in self.session.input_names}
        feeds.update({_switch(k): np.array(k in on) for k in range(self.n)})
        outs = self.session.run(feeds)
        return [np.asarray(outs[i], dtype=np.float64) for i in self.floats]

    def error(self, on: frozenset[int]) -> float:
        """Worst relative L2 over the float outputs with the candidates ``on`` in FP8, on the samples."""
        found = OutputErrors(len(self.floats))
        for sample, ref in zip(self.samples, self.reference, strict=True):
            self.runs += 1
            if not found.add(ref, self._run(sample, on)):
                return math.inf
        return found.worst()

    def close(self) -> None:
        self.session.close()


def candidate_flops(model: onnx.ModelProto, candidates: Sequence[Fp8Candidate],
                    sample: dict[str, np.ndarray]) -> list[int]:
    """Estimated FLOPs of each candidate at the sample's input shapes (at least 1)."""
    shapes = {k: tuple(v.shape) for k, v in sample.items()}
    costs = estimate(model, shapes)
    by_output = {n.output[0]: c.flops for n, c in zip(iter_nodes(model), costs.nodes, strict=False) if n.output}
    return [max(int(by_output.get(c.node.outputs[0].name, 0)), 1) for c in candidates]


def choose_within_budget(errors: Sequence[float], flops: Sequence[int], budget: float) -> frozenset[int]:
    """The indices with the most total FLOPs whose quadrature sum of ``errors`` is within ``budget``
    (see module doc): :func:`amp_compiler.core.knapsack.choose` with two options per GEMM; candidates with a
    non-finite error are never chosen."""
    picks = choose([[Option(0.0, 0), Option(e, f)] for e, f in zip(errors, flops, strict=True)], budget, steps=_STEPS)
    return frozenset(k for k, pick in enumerate(picks) if pick)


def choose_verified(
    error: Callable[[frozenset[int]], float], singles: Sequence[float], flops: Sequence[int], budget: float
) -> tuple[frozenset[int], float]:
    """:func:`choose_within_budget`, then the chosen set measured as a whole (``error``) and shrunk,
    the most error per FLOP first, until it fits, then grown by the candidates left out whose
    measured total still fits (:func:`grow_within_budget`); the set and its measured error."""
    chosen = set(choose_within_budget(singles, flops, budget))
    total = error(frozenset(chosen)) if chosen else 0.0
    while chosen and total > budget:  # the prediction missed: drop the most error per FLOP
        chosen.discard(max(chosen, key=lambda k: singles[k] ** 2 / flops[k]))
        total = error(frozenset(chosen)) if chosen else 0.0
    total = grow_within_budget(error, chosen, total, singles, flops, budget)  # or the other way
    return frozenset(chosen), total


def grow_within_budget(error: Callable[[frozenset[int]], float], chosen: set[int], total: float,
                       errors: Sequence[float], flops: Sequence[int], budget: float) -> float:
    """Add to ``chosen`` (whose measured error is ``total``, within ``budget``) the candidates whose
    measured total still fits (see module doc); returns the new total."""
    rest = sorted((k for k in range(len(errors)) if k not in chosen and math.isfinite(errors[k])),
                  key=lambda k: errors[k] ** 2 / flops[k])
    tries = 0
    for k in rest:
        if tries == GROW_TRIES:
            break
        if math.hypot(total, errors[k]) > GROW_REACH * budget:
            continue
        tries += 1
        trial = error(frozenset(chosen | {k}))
        if trial <= budget:
            chosen.add(k)
            total = trial
    return total


def budget_reason(local: str, statistics: str, single: float, flops: int, budget: float, total: float,
                  chosen: bool, low: str = "FP16") -> str:
    """Why a GEMM whose local statistics passed is in FP8 or not, with its end-to-end numbers:
    ``local`` is the sentence of its local choice, ``statistics`` that sentence's statistics part,
    ``low`` the fallback's name."""
    alone = f"alone in FP8 it moves the model's outputs by {single:.2%} (relative L2 vs FP32, worst output)"
    if chosen:
        return f"{local}; {alone}, all FP8 GEMMs together {total:.2%} (budget {budget:.0%})"
    return (
        f"kept {low}: {alone}, too much for its {flops:.3g} FLOPs within the FP8 error budget "
        f"{budget:.0%} (the FP8 GEMMs together: {total:.2%}); its own statistics: {statistics}"
    )
