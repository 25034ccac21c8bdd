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

import math
import os
import stat
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np
import onnx
import onnx.numpy_helper

from amp_compiler.errors import AmpUserError
from amp_compiler.runtime.input_kinds import INTEGER_TYPES, InputKind, input_kinds, model_inputs, rank
from amp_compiler.runtime.input_uses import graph_uses, notable_ids
from amp_compiler.runtime.string_inputs import string_values
from amp_compiler.runtime.value_patterns import additive_mask, log_spaced, padded_tail
from amp_compiler.sizes import format_bytes

__all__ = [
    "MAX_SAMPLE_BYTES", "CalibrationDataError", "SampleSizeError", "UngeneratedInputError", "input_shape",
    "NOTABLE_LARGEST", "NOTABLE_LOWEST", "end_with", "load_samples", "random_samples", "read_npz", "sample_bytes",
    "sample_files", "tensors_only",
]

#: The most bytes all calibration samples together may hold (they are kept in memory).
MAX_SAMPLE_BYTES = 4 * 2**30
#: Kinds of arrays a model input can take: bool, signed and unsigned integers, floats.
_KINDS = frozenset("biufU")  # numbers, and strings (fixed-width, no pickle)


class CalibrationDataError(AmpUserError):
    """Calibration data that is missing, unreadable or does not match the model's inputs."""


class SampleSizeError(AmpUserError):
    """Generated inputs would hold more than samples may (their shapes were given too large)."""


class UngeneratedInputError(SampleSizeError):
    """The model takes an input of a type generated inputs are not made of (a sequence, an optional, a map:
    they are tensors); caught wherever generated inputs cannot be made, as :class:`SampleSizeError` is."""


def tensors_only(model: onnx.ModelProto) -> None:
    """Raise :class:`UngeneratedInputError` for the first graph input that is not a tensor."""
    for info in model_inputs(model):
        kind = info.type.WhichOneof("value")
        if kind != "tensor_type":
            what = (kind or "untyped").removesuffix("_type")
            raise UngeneratedInputError(
                f"input {info.name!r} is of {what} type, and generated inputs are tensors: give the inputs as data")


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
    if tt.elem_type == onnx.TensorProto.STRING and dtype.kind != "U":
        raise CalibrationDataError(
            f"{origin}: input {name!r} is {dtype}, the model expects strings (a numpy str array)")
    if dtype != expected and tt.elem_type != onnx.TensorProto.STRING:
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
            what = "Python objects (a pickle: save strings as a str array, np.array(texts, dtype=str))" \
                if dtype.hasobject else f"{dtype}, not numbers or strings"
            raise CalibrationDataError(f"{origin}: {key!r} holds {what}")
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
    array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
    if dtype.kind == "U":  # strings, as onnxruntime takes them: an object array of str
        array = array.astype(object)
    return key, array


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
    tensors_only(model)
    total = 0
    for info in model_inputs(model):
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)).itemsize
        total += math.prod(input_shape(info, input_shapes)) * itemsize
    return total


def _below(values: np.ndarray, top: int, dtype: np.dtype) -> np.ndarray:
    """Integers ``values`` (each below ``top``) in ``dtype``; in a float type too narrow to hold them all (FP16
    above 2048), each rounded up to ``top`` or past it is the largest value of the type below ``top`` instead."""
    out = values.astype(dtype)
    if np.issubdtype(dtype, np.floating) and top > 0:
        largest = np.asarray(top, dtype)
        while largest >= top:
            largest = np.nextafter(largest, np.asarray(0, dtype))
        out = np.minimum(out, np.floor(largest)).astype(dtype)
    return out


def random_samples(
    model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None, n: int = 1, seed: int = 0,
    *, max_bytes: int = MAX_SAMPLE_BYTES, informed: bool = False,
    input_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> list[dict[str, np.ndarray]]:
    """Inputs for a model when no data is given: floats ~ N(0, 1), integers 1, booleans True.

    With ``informed`` they follow what is known of each input (:func:`input_kinds`: a stated range,
    an image's pixel range, token ids below the vocabulary (integral floats for a float input
    the graph casts to integers), a diffusion model's latents N(0, sigma) and
    timesteps 0..999, an input whose readers need it positive log-spaced, an additive attention mask causal and
    padded, a bool mask with a padded tail: :mod:`~amp_compiler.runtime.value_patterns`); ``input_ranges``
    (``--input-range``) are drawn uniformly in any case.
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
    notable: dict[str, list[int]] = {}  # an ids input's notable ids (:func:`_notable`), found once
    out = []
    for _ in range(n):
        sample = {}
        for info in model_inputs(model):
            shape = input_shape(info, input_shapes)
            dtype = onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type)
            kind = kinds.get(info.name)
            if kind is not None and kind.kind == "range" and np.issubdtype(dtype, np.floating):
                sample[info.name] = rng.uniform(kind.bounds[0], kind.bounds[1], shape).astype(dtype)
            elif kind is not None and kind.kind == "normal" and np.issubdtype(dtype, np.floating):
                sample[info.name] = rng.normal(kind.bounds[0], kind.bounds[1], shape).astype(dtype)
            elif kind is not None and kind.kind == "range" and np.issubdtype(dtype, np.integer):
                low, high = math.ceil(kind.bounds[0]), math.floor(kind.bounds[1])
                sample[info.name] = rng.integers(low, high, shape, endpoint=True).astype(dtype)
            elif kind is not None and kind.kind == "positive" and np.issubdtype(dtype, np.floating):
                sample[info.name] = log_spaced(kind.bounds, shape, rng).astype(dtype)
            elif kind is not None and kind.kind == "additive" and np.issubdtype(dtype, np.floating):
                sample[info.name] = additive_mask(shape, kind.bounds[0], dtype)
            elif kind is not None and kind.kind == "padded" and dtype == np.bool_:
                sample[info.name] = padded_tail(shape)
            elif kind is not None and kind.kind == "value":
                sample[info.name] = np.full(shape, kind.bounds[0], dtype)
            elif kind is not None and kind.kind == "beyond":  # the longest token input's length and more
                longest = max((input_shape(i, input_shapes)[-1] for i in model_inputs(model)
                               if rank(i) == 2 and i.type.tensor_type.elem_type in INTEGER_TYPES), default=0)
                sample[info.name] = np.full(shape, longest + int(kind.bounds[0]), dtype)
            elif kind is not None and kind.kind == "positions" and np.issubdtype(dtype, np.integer) and shape:
                # consecutive, ending at the stated top (a decoding step's positions), else from 0
                start = max(math.ceil(kind.bounds[0]), math.floor(kind.bounds[1]) + 1 - shape[-1])
                sample[info.name] = np.broadcast_to(np.arange(start, start + shape[-1], dtype=dtype), shape).copy()
            elif kind is not None and kind.kind == "words" and kind.vocabulary is not None:
                sample[info.name] = string_values(kind.vocabulary, shape, rng)
            elif kind is not None and kind.kind in ("ids", "index"):  # a float cast to integers: integral floats
                sample[info.name] = _below(rng.integers(0, int(kind.bounds[1]), shape), int(kind.bounds[1]), dtype)
                if kind.kind == "ids" and shape:
                    if info.name not in notable:
                        notable[info.name] = _notable(model, info.name)
                    end_with(sample[info.name], notable[info.name])
            elif np.issubdtype(dtype, np.floating):
                sample[info.name] = rng.standard_normal(shape).astype(dtype)
            else:
                sample[info.name] = np.ones(shape, dtype)
        out.append(sample)
    return out


#: Token ids every generated ids input holds (:func:`~amp_compiler.runtime.input_uses.notable_ids`): the
#: vocabulary's first ids and the rows of largest norm of its tables. A probe drawing 128 ids of 32,000 at
#: random sees 0.4% of them; a value that overflows FP16 at one token only (a T5's FFN at </s>, id 1, as
#: massive activations sit at a trained LLM's special and delimiter tokens) was never probed: stated 0.05%
#: of range, every logit NaN on text that holds the token. They take a row's last positions: the draw before
#: them is another, and what the probe states of a model that errs on a few rare tokens moves with it (the
#: catalog's llama-massive-activations-small: 1.15% stated before, its worst token 46x the rest, warned;
#: 0.13% now, 5x; 8 draws of 128 tokens gave 0.05-1.15%, its converted model is the same).
NOTABLE_LOWEST, NOTABLE_LARGEST = 8, 8


def _notable(model: onnx.ModelProto, name: str) -> list[int]:
    """The ids input ``name``'s notable ids (:data:`NOTABLE_LOWEST`, :data:`NOTABLE_LARGEST`)."""
    uses = graph_uses(model)
    return notable_ids(name, uses.consumers, uses.inits, NOTABLE_LOWEST, NOTABLE_LARGEST)


def end_with(ids: np.ndarray, notable: list[int]) -> None:
    """Write ``notable`` ids into every row of ``ids`` along its last axis, at its end (the start keeps its
    draw: a start token's place), at most half the row, in place."""
    room = max(0, min(len(notable), ids.shape[-1] // 2))
    if room:
        ids[..., ids.shape[-1] - room:] = np.asarray(notable[:room], ids.dtype)

