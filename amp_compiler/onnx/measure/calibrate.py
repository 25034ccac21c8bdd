"""Calibration: observed value ranges of every tensor, from runs of the FP32 model on sample inputs.

Samples come from ``--calibration-data`` (:mod:`amp_compiler.runtime.samples` reads them safely and checks
them against the model's inputs before anything runs). Statistics are computed where the model runs
(the runner's child process): the model, every main-graph float tensor exposed, is cut into a chain
of pieces (:mod:`amp_compiler.onnx.measure.pieces`) run one after the other; each piece's tensors are
folded into running min/max/counts (:func:`amp_compiler.runtime.child_folds.fold_array`) and dropped, and only
the statistics come back. Memory holds one piece's tensors and the values between pieces, not every
activation of a run; time is one run of the model per sample plus the folding.

:class:`IntermediateRunner` runs a model with every float tensor of its main graph exposed as an
output and returns them all; ``compare`` and the ``--tolerance`` refinement use it to compare
converted and FP32 tensors.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator

import numpy as np
import onnx
import onnx.shape_inference
from google.protobuf.message import Message

from amp_compiler.core.measures import TensorRange
from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.errors import OptionError
from amp_compiler.onnx.measure.pieces import chain_pieces, live_bytes
from amp_compiler.policy.kernels import ORT_NAMES
from amp_compiler.runtime import child as runner_child
from amp_compiler.runtime import child_folds
from amp_compiler.runtime.runner import Runner, Session, default_runner
from amp_compiler.targets import Provider

__all__ = ["IntermediateRunner", "collect_ranges", "exposed_model"]

FP16_SMALLEST_SUBNORMAL = 2.0**-24
FP16_SMALLEST_NORMAL = 2.0**-14


# onnxruntime's Python binding cannot return bfloat16 outputs ("No corresponding Numpy type"): an
# emulated BF16 model's rounded copies are exposed in FP32 instead (amp_compiler.onnx.measure.emulate).
_EXPOSED_TYPES = FLOAT_TYPES - {onnx.TensorProto.BFLOAT16}
_SIZED = frozenset(set(onnx.helper.get_all_tensor_dtypes()) - {onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED})


def exposed_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose main-graph float tensors (but bfloat16 ones, which onnxruntime cannot
    return) are all graph outputs, and their names. Tensors onnx's shape inference leaves untyped
    (downstream of onnxruntime's contrib ops) take the type their ops' schemas imply."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    existing = {o.name for o in inferred.graph.output}
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info
             if vi.type.HasField("tensor_type")}
    untyped = [name for node in inferred.graph.node for name in node.output
               if name and name not in existing and name not in types]
    if untyped:
        types.update(_schema_types(inferred, set(untyped)))
    extra = []
    for node in inferred.graph.node:
        for name in node.output:
            if name and name not in existing and types.get(name) in _EXPOSED_TYPES:
                extra.append(onnx.helper.make_tensor_value_info(name, types[name], None))
                existing.add(name)
    inferred.graph.output.extend(extra)
    return inferred, [o.name for o in inferred.graph.output]


def _schema_types(model: onnx.ModelProto, names: set[str]) -> dict[str, int]:
    """Element types of the main-graph tensors ``names`` from the ops' schemas (onnx_ir over the model,
    :func:`amp_compiler.onnx.ir.schema_typing.type_from_schemas`)."""
    import onnx_ir as ir

    from amp_compiler.onnx.ir.schema_typing import type_from_schemas

    typed = ir.from_proto(model)
    type_from_schemas(typed)
    return {v.name: int(v.dtype) for node in typed.graph for v in node.outputs
            if v.name in names and v.dtype is not None}


class IntermediateRunner:
    """Runs a model on onnxruntime with every main-graph float tensor exposed, through ``runner``
    (:mod:`amp_compiler.runtime.runner`: a child process with a budget, or this process for trusted models),
    on the CPU provider or (``provider=Provider.CUDA``) on the CUDA provider, whose real FP16/BF16
    kernels then run; a provider onnxruntime does not start is an :class:`OptionError`."""

    def __init__(self, model: onnx.ModelProto, runner: Runner, provider: Provider = Provider.CPU):
        name = ORT_NAMES[provider]
        if name not in runner_child.PROVIDERS:
            raise OptionError(f"models run on the cpu or cuda execution provider, not {provider.value}",
                              option="provider")
        exposed, self.names = exposed_model(model)
        self.session = runner.load(exposed, provider=name, basic=True)  # see runner_child.session_options
        if self.session.providers[:1] != [name]:
            self.session.close()
            raise OptionError(
                f"onnxruntime here did not start the {provider.value} execution provider "
                f"(it started: {', '.join(self.session.providers)})", option="provider",
            )
        self.feeds = dict(zip(self.session.input_names, self.session.input_types, strict=True))
        self.runs = 0

    def run(self, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs += 1
        feeds = {k: _as_input(v, self.feeds[k]) for k, v in sample.items() if k in self.feeds}
        return dict(zip(self.names, self.session.run(feeds), strict=True))

    def close(self) -> None:
        self.session.close()


def _as_input(array: np.ndarray, ort_type: str) -> np.ndarray:
    """A float sample array in the float type the session's input takes (an FP16 input of a model
    converted without keeping its I/O types); anything else as it is."""
    if ort_type == "tensor(float16)" and np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float16)
    return array


def _range(stats: list[float]) -> TensorRange:
    """A tensor's :class:`TensorRange` from its running statistics (:data:`child_folds.STAT_FIELDS`)."""
    lo, hi, absmax, nonzero, flushed, subnormal, count, energy, lost = stats
    return TensorRange(
        min=lo if count else 0.0,
        max=hi if count else 0.0,
        absmax=absmax,
        underflow_share=flushed / nonzero if nonzero else 0.0,
        subnormal_share=subnormal / nonzero if nonzero else 0.0,
        count=int(count),
        underflow_error=_underflow_error(energy, lost, flushed),
    )


def _underflow_error(energy: float, lost: float, flushed: float) -> float:
    """``sqrt(lost / energy)`` (:data:`child_folds.STAT_FIELDS`); a tensor whose every value is so
    small that its float32 squares are zero (below 1e-19) is all lost when any flushes; a tensor whose
    squares reach inf (beyond 1.8e19) overflows FP16 instead."""
    if energy > 0:
        return math.sqrt(lost / energy) if math.isfinite(energy) else 0.0
    return 1.0 if lost > 0 or flushed > 0 else 0.0


def _progress(items: list, label: str) -> Iterator:
    """Yield items, drawing a progress bar on stderr when it is a terminal."""
    tty = sys.stderr.isatty()
    n = len(items)
    for i, item in enumerate(items, 1):
        yield item
        if tty:
            filled = int(30 * i / n)
            sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {i}/{n}")
            sys.stderr.flush()
    if tty and n:
        sys.stderr.write("\n")


def collect_ranges(
    model: onnx.ModelProto, samples: Iterable[dict[str, np.ndarray]], *, runner: Runner | None = None
) -> dict[str, TensorRange]:
    """Observed range of every main-graph float tensor of the FP32 model over the samples.
    ``runner``: where the model runs (default: a child process with the default budget)."""
    runner, owned = default_runner(runner)
    try:
        return _collect(model, samples, runner)
    finally:
        if owned:
            runner.close()


def _collect(
    model: onnx.ModelProto, samples: Iterable[dict[str, np.ndarray]], runner: Runner
) -> dict[str, TensorRange]:
    samples = list(samples)
    light = _weightless(model, samples[0] if samples else {})
    exposed, names = exposed_model(light)
    del light
    sizes = _tensor_bytes(exposed)
    budget = live_bytes(model, sizes)  # the model's own outputs: in ``exposed`` every tensor is one
    weights = {t.name: t for t in model.graph.initializer}
    sessions: list[Session] = []
    try:
        for piece in chain_pieces(exposed, names, sizes, budget):
            if piece is exposed:  # one piece: the model's own inputs, no shapes bound to the first sample
                del piece.graph.input[:], piece.graph.value_info[:]
                piece.graph.input.extend(model.graph.input)
            _restore_weights(piece, weights)
            # basic: see runner_child.session_options. Prepacked weights kept: without, onnxruntime's LSTM
            # takes another GEMM path, and its outputs differ in the last bits from the FP32 model's
            sessions.append(runner.load(piece, basic=True, chained=True))
            del piece
        del exposed
        graph_inputs = {i.name for i in model.graph.input}
        feeds = {n: t for s in sessions for n, t in zip(s.input_names, s.input_types, strict=True) if n in graph_inputs}
        key = id(sessions)  # this collection's running statistics in the runner (which others may share)
        inputs: dict[str, list] = {}
        for sample in _progress(samples, "calibrating"):
            runner.fold(sessions, {k: _as_input(v, feeds[k]) for k, v in sample.items() if k in feeds}, key)
            for name, value in sample.items():
                if np.issubdtype(value.dtype, np.floating):
                    child_folds.fold_array(np, inputs, name, np.asarray(value))
        observed = runner.statistics(key)
    finally:
        for session in sessions:
            session.close()
    return {name: _range(stats) for name, stats in {**observed, **inputs}.items()}


#: Initializers at least this large are left out of the copy shape inference reads (their dims stay).
_STUB_BYTES = 1024


def _weightless(model: onnx.ModelProto, sample: dict[str, np.ndarray]) -> onnx.ModelProto:
    """A copy of ``model`` whose large float initializers hold their dims but no values (shape inference
    reads no more; the weights are not copied), and whose inputs' dims are ``sample``'s (so that shape
    inference gives every tensor's size, for cutting the pieces by size)."""
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    graph = light.graph
    _copy_fields(model.graph, graph, skip="initializer")
    for t in model.graph.initializer:
        if t.data_type in _EXPOSED_TYPES and t.ByteSize() >= _STUB_BYTES and t.data_location != t.EXTERNAL:
            graph.initializer.append(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
        else:
            graph.initializer.append(t)
    for value in graph.input:
        given = sample.get(value.name)
        dims = value.type.tensor_type.shape.dim
        if given is not None and value.type.HasField("tensor_type") and len(dims) == given.ndim:
            for d, size in zip(dims, given.shape, strict=True):
                d.dim_value = int(size)
    return light


def _copy_fields(source: Message, target: Message, skip: str) -> None:
    """Copy every set field of ``source`` into ``target`` but ``skip``."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


def _restore_weights(piece: onnx.ModelProto, weights: dict[str, onnx.TensorProto]) -> None:
    for t in piece.graph.initializer:
        original = weights.get(t.name)
        if original is not None and original.ByteSize() != t.ByteSize():
            t.CopyFrom(original)


def _tensor_bytes(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes of each main-graph tensor whose shape inference found a static shape."""
    out = {}
    for value in (*model.graph.input, *model.graph.value_info):
        tensor = value.type.tensor_type
        dims = tensor.shape.dim
        static = value.type.HasField("tensor_type") and tensor.HasField("shape")
        if static and all(d.HasField("dim_value") for d in dims):
            known = tensor.elem_type in _SIZED
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize if known else 4
            out[value.name] = itemsize * int(np.prod([d.dim_value for d in dims]))
    return out
