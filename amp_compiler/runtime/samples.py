"""Sample inputs for a model: calibration data read safely from ``.npz`` files, or random inputs.

Calibration data is untrusted input, like the model: ``--calibration-data`` is an ``.npz`` keyed by
graph input name (one sample) or a folder of them (one sample each, in name order). A file is
opened without blocking and refused unless it is a regular, non-empty file (a FIFO would hang a
plain ``open``). Every array's size is known before its data is read: the zip's declared sizes
first (a zip bomb is refused before anything is decompressed), then each ``.npy`` header's shape
and dtype, checked against the model's input (name, dtype, rank, fixed dims) and against a byte
budget for all the samples together; only then are exactly that many bytes read.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import zipfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx.numpy_helper

from amp_compiler.errors import AmpUserError
from amp_compiler.sizes import format_bytes

__all__ = [
    "MAX_SAMPLE_BYTES", "CalibrationDataError", "InputKind", "SampleSizeError", "UngeneratedInputError",
    "image_channels", "image_inputs",
    "image_like", "input_kinds", "load_samples", "model_inputs", "random_samples", "sample_bytes", "waveform_inputs",
]

#: The most bytes all calibration samples together may hold (they are kept in memory).
MAX_SAMPLE_BYTES = 4 * 2**30
#: Kinds of arrays a model input can take: bool, signed and unsigned integers, floats.
_KINDS = frozenset("biuf")


class CalibrationDataError(AmpUserError):
    """Calibration data that is missing, unreadable or does not match the model's inputs."""


class SampleSizeError(AmpUserError):
    """Generated inputs would hold more than samples may (their shapes were given too large)."""


class UngeneratedInputError(SampleSizeError):
    """The model takes an input of a type generated inputs are not made of (a sequence, an optional, a map:
    they are tensors); caught wherever generated inputs cannot be made, as :class:`SampleSizeError` is."""


def _tensors_only(model: onnx.ModelProto) -> None:
    """Raise :class:`UngeneratedInputError` for the first graph input that is not a tensor."""
    for info in model_inputs(model):
        kind = info.type.WhichOneof("value")
        if kind != "tensor_type":
            what = (kind or "untyped").removesuffix("_type")
            raise UngeneratedInputError(
                f"input {info.name!r} is of {what} type, and generated inputs are tensors: give the inputs as data")


def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that must be fed (initializers listed as inputs are optional)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _shape_text(dims: list[int | None] | tuple[int, ...]) -> str:
    return "x".join("?" if d is None else str(d) for d in dims) or "scalar"


def _check_array(
    name: str, dtype: np.dtype, shape: tuple[int, ...], model: onnx.ModelProto, origin: str
) -> None:
    """One array of a sample against the model's input of that name (before its data is read)."""
    inputs = {i.name: i for i in model_inputs(model)}
    if name not in inputs:
        if name in {i.name for i in model.graph.input}:
            return  # an initializer listed as an input: feeding it is allowed
        raise CalibrationDataError(f"{origin}: {name!r} is not an input of the model (inputs: {', '.join(inputs)})")
    tt = inputs[name].type.tensor_type
    expected = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
    if dtype != expected:
        raise CalibrationDataError(f"{origin}: input {name!r} is {dtype}, the model expects {expected}")
    if tt.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
        if len(dims) != len(shape) or any(d is not None and d != a for d, a in zip(dims, shape, strict=True)):
            raise CalibrationDataError(
                f"{origin}: input {name!r} has shape {_shape_text(shape)}, the model expects {_shape_text(dims)}"
            )


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused unless a regular non-empty file (never blocks on a FIFO:
    O_NONBLOCK, then fstat on the open descriptor, so nothing can change between check and open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise CalibrationDataError(f"{path}: cannot open: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        os.close(fd)
        what = "is empty" if stat.S_ISREG(st.st_mode) else "is not a regular file (a pipe, device or socket)"
        raise CalibrationDataError(f"{path}: {what}, not an .npz file")
    return os.fdopen(fd, "rb")


def _read_header(member: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(member)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(member)
    raise ValueError(f".npy format version {version[0]}.{version[1]} (1.0 or 2.0 expected)")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, model: onnx.ModelProto, origin: str, budget: int):
    """One ``.npy`` member: (its key, the array), its header checked before ``budget`` bytes at most are read."""
    key = info.filename.removesuffix(".npy")
    if info.is_dir() or not info.filename.endswith(".npy"):
        raise CalibrationDataError(f"{origin}: holds {info.filename!r}, which is not an .npy array")
    with zf.open(info) as member:
        try:
            shape, fortran, dtype = _read_header(member)  # type: ignore[arg-type]
        except ValueError as exc:
            raise CalibrationDataError(f"{origin}: {key!r} is not a readable .npy array ({exc})") from None
        if dtype.hasobject or dtype.kind not in _KINDS:
            raise CalibrationDataError(f"{origin}: {key!r} holds {dtype}, not numbers")
        _check_array(key, dtype, shape, model, origin)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > budget:
            raise CalibrationDataError(
                f"{origin}: {key!r} has shape {_shape_text(shape)} ({format_bytes(nbytes)}), more than the "
                f"{format_bytes(budget)} left of what calibration data may take"
            )
        data = member.read(nbytes)
    if len(data) != nbytes:
        raise CalibrationDataError(f"{origin}: {key!r} is truncated ({len(data)} of {nbytes} bytes)")
    return key, np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")


def read_npz(path: Path, model: onnx.ModelProto, budget: int) -> tuple[dict[str, np.ndarray], int]:
    """The arrays of one ``.npz`` file, each checked against ``model`` before its data is read, and
    the bytes they hold (at most ``budget``)."""
    origin = str(path)
    out: dict[str, np.ndarray] = {}
    used = 0
    with _open_regular(path) as f:
        try:
            with zipfile.ZipFile(f) as zf:
                members = zf.infolist()
                if not members:
                    raise CalibrationDataError(f"{origin}: holds no arrays")
                declared = sum(m.file_size for m in members)
                if declared > budget + 4096 * len(members):  # data plus .npy headers
                    raise CalibrationDataError(
                        f"{origin}: its arrays take {format_bytes(declared)} uncompressed, more than the "
                        f"{format_bytes(budget)} left of what calibration data may take"
                    )
                for info in members:
                    key, array = _read_member(zf, info, model, origin, budget - used)
                    if key in out:
                        raise CalibrationDataError(f"{origin}: holds the array {key!r} twice")
                    out[key] = array
                    used += array.nbytes
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, NotImplementedError) as exc:
            raise CalibrationDataError(f"{origin}: not a readable .npz file ({exc})") from None
    missing = [i.name for i in model_inputs(model) if i.name not in out]
    if missing:
        raise CalibrationDataError(f"{origin}: no array for the model input {missing[0]!r}")
    return out, used


def sample_files(path: str | Path) -> list[Path]:
    """The .npz files of a calibration path (a file or a folder of files)."""
    p = Path(path)
    if not p.exists():
        raise CalibrationDataError(f"{p}: no such file or folder")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".npz" and f.is_file())
        if not files:
            raise CalibrationDataError(f"{p}: the folder holds no .npz files")
        return files
    if p.suffix != ".npz":
        raise CalibrationDataError(f"{p}: calibration data must be an .npz file or a folder of them")
    return [p]


def load_samples(
    path: str | Path, model: onnx.ModelProto, *, max_bytes: int = MAX_SAMPLE_BYTES
) -> list[dict[str, np.ndarray]]:
    """All samples of a calibration path, each checked against the model's inputs before its data
    is read; together they hold at most ``max_bytes``."""
    samples = []
    left = max_bytes
    for f in sample_files(path):
        sample, used = read_npz(f, model, left)
        left -= used
        samples.append(sample)
    return samples


def input_shape(info: onnx.ValueInfoProto, input_shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """The shape a generated input takes: ``input_shapes``' entry, else the model's dims with each
    dynamic one taken as 1."""
    given = (input_shapes or {}).get(info.name)
    if given is not None:
        return tuple(given)
    dims = info.type.tensor_type.shape.dim
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims)


def sample_bytes(model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None) -> int:
    """The bytes one generated sample of ``model`` holds (shapes as :func:`input_shape` gives them); an
    input of another type than a tensor is an :class:`UngeneratedInputError`."""
    _tensors_only(model)
    total = 0
    for info in model_inputs(model):
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)).itemsize
        total += math.prod(input_shape(info, input_shapes)) * itemsize
    return total


def random_samples(
    model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None, n: int = 1, seed: int = 0,
    *, max_bytes: int = MAX_SAMPLE_BYTES, informed: bool = False,
    input_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Inputs for a model when no data is given: floats ~ N(0, 1), integers 1, booleans True.

    With ``informed`` they follow what is known of each input (:func:`input_kinds`: a stated range,
    an image's pixel range, token ids below the vocabulary); ``input_ranges`` (``--input-range``)
    are drawn uniformly in any case.
    Dynamic dims take ``input_shapes`` (bound: :func:`amp_compiler.onnx.costs.costs.bind_input_shapes`) or 1.
    Samples that would hold more than ``max_bytes`` together are refused (:class:`SampleSizeError`)
    before anything is allocated.
    """
    total = sample_bytes(model, input_shapes) * n  # an UngeneratedInputError for inputs not tensors
    if total > max_bytes:
        raise SampleSizeError(
            f"random inputs of these shapes take {format_bytes(total)}, more than the {format_bytes(max_bytes)} "
            "generated or calibration inputs may take"
        )
    kinds = input_kinds(model, input_ranges) if informed else {
        name: InputKind("range", (lo, hi), "stated") for name, (lo, hi) in (input_ranges or {}).items()
    }
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        sample = {}
        for info in model_inputs(model):
            shape = input_shape(info, input_shapes)
            dtype = onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
            kind = kinds.get(info.name)
            if kind is not None and kind.kind == "range" and np.issubdtype(dtype, np.floating):
                sample[info.name] = rng.uniform(kind.bounds[0], kind.bounds[1], shape).astype(dtype)
            elif kind is not None and kind.kind == "value":
                sample[info.name] = np.full(shape, kind.bounds[0], dtype)
            elif kind is not None and kind.kind == "beyond":  # the longest token input's length and more
                longest = max((input_shape(i, input_shapes)[-1] for i in model_inputs(model)
                               if _rank(i) == 2 and i.type.tensor_type.elem_type in _INTEGER_TYPES), default=0)
                sample[info.name] = np.full(shape, longest + int(kind.bounds[0]), dtype)
            elif kind is not None and kind.kind == "positions" and np.issubdtype(dtype, np.integer) and shape:
                sample[info.name] = np.broadcast_to(np.arange(shape[-1], dtype=dtype), shape).copy()
            elif kind is not None and kind.kind == "ids" and np.issubdtype(dtype, np.integer):
                sample[info.name] = rng.integers(0, int(kind.bounds[1]), shape).astype(dtype)
            elif np.issubdtype(dtype, np.floating):
                sample[info.name] = rng.standard_normal(shape).astype(dtype)
            else:
                sample[info.name] = np.ones(shape, dtype)
        out.append(sample)
    return out


@dataclasses.dataclass(frozen=True)
class InputKind:
    """What generated values an input takes: ``range`` (uniform floats in ``bounds``), ``ids``
    (integers in ``[0, bounds[1])``), ``positions`` (0, 1, 2... along the last dim), ``value``
    (``bounds[0]`` everywhere) or ``beyond`` (the longest token input's length plus ``bounds[0]``: a
    generation's length limit), and why (``stated``, ``image 0..1``, ``vocabulary``...)."""

    kind: str
    bounds: tuple[float, float]
    why: str


#: Ops that normalize an image input; a constant operand above this says pixels are 0..255.
_NORMALIZE_OPS = frozenset({"Sub", "Div", "Mul", "Add"})
_PIXEL_SCALE = 2.0
#: A scalar integer input named like an audio sample rate takes 16 kHz (speech models: Silero VAD
#: refuses any other rate but 8 kHz).
_SAMPLE_RATE = re.compile(r"sr|sample_?rate|sampling_?rate", re.IGNORECASE)
#: An integer input named like bytes takes byte values 0..255 (a file-type classifier's input: Magika).
_BYTES = re.compile(r"bytes?|byte_ids|input_bytes", re.IGNORECASE)
#: An integer input named like position ids counts 0, 1, 2... (a prompt's positions; a random id
#: would put tokens at arbitrary places, ones all at the same one).
_POSITIONS = re.compile(r"(\w*_)?pos(ition)?_?ids?", re.IGNORECASE)
#: A float waveform (``[batch, samples]`` or ``[samples]``) in a model with a sample-rate input, or named
#: like audio, is audio scaled to -1..1 (what decoders and speech front ends produce).
_AUDIO = re.compile(r"audio|wave(form)?|speech|pcm|input_values|samples", re.IGNORECASE)
#: An integer scalar named like a generation's length limit (onnxruntime's GreedySearch/BeamSearch
#: ``max_length``) is the prompt's length plus :data:`GENERATED_TOKENS`: ones (a limit of 1, below any
#: prompt) made every run refuse; floats named like penalties or a temperature are 1, neutral.
_MAX_LENGTH = re.compile(r"max_(length|new_tokens)", re.IGNORECASE)
_NEUTRAL = re.compile(r"(repetition_|length_)?penalty|temperature", re.IGNORECASE)
GENERATED_TOKENS = 16
_INTEGER_TYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64})
#: A KV cache, by its name or its dims' (not an image whatever its dim 1: its heads).
_CACHE = re.compile(r"past|present|cache|key_?values?", re.IGNORECASE)
_CACHE_DIM = re.compile(r"past|seq|length|total", re.IGNORECASE)
_CHANNELS = re.compile(r"channel", re.IGNORECASE)
#: Ops an index input may pass through on its way to an embedding Gather.
_INDEX_PATH = frozenset({"Cast", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten"})


def input_kinds(
    model: onnx.ModelProto, input_ranges: Mapping[str, tuple[float, float]] | None = None
) -> dict[str, InputKind]:
    """What is known of each graph input's values, from the options and the graph: a stated range
    (``--input-range``); a 4-D float input with 1, 3 or 4 channels is an image: when an op that reads it
    normalizes it (Sub, Div, Mul, Add), 0..255 if a constant operand is above 2 (a mean of 127.5 or
    123.7, a scale of 255), else 0..1; when none does, the model takes normalized images (the
    normalization lives in its preprocessing: PP-OCR, torchvision exports): -1..1 (a (x - 0.5) / 0.5
    normalization exactly; half of ImageNet's mean/std range, -2.1..2.6); a float waveform
    (:func:`waveform_inputs`) is -1..1; an integer input named like position ids counts 0, 1, 2...;
    one read (through Casts and reshapes) as the indices of a Gather on an initializer table is token
    ids below the table's first dim; one named like bytes takes 0..255; a scalar integer named like a
    sample rate (``sr``) is 16000; a generation's length limit (``max_length``) the prompt's length plus
    :data:`GENERATED_TOKENS`; a float penalty or temperature 1. Other inputs are not in the result
    (:func:`random_samples` gives floats N(0, 1), integers 1: masks of ones, booleans True)."""
    stated = dict(input_ranges or {})
    consumers: dict[str, list[onnx.NodeProto]] = {}
    inits: dict[str, onnx.TensorProto] = {}
    for graph in _graphs(model.graph):  # a merged decoder looks its tokens up inside an If
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        inits.update((i.name, i) for i in graph.initializer)
    kinds: dict[str, InputKind] = {}
    waveforms = waveform_inputs(model)
    for info in model_inputs(model):
        tt = info.type.tensor_type
        if not info.type.HasField("tensor_type") or not tt.elem_type:  # a sequence, an optional: no tensor
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if info.name in stated:
            kinds[info.name] = InputKind("range", tuple(stated[info.name]), "stated")  # type: ignore[arg-type]
        elif np.issubdtype(dtype, np.floating) and image_like(info):
            readers = consumers.get(info.name, ())
            top = max((_constant_absmax(n, info.name, inits) for n in readers), default=0.0)
            if not any(n.op_type in _NORMALIZE_OPS for n in readers):
                kinds[info.name] = InputKind("range", (-1.0, 1.0), "normalized image -1..1")
            elif top > _PIXEL_SCALE:
                kinds[info.name] = InputKind("range", (0.0, 255.0), "image 0..255")
            else:
                kinds[info.name] = InputKind("range", (0.0, 1.0), "image 0..1")
        elif info.name in waveforms:
            kinds[info.name] = InputKind("range", (-1.0, 1.0), "waveform -1..1")
        elif np.issubdtype(dtype, np.integer):
            vocab = _vocabulary(info.name, consumers, inits)
            if _POSITIONS.fullmatch(info.name) and _rank(info) >= 1:
                kinds[info.name] = InputKind("positions", (0.0, 0.0), "positions 0, 1, 2...")
            elif vocab:
                kinds[info.name] = InputKind("ids", (0.0, float(vocab)), "vocabulary")
            elif _BYTES.fullmatch(info.name):
                kinds[info.name] = InputKind("ids", (0.0, 256.0), "byte values")
            elif _SAMPLE_RATE.fullmatch(info.name) and not (tt.HasField("shape") and tt.shape.dim):
                kinds[info.name] = InputKind("value", (16000.0, 16000.0), "sample rate 16000")
            elif _MAX_LENGTH.fullmatch(info.name) and _rank(info) <= 1:
                kinds[info.name] = InputKind(
                    "beyond", (GENERATED_TOKENS, GENERATED_TOKENS), f"the prompt's length + {GENERATED_TOKENS}")
        elif _NEUTRAL.fullmatch(info.name) and _rank(info) <= 1:
            kinds[info.name] = InputKind("value", (1.0, 1.0), "1 (no penalty, no scaling)")
    return kinds


def image_inputs(
    model: onnx.ModelProto, input_ranges: Mapping[str, tuple[float, float]] | None = None
) -> dict[str, tuple[float, float]]:
    """The inputs :func:`input_kinds` takes for images (4-D floats of 1, 3 or 4 channels whose range no
    option states), with their pixel range."""
    kinds = input_kinds(model, input_ranges)
    return {
        info.name: kinds[info.name].bounds for info in model_inputs(model)
        if info.name in kinds and info.name not in (input_ranges or {}) and image_like(info)
        and np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type), np.floating)
    }


def waveform_inputs(model: onnx.ModelProto) -> set[str]:
    """The float inputs of rank 1 or 2 (``[samples]``, ``[batch, samples]``) that are audio: the model
    has a scalar sample-rate input (``sr``), or the input or its last dim is named like audio
    (``waveform``, ``speech``; openWakeWord's melspectrogram: ``input [batch_size, samples]``)."""
    inputs = model_inputs(model)
    rate = any(_SAMPLE_RATE.fullmatch(i.name) and _rank(i) == 0 for i in inputs)
    return {
        i.name for i in inputs
        if 1 <= _rank(i) <= 2 and np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type),
                                                np.floating)
        and (rate or _AUDIO.search(i.name) or _AUDIO.search(i.type.tensor_type.shape.dim[-1].dim_param))
    }


def _rank(info: onnx.ValueInfoProto) -> int:
    tt = info.type.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else -1


def image_channels(info: onnx.ValueInfoProto) -> int | None:
    """The channels of an image input: a 4-D input whose dim 1 is 1, 3 or 4 (3 where it is named like
    channels: Optimum's ``num_channels``), and that is not a KV cache, whose dim 1 is its heads (GPT-2's
    and T5's 4) and which is named like one (``past_key_values.0.key``) or has a dim named like a
    sequence (``past_sequence_length``); None for any other input."""
    tt = info.type.tensor_type
    dims = tt.shape.dim if tt.HasField("shape") else []
    if len(dims) != 4 or _CACHE.search(info.name) or any(_CACHE_DIM.search(d.dim_param) for d in dims if d.dim_param):
        return None
    if dims[1].HasField("dim_value") and dims[1].dim_value in (1, 3, 4):
        return int(dims[1].dim_value)
    return 3 if _CHANNELS.search(dims[1].dim_param) else None


def image_like(info: onnx.ValueInfoProto) -> bool:
    """An image input (:func:`image_channels`)."""
    return image_channels(info) is not None


def _constant_absmax(node: onnx.NodeProto, name: str, inits: Mapping[str, onnx.TensorProto]) -> float:
    """The largest |x| of an initializer operand of a normalizing ``node`` that reads ``name`` (0: none)."""
    if node.op_type not in _NORMALIZE_OPS:
        return 0.0
    top = 0.0
    for other in node.input:
        init = inits.get(other)
        if other != name and init is not None and math.prod(init.dims) <= 64:
            array = onnx.numpy_helper.to_array(init)
            if array.size and np.issubdtype(array.dtype, np.floating):
                top = max(top, float(np.max(np.abs(array))))
    return top


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and its subgraphs (If branches, Loop and Scan bodies), parents first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs):
                yield from _graphs(sub)


def _vocabulary(name: str, consumers: Mapping[str, list[onnx.NodeProto]], inits: Mapping[str, onnx.TensorProto]) -> int:
    """The smallest first dim of the initializer tables ``name`` indexes through Gathers (0: none)."""
    sizes: list[int] = []
    stack, seen = [name], {name}
    while stack:
        value = stack.pop()
        for node in consumers.get(value, ()):
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == value:
                table = inits.get(node.input[0])
                axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
                if table is not None and axis == 0 and table.dims:
                    sizes.append(int(table.dims[0]))
            elif node.op_type in _INDEX_PATH and node.input and node.input[0] == value:
                for out in node.output:
                    if out not in seen:
                        seen.add(out)
                        stack.append(out)
    return min(sizes, default=0)
