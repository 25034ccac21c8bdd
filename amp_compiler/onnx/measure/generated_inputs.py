"""Random inputs for a model when no data is given, at dims the model runs with: what ``report`` measures
output accuracy on without ``--calibration-data``.

A dynamic dim (a ``dim_param``, or no value at all) has no size the model states. Taking it as 1 runs
most models, but not all: an audio front end's first Conv reads 400 samples, a vision model's pooling
wants a few pixels, and onnxruntime refuses a smaller input (``Invalid input shape: {1}``). So:

1. every dynamic dim takes 1, and the FP32 model runs on those inputs;
2. if onnxruntime refuses them, the dims the user did not fix take the typical sizes of
   :data:`SIZES` in turn (a batch dim keeps 1: one named like a batch (by a letter, ``n``, only as the
   first dim), one found only as the first dim of inputs of rank 2 or more, but not one whose samples
   meet in a ``[N, N]`` tensor, or a recurrent state's: :func:`batch_dims`), skipping a size the model's own
   constraints rule out: onnx's shape inference, given those input shapes, finds a dim below 1 (a
   Conv's kernel longer than its input) or fails. At most :data:`MAX_REFUSED` sizes are run and
   refused before the search stops; the first that runs is taken.

Inputs that would hold more than :data:`~amp_compiler.runtime.samples.MAX_SAMPLE_BYTES` are never made.
Only onnxruntime's refusals of the inputs move the search on: a model it cannot load at all, one
over its run budget or one that crashes it stops it (bigger inputs would not help), and the caller
decides what that means (``report``: accuracy not measured, and why).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import onnx.shape_inference

from amp_compiler.errors import (
    ModelCrashError,
    ModelRefusedError,
    ModelRunError,
    ModelUnsupportedError,
    RunBudgetError,
)
from amp_compiler.onnx.costs import dims as dim_exprs
from amp_compiler.onnx.load.skeleton import weight_free
from amp_compiler.onnx.load.text import first_line, shown
from amp_compiler.runtime.input_kinds import model_inputs
from amp_compiler.runtime.runner import Runner
from amp_compiler.runtime.samples import MAX_SAMPLE_BYTES, SampleSizeError, random_samples, sample_bytes
from amp_compiler.sizes import format_bytes

__all__ = [
    "MAX_REFUSED", "SIZES", "Generated", "batch_dims", "dim_key", "dynamic_dims", "pairwise_dims", "runnable_inputs",
    "shapes_for",
]

#: The sizes dynamic dims take after 1, smallest first: powers of two up to 16384 (a second of
#: 16 kHz audio, a long context, a large image side).
SIZES = tuple(2**k for k in range(1, 15))
#: Sizes after 1 that may be run and refused before the search gives up.
MAX_REFUSED = 3
#: Dims named like a batch keep 1 (the model's size per sample is what has a minimum).
_BATCH = re.compile(r"batch", re.IGNORECASE)
#: ... and dims named by a batch's letter, where they are the first dim of every input they size (an
#: ``n`` after a ``b``, ``[b, n, 8]``, counts points or events, and an ``[N, 3]`` input's first dim is
#: a batch by its place anyway).
_BATCH_LETTER = re.compile(r"b|n|bs", re.IGNORECASE)
#: A rank-3 input named like a recurrent state, its first and last dims fixed, is ``[num_directions,
#: batch, hidden]`` (ONNX's LSTM, GRU and RNN layout of ``initial_h``/``initial_c``): its dim 1 is the
#: batch (Silero VAD's ``state``: ``[2, ?, 128]``).
_STATE = re.compile(r"(\w*[_.])?(states?|hidden|h0|c0|hn|cn|initial_[hc])", re.IGNORECASE)
#: Failures that end the search: bigger inputs would not help.
_STOPS = (RunBudgetError, ModelCrashError, ModelRefusedError, ModelUnsupportedError)


@dataclasses.dataclass
class Generated:
    """Inputs the FP32 model ran on, and how they were made."""

    samples: list[dict[str, np.ndarray]]
    dims: dict[str, int]  # the value each dynamic dim took ("name", or "input[axis]" for an unnamed one)
    outputs: list[list[np.ndarray]]  # the FP32 model's outputs, per sample (the search ran them)
    refused: list[tuple[int, str]]  # the sizes onnxruntime refused, with its first line

    def describe(self) -> str:
        """``batch=1, samples=512 (sizes 1, 256 did not run: ...)``: the dims taken, and the sizes
        onnxruntime refused first, with its first refusal."""
        taken = ", ".join(f"{shown(name)}={value}" for name, value in self.dims.items())
        if not self.refused:
            return taken
        sizes = ", ".join(str(size) for size, _ in self.refused)
        # onnxruntime nests the failing node's message in each enclosing subgraph node's: the outermost
        # node and the innermost message are what a summary line has room for.
        parts = self.refused[0][1].split(" Status Message:")
        why = parts[0] + (" Status Message:" + parts[-1] if len(parts) > 1 else "")
        return f"{taken} (sizes {sizes} did not run: {why})"


def dim_key(info: onnx.ValueInfoProto, axis: int, dim: onnx.TensorShapeProto.Dimension) -> str:
    """The name a dynamic dim goes by: its ``dim_param``, or ``input[axis]`` for an unnamed one."""
    return dim.dim_param if dim.HasField("dim_param") else f"{info.name}[{axis}]"


def dynamic_dims(model: onnx.ModelProto, fixed: Mapping[str, tuple[int, ...]] | None = None) -> list[str]:
    """The dynamic dims of the model's inputs that ``fixed`` (input shapes) do not give, in order: each
    ``dim_param`` that is a name (an expression follows its names), and each unnamed one as
    ``input[axis]``."""
    fixed = fixed or {}
    bound = dim_exprs.bindings(model, fixed)
    out: list[str] = []
    for info in model_inputs(model):
        if info.name in fixed or not info.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            key = dim_key(info, axis, dim)
            if dim.HasField("dim_param") and (key in bound or not key.isidentifier()):
                continue
            if key not in out:
                out.append(key)
    return out


def _static(dim: onnx.TensorShapeProto.Dimension) -> bool:
    return dim.HasField("dim_value") and dim.dim_value > 0


def batch_dims(model: onnx.ModelProto, keys: list[str]) -> set[str]:
    """The keys that are batch dims: named like one (by a batch's letter, ``b``, ``n`` or ``bs``, only as
    the first dim of every input it sizes), found only as the first dim of inputs of rank 2
    or more (exporters often leave a batch unnamed: ``unk__0``), or dim 1 of a rank-3 recurrent state
    (an unnamed one; a named one shared with the inputs' batch is one already). Not, of those but the
    ones named ``batch``, a dim whose samples meet (:func:`pairwise_dims`)."""
    places: dict[str, set[tuple[int, int]]] = {}
    states: set[str] = set()
    for info in model_inputs(model):
        if not info.type.tensor_type.HasField("shape"):
            continue
        dims = info.type.tensor_type.shape.dim
        for axis, dim in enumerate(dims):
            places.setdefault(dim_key(info, axis, dim), set()).add((axis, len(dims)))
        if len(dims) == 3 and _STATE.fullmatch(info.name) and _static(dims[0]) and _static(dims[2]):
            states.add(dim_key(info, 1, dims[1]))
    found = {k for k in keys if (_BATCH_LETTER.fullmatch(k) and all(axis == 0 for axis, _ in places.get(k, ())))
             or all(axis == 0 and rank >= 2 for axis, rank in places.get(k, ()))}
    if found:
        found -= pairwise_dims(model, found)
    return found | {k for k in keys if _BATCH.search(k) or k in states}


#: Ops that normalise over an axis (opset 13's default: the last): what runs along it is one set of classes.
_OVER_CLASSES = frozenset({"Softmax", "LogSoftmax"})


def pairwise_dims(model: onnx.ModelProto, keys: set[str]) -> set[str]:
    """The ``keys`` (dynamic input dims) that a tensor of the graph holds twice in its shape, or that a Softmax
    normalises over, by onnx's shape inference with the graph outputs' stated shapes set aside (an exporter
    names an output's dims anew): ``[N, N]``, a Gram matrix of N points (``X @ X^T``, pairwise distances), a
    CLIP head's similarity of every image-text pair, whose softmax runs over it; ``[1, N]``, one image's
    similarity to N text prompts, a zero-shot classifier's classes. Its samples meet there, so it is no
    batch: at 1 each such product is one value and the softmax 1 (sweep Q: a [N, 3] molecule's
    distances, 57% off on real atoms, and CLIP's logits, stated 0.00%; sweep C1: one image against 50
    prompts, 1.7% off held out, stated 0.00%). Empty where inference fails."""
    light = weight_free(model)
    if light is None:
        light = onnx.ModelProto()
        light.CopyFrom(model)
    symbols: dict[str, str] = {}  # the symbol inference sees -> the key (an unnamed dim gets one)
    for info in light.graph.input:
        if not info.type.tensor_type.HasField("shape"):
            continue
        for axis, dim in enumerate(info.type.tensor_type.shape.dim):
            key = dim_key(info, axis, dim)
            if key in keys and not _static(dim):
                symbol = dim.dim_param or f"amp_probe_dim_{len(symbols)}"
                dim.dim_param = symbol
                symbols[symbol] = key
    for info in light.graph.output:
        if info.type.HasField("tensor_type"):
            info.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=True)
    except Exception:  # noqa: BLE001 - onnx raises several types; without inference no dim is found
        return set()
    out: set[str] = set()
    shapes: dict[str, list[onnx.TensorShapeProto.Dimension]] = {}
    for info in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
            shapes[info.name] = list(info.type.tensor_type.shape.dim)
            named = [d.dim_param for d in shapes[info.name] if d.dim_param in symbols]
            out.update(symbols[p] for p in named if named.count(p) > 1)
    for node in inferred.graph.node:  # a softmax over the dim: its classes (CLIP's prompts, one image's row)
        dims = shapes.get(node.input[0]) if node.op_type in _OVER_CLASSES and node.input else None
        if dims:
            axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
            if -len(dims) <= axis < len(dims) and dims[axis].dim_param in symbols:
                out.add(symbols[dims[axis].dim_param])
    return out


def shapes_for(
    model: onnx.ModelProto, values: Mapping[str, int], fixed: Mapping[str, tuple[int, ...]] | None = None
) -> dict[str, tuple[int, ...]]:
    """Every input's shape with its dynamic dims at ``values`` (by :func:`dynamic_dims`' keys; an
    expression evaluated with them, else 1) and ``fixed``'s shapes as given."""
    fixed = fixed or {}
    bound = {**dim_exprs.bindings(model, fixed), **values}
    shapes: dict[str, tuple[int, ...]] = {}
    for info in model_inputs(model):
        if info.name in fixed:
            shapes[info.name] = tuple(fixed[info.name])
            continue
        dims = info.type.tensor_type.shape.dim if info.type.tensor_type.HasField("shape") else []
        shape = []
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(dim.dim_value)
            elif dim.HasField("dim_param"):
                shape.append(dim_exprs.evaluate(dim.dim_param, bound) or 1)
            else:
                shape.append(values.get(dim_key(info, axis, dim), 1))
        shapes[info.name] = tuple(shape)
    return shapes


class _Inference:
    """onnx's shape inference of the model at given input shapes (the model's own constraints),
    on its weight-free description."""

    def __init__(self, model: onnx.ModelProto):
        light = weight_free(model)
        if light is None:
            light = onnx.ModelProto()
            light.CopyFrom(model)
        self.model = light

    def allows(self, shapes: Mapping[str, tuple[int, ...]]) -> bool:
        """False when inference, with these input shapes, fails or finds a dim below 1."""
        for info in self.model.graph.input:
            shape = shapes.get(info.name)
            if shape is None or not info.type.tensor_type.HasField("shape"):
                continue
            for dim, value in zip(info.type.tensor_type.shape.dim, shape, strict=False):
                dim.Clear()
                dim.dim_value = value
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model, strict_mode=True, data_prop=True)
        except Exception:  # noqa: BLE001 - onnx raises several types; any failure rules the size out
            return False
        for info in (*inferred.graph.value_info, *inferred.graph.output):
            if info.type.HasField("tensor_type") and info.type.tensor_type.HasField("shape"):
                if any(d.HasField("dim_value") and d.dim_value < 1 for d in info.type.tensor_type.shape.dim):
                    return False
        return True


def _batch_of_two(
    model: onnx.ModelProto, session: Any, keys: list[str], batch: set[str], fixed: dict[str, tuple[int, ...]],
    refused: list[tuple[int, str]], **draw: Any,
) -> Generated | None:
    """The search's last try: its batch dims at 2, the others at 1. A graph that squeezes every dim of
    1 (hummingbird's compiled trees: a ``Squeeze`` without axes before a ``Gemm``) runs on no batch of
    one, and a model refused at every size was converted without the probe (sweep T)."""
    values = {k: 2 if k in batch else 1 for k in keys}
    shapes = shapes_for(model, values, fixed)
    if sample_bytes(model, shapes) > draw["max_bytes"]:
        return None
    samples = random_samples(model, shapes, **draw)
    try:
        return Generated(samples, values, [session.run(samples[0])], refused)
    except _STOPS:
        raise
    except ModelRunError as exc:
        refused.append((2, first_line(exc)))
        return None


def runnable_inputs(
    model: onnx.ModelProto, runner: Runner, fixed: Mapping[str, tuple[int, ...]] | None = None, *,
    seed: int = 0, max_bytes: int = MAX_SAMPLE_BYTES, informed: bool = False,
    input_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> Generated:
    """One random sample the FP32 ``model`` runs on, and its outputs (see the module doc). ``fixed``:
    input shapes the user gave (their dims are not searched). ``informed``, ``input_ranges``: values
    that follow what is known of the inputs (:func:`amp_compiler.runtime.samples.random_samples`).
    Raises the :class:`ModelRunError` that
    ended the search: onnxruntime's refusal of the last size tried, or what stopped it."""
    fixed = dict(fixed or {})
    keys = dynamic_dims(model, fixed)
    batch = batch_dims(model, keys)
    session = runner.load(model, basic=True)  # one or a few runs: the full optimizer's time is not won back
    try:
        refused: list[tuple[int, str]] = []
        first: ModelRunError | None = None
        inference: _Inference | None = None
        for size in (1, *SIZES):
            values = {k: 1 if k in batch else size for k in keys}
            if size > 1 and all(v == 1 for v in values.values()):
                break  # nothing left to grow
            shapes = shapes_for(model, values, fixed)
            if sample_bytes(model, shapes) > max_bytes:
                break
            if size > 1:
                inference = inference or _Inference(model)
                if not inference.allows(shapes):
                    continue
            samples = random_samples(model, shapes, seed=seed, max_bytes=max_bytes, informed=informed,
                                     input_ranges=input_ranges)
            try:
                outputs = session.run(samples[0])
            except _STOPS:
                raise
            except ModelRunError as exc:
                first = first or exc
                refused.append((size, first_line(exc)))
                if len(refused) > MAX_REFUSED:
                    break
                continue
            return Generated(samples, values, [outputs], refused)
        if batch and first is not None:  # a model that takes no batch of one: once more with two
            found = _batch_of_two(model, session, keys, batch, fixed, refused, seed=seed, max_bytes=max_bytes,
                                  informed=informed, input_ranges=input_ranges)
            if found is not None:
                return found
        if first is None:  # not even size 1 fits
            raise SampleSizeError(
                f"random inputs for the model take more than the {format_bytes(max_bytes)} generated inputs may"
            )
        raise first
    finally:
        session.close()
