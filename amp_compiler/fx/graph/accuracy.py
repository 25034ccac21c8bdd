"""The converted FX graph's outputs against the FP32 graph's, on the inputs its ranges were observed on.

The FX counterpart of the ONNX path's measure before writing (:mod:`amp_compiler.onnx.measure.output_error`):
:func:`amp_compiler.fx.convert` runs the FP32 graph on the example inputs or calibration samples to
observe ranges (:mod:`amp_compiler.fx.graph.ranges`, which keeps each run's outputs), then runs the
converted graph once on each of them here, so its summary states the error it measured for one run
more than the observation's. The converted graph runs in eager torch, as its users run it: every op
rounds its output to the dtype the conversion gave it (FP16/BF16 storage, exactly), with the
accumulation its kernels choose (FP32 in torch's CPU and CUDA matrix products).

Each float output's accuracy is pooled over the samples, an integer or bool one's compared value by value, as
the ONNX path does (:func:`~amp_compiler.core.tensor_error.output_accuracies`);
:func:`accuracy_warnings` names the outputs past the ONNX path's line (:func:`~amp_compiler.onnx.measure.
output_error.misses`: NaN/Inf where FP32 is finite, max error above 2% of the range, cosine below 0.999,
more than 1% of labels changed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.fx as fx

from amp_compiler.core.measures import OutputAccuracy
from amp_compiler.core.tensor_error import output_accuracies
from amp_compiler.fx.graph.ranges import output_arrays, state_kept
from amp_compiler.onnx.measure.output_error import concentrated, misses, moves_at_ties

__all__ = ["accuracy_warnings", "output_accuracy"]


def output_accuracy(
    gm: fx.GraphModule, samples: Sequence[tuple], references: Sequence[Sequence[np.ndarray]], names: Sequence[str],
) -> list[OutputAccuracy]:
    """The converted ``gm``'s outputs on ``samples`` (each its placeholders' values) against ``references``
    (the FP32 graph's on them, :func:`~amp_compiler.fx.graph.ranges.output_arrays`), one per float, integer
    or bool output (``names``: the outputs' names, in order; outputs of other kinds are not compared)."""
    with state_kept(gm), torch.no_grad():
        converted = [output_arrays(gm, fx.Interpreter(gm).run(*sample)) for sample in samples]
    nodes = {node.name: node for node in gm.graph.nodes}
    logistic = {name for name in names if name in nodes and _sigmoid_of(gm, nodes[name])}
    return output_accuracies(names, references, converted, logistic)


#: What hands a tensor's values on unchanged (views, copies, dtype casts), by the name of an op or method.
_MOVES_VALUES = frozenset({"clone", "contiguous", "expand", "flatten", "float", "permute", "reshape", "select",
                           "slice", "squeeze", "to", "transpose", "type_as", "unsqueeze", "view", "_to_copy"})


def _op_name(gm: fx.GraphModule, node: fx.Node) -> str:
    """The op a node calls: a function's or ATen overload's base name, a method's name, a module's class name."""
    if node.op == "call_module":
        return type(gm.get_submodule(str(node.target))).__name__.lower()
    if node.op == "call_method":
        return str(node.target)
    name = getattr(node.target, "__name__", str(node.target))
    return name.split(".")[0]


def _sigmoid_of(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether an output node holds a sigmoid's values (through views and casts): each one of two classes'
    probability (:func:`~amp_compiler.core.probabilities.probability_output`)."""
    while node.op in ("call_function", "call_method", "call_module") and _op_name(gm, node) in _MOVES_VALUES:
        first = next((a for a in node.args if isinstance(a, fx.Node)), None)
        if first is None:
            return False
        node = first
    return node.op in ("call_function", "call_method", "call_module") and _op_name(gm, node) == "sigmoid"


def accuracy_warnings(measured: Sequence[OutputAccuracy], seen: str) -> list[str]:
    """A sentence per output past the line (:func:`~amp_compiler.onnx.measure.output_error.misses`), saying
    how far off it is on ``seen`` (the inputs it was measured on) and what helps, and per output within it
    whose error sits in a few positions (:func:`~amp_compiler.onnx.measure.output_error.concentrated`) or that a
    tie between two classes would move past it (:func:`~amp_compiler.onnx.measure.output_error.moves_at_ties`)."""
    out = []
    for a in measured:
        if concentrated(a):
            out.append(f"output {a.name}: its max error is {a.error_of_range:.2%} of its range on {seen}, but its "
                       f"worst position is {a.concentration:.0f}x the 90th percentile's: a few inputs' values amplify "
                       "FP16 rounding there, so longer or other inputs can miss further; check it on real data")
        if moves_at_ties(a):
            out.append(f"output {a.name}: its max error is {a.error_of_range:.2%} of its range on {seen}, but the "
                       "conversion moves its logits' differences enough that where two classes tie it moves by up to "
                       f"{a.tie_move:.1%} of its range: inputs that tie miss further; check it on real data")
        if not a.measured or not misses(a):
            continue
        if a.exact:
            how = f"{a.changed} of its {a.values} values differ from FP32's"
        elif not a.finite:
            how = "it holds NaN/Inf where FP32 does not"
        else:
            how = f"its max error is {a.error_of_range:.2%} of its range (cosine {a.cosine:.5f})"
        out.append(f"output {a.name}: {how} on {seen}; keep the ops feeding it FP32 (block_ops/block_nodes) or "
                   f"give calibration=[samples] of real data")
    return out
