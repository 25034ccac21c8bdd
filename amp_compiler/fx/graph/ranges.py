"""Observed activation ranges of an FX graph: the FP32 graph run on the example inputs or calibration samples.

The FX counterpart of the ONNX path's range probe and ``--calibration-data``
(:mod:`amp_compiler.onnx.measure.range_probe`, :mod:`amp_compiler.onnx.measure.calibrate`): the captured
FP32 graph runs once per sample under a ``torch.fx.Interpreter``, and every float tensor a node makes
(graph inputs included, parameters and buffers not: :class:`~amp_compiler.passes.analysis.ConstantRangePass`
judges those from their values) is folded into running statistics as it comes
(:func:`amp_compiler.runtime.child_folds.fold_array`, the ONNX path's) and freed after its last use,
so memory holds one run's live tensors, not every intermediate. The statistics become the ONNX path's
:class:`~amp_compiler.core.measures.TensorRange` per node name (:func:`~amp_compiler.onnx.measure.
calibrate.ranges_of`), which the analysis reads as ``AnalysisSettings.ranges``: ranges from the example
inputs decide with the probe's rules (``probe.overflow``, ``probe.underflow``: one input the user gave
for its shapes, not data), ranges from calibration samples with calibration's
(``calibration.overflow``, ``calibration.underflow``).

Guarantees: the graph is not modified, and the parameters and buffers its forward writes (a step
counter, a cache) hold after the runs what they held before; a run that fails on the example inputs
gives no ranges and says why (:attr:`ObservedRanges.skipped`), as the ONNX path's probe does.
:func:`overflow_warnings` names every tensor the converted graph still holds in a low precision
whose observed values lie beyond that precision's range (the rules keep FP32 what they may; a
tensor whose dtype is fixed, an op that sets its own, is left as it is): the ONNX path's overflow
warnings, from observed values.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx as fx

from amp_compiler.core.graph import SlotKind
from amp_compiler.core.measures import TensorRange
from amp_compiler.core.plan import PrecisionPlan
from amp_compiler.fx.graph.precision_graph import FxPrecisionGraph
from amp_compiler.fx.graph.rewrite import written_state
from amp_compiler.fx.graph.views import FxSlot
from amp_compiler.onnx.measure.calibrate import ranges_of
from amp_compiler.passes.analysis.calibration import observed_magnitude
from amp_compiler.passes.analysis.constants import mask_paths
from amp_compiler.runtime import child_folds

__all__ = [
    "ObservedRanges", "calibration_ranges", "observe_ranges", "output_arrays", "overflow_warnings", "probe_ranges",
    "state_kept",
]


@dataclasses.dataclass(frozen=True)
class ObservedRanges:
    """The ranges the analysis reads, where they came from, and the FP32 runs they took.

    ``generated``: from the example inputs (the probe's rules), not calibration samples. ``seen``: the
    inputs named as reasons and the summary say it ("the example inputs", "3 calibration samples").
    ``skipped``: why no ranges were observed (empty when they were)."""

    ranges: dict[str, TensorRange]
    generated: bool
    seen: str
    runs: int = 0
    skipped: str = ""
    # each run's outputs (the graph's output leaves, in order, as numpy arrays): what the converted graph's
    # outputs are measured against (amp_compiler.fx.graph.accuracy), not kept in the report
    outputs: tuple[tuple[np.ndarray, ...], ...] = dataclasses.field(default=(), repr=False, compare=False)

    @classmethod
    def unchecked(cls, why: str) -> ObservedRanges:
        """No ranges, and why."""
        return cls({}, True, "", 0, why)


class _Folder(fx.Interpreter):
    """Runs the graph, folding each float tensor a node makes into ``stats`` by the node's name."""

    def __init__(self, gm: fx.GraphModule, stats: dict[str, list]):
        super().__init__(gm)  # values are freed after their last use (garbage_collect_values)
        self.stats = stats

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.op in ("placeholder", "call_function", "call_method", "call_module") and isinstance(
            value, torch.Tensor
        ) and value.is_floating_point() and value.device.type != "meta":
            array = value.detach().to(device="cpu", dtype=torch.float32).numpy()
            child_folds.fold_array(np, self.stats, n.name, array)
        return value


def output_arrays(gm: fx.GraphModule, value: Any) -> tuple[np.ndarray, ...]:
    """A run of ``gm``'s outputs (its output value: tensors in tuples, lists, dicts) as numpy arrays, one per
    node the output node holds, in order (:attr:`~amp_compiler.fx.graph.report.FxReport.output_names`: a
    constant the graph returns is no node, and is left out); a value that is no tensor (a size) is an object
    array (compared with nothing)."""
    def array(leaf: Any) -> np.ndarray:
        if not isinstance(leaf, torch.Tensor):
            return np.array(leaf, dtype=object)
        leaf = leaf.detach().to("cpu")
        return (leaf.float() if leaf.is_floating_point() else leaf).numpy()

    graph_leaves = torch.utils._pytree.tree_leaves(gm.graph.output_node().args[0])
    values = torch.utils._pytree.tree_leaves(value)
    return tuple(array(v) for g, v in zip(graph_leaves, values, strict=True) if isinstance(g, fx.Node))


@contextlib.contextmanager
def state_kept(gm: fx.GraphModule) -> Iterator[None]:
    """Within, ``gm`` may run: the parameters and buffers its forward writes (a step counter, a cache) hold
    after it what they held before."""
    saved = _written(gm)
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, before in saved:
                tensor.copy_(before)


def _written(gm: fx.GraphModule) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each parameter or buffer the graph writes, with a copy of what it holds now."""
    names = written_state(gm)
    named = dict(gm.named_parameters(remove_duplicate=False)) | dict(gm.named_buffers(remove_duplicate=False))
    tensors = {id(t): t for name, t in named.items() if name in names}
    return [(t, t.detach().clone()) for t in tensors.values()]


def observe_ranges(gm: fx.GraphModule, samples: Sequence[tuple], *, generated: bool, seen: str) -> ObservedRanges:
    """The FP32 graph's ranges over ``samples`` (each the graph's placeholders' values, in order): one
    run each, every float node output folded as it comes (see module doc)."""
    stats: dict[str, list] = {}
    outputs = []
    with state_kept(gm), torch.no_grad():
        for sample in samples:
            outputs.append(output_arrays(gm, _Folder(gm, stats).run(*sample)))
    return ObservedRanges(ranges_of(stats), generated, seen, len(samples), outputs=tuple(outputs))


def probe_ranges(gm: fx.GraphModule, example: tuple, generated: Sequence[tuple] = ()) -> ObservedRanges:
    """:func:`observe_ranges` on the example inputs (the graph's placeholders' values) and ``generated``
    samples like them (:func:`~amp_compiler.fx.graph.probe_inputs.token_id_samples`), with the probe's
    rules; where the generated samples do not run, on the example alone; a graph that does not run on
    the example eagerly gives no ranges and the error as the reason."""
    if generated:
        many = f"the example inputs and {len(generated)} sample(s) of generated token ids"
        with contextlib.suppress(Exception):  # a model that refuses drawn ids: the example alone
            return observe_ranges(gm, [example, *generated], generated=True, seen=many)
    try:
        return observe_ranges(gm, [example], generated=True, seen="the example inputs")
    except Exception as exc:  # the conversion goes on without ranges, and says why
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return ObservedRanges.unchecked(f"the FP32 graph did not run on the example inputs ({first})")


def calibration_ranges(gm: fx.GraphModule, samples: Sequence[tuple]) -> ObservedRanges:
    """:func:`observe_ranges` on calibration samples (each the graph's placeholders' values), with
    calibration's rules."""
    seen = f"{len(samples)} calibration sample{'s' if len(samples) != 1 else ''}"
    return observe_ranges(gm, samples, generated=False, seen=seen)


def overflow_warnings(fxg: FxPrecisionGraph, plan: PrecisionPlan, slot_dtypes: Mapping[FxSlot, torch.dtype],
                      observed: ObservedRanges) -> list[str]:
    """A sentence per tensor made in FP16 or BF16 (``slot_dtypes``: the lowering's dtype per slot)
    whose observed magnitude is beyond that type's largest finite value, so it becomes inf there (an
    attention mask's lowest values on its way to the softmax do not count, as the range rules count
    them: :func:`~amp_compiler.passes.analysis.calibration.observed_magnitude`)."""
    masks = mask_paths(fxg.graph, plan)
    out = []
    for slot, dtype in slot_dtypes.items():
        if slot.kind not in (SlotKind.NODE_OUT, SlotKind.GRAPH_IN) or dtype not in (torch.float16, torch.bfloat16):
            continue
        r = observed.ranges.get(slot.tensor.name)
        if r is None:
            continue
        top, magnitude = torch.finfo(dtype).max, observed_magnitude(r, masks.get(fxg.vertex_of(slot).id))
        if magnitude > top:
            out.append(f"{slot.tensor.name} reaches |x| = {magnitude:.3g} on {observed.seen} but is computed in "
                       f"{str(dtype).removeprefix('torch.')} (largest {top:.4g}): it becomes inf there")
    return out
