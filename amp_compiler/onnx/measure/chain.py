"""A model loaded as a chain of pieces with every main-graph float tensor exposed (:class:`ModelChain`):
what calibration folds statistics over and ``--tolerance`` folds errors over, in the runner's child.

onnxruntime keeps every graph output of a run alive until the run ends, so one session of a model
whose tensors are all outputs holds every activation at once. The chain's pieces
(:mod:`amp_compiler.onnx.measure.pieces`, cut by the tensors' sizes at a sample's dims) run one after
the other (:meth:`~amp_compiler.runtime.session.Runner.fold`, :meth:`~amp_compiler.runtime.session.Runner.compare`):
one piece's tensors (two where one is folded while the next runs) and the values between pieces are
alive, not every activation of a run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Collection, Iterator, Mapping

import numpy as np
import onnx
from google.protobuf.message import Message
from onnx import numpy_helper

from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.errors import ModelRefusedError
from amp_compiler.onnx.measure.pieces import chain_pieces, live_bytes
from amp_compiler.runtime.runner import Runner, Session

__all__ = ["LEAST_PIECE_BYTES", "ModelChain", "as_input", "exposed_model", "session_feeds"]

# onnxruntime's Python binding cannot return bfloat16 outputs ("No corresponding Numpy type"): an
# emulated BF16 model's rounded copies are exposed in FP32 instead (amp_compiler.onnx.measure.emulate).
EXPOSED_TYPES = FLOAT_TYPES - {onnx.TensorProto.BFLOAT16}
#: Element types onnxruntime's Python binding cannot hand over (bfloat16, the float8 and 4-bit types): no
#: value of these crosses between pieces.
_UNRETURNED = frozenset(
    getattr(onnx.TensorProto, name) for name in (
        "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4", "INT4", "FLOAT4E2M1",
    ) if hasattr(onnx.TensorProto, name)
)
_SIZED = frozenset(set(onnx.helper.get_all_tensor_dtypes()) - {onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED})
#: Float initializers whose values take at least this many bytes are left out of the copy shape inference
#: reads (their dims stay).
_STUB_BYTES = 1024


def exposed_model(model: onnx.ModelProto, unexposed: Collection[str] = ()) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose main-graph float tensors (but bfloat16 ones, which onnxruntime cannot
    return, and ``unexposed`` ones that are no graph output) are all graph outputs, and their names.
    Tensors onnx's shape inference leaves untyped (downstream of onnxruntime's contrib ops) take the
    type their ops' schemas imply."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    existing = {o.name for o in inferred.graph.output} | set(unexposed)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info
             if vi.type.HasField("tensor_type")}
    # sequences, optionals and maps are no tensors: a schema's element type must not make them one
    other = {vi.name for vi in inferred.graph.value_info if not vi.type.HasField("tensor_type")}
    untyped = [name for node in inferred.graph.node for name in node.output
               if name and name not in existing and name not in types and name not in other]
    if untyped:
        types.update(_schema_types(inferred, set(untyped)))
    extra = []
    for node in inferred.graph.node:
        for name in node.output:
            if name and name not in existing and types.get(name) in EXPOSED_TYPES:
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
            if v.name in names and v.dtype is not None and (v.type is None or isinstance(v.type, ir.TensorType))}


def session_feeds(sample: Mapping[str, np.ndarray], types: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The arrays of ``sample`` a session takes (``types``: its inputs' onnxruntime types, by name), each
    in the type it takes (:func:`as_input`)."""
    return {k: as_input(v, types[k]) for k, v in sample.items() if k in types}


def as_input(array: np.ndarray, ort_type: str) -> np.ndarray:
    """A float sample array in the float type the session's input takes (an FP16 input of a model
    converted without keeping its I/O types; the FP32 input emulation makes of a model's FP16 one:
    exact); anything else as it is."""
    if ort_type == "tensor(float16)" and np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float16)
    if ort_type == "tensor(float)" and np.issubdtype(array.dtype, np.floating) and array.dtype != np.float32:
        return array.astype(np.float32)
    return array


class ModelChain:
    """``model``'s pieces loaded into ``runner``, every main-graph float tensor exposed (``names``: the
    exposed tensors, the graph outputs first), cut by their sizes at ``sample``'s dims so that ``at_once``
    pieces' outputs hold no more than the model's live activations; ``inputs``: the graph inputs the chain
    takes, with their onnxruntime types; ``runs``: runs counted by the caller. ``prepack``: False where the
    chain runs a few times only (:meth:`~amp_compiler.runtime.session.Runner.load`: the kernels then pack
    their weights on each run, not once at the load); ``unexposed``: tensors not exposed (but where a
    piece hands them to a later one: ``names`` then lacks them, the pieces' outputs do not)."""

    def __init__(self, model: onnx.ModelProto, runner: Runner, sample: Mapping[str, np.ndarray], *,
                 at_once: int = 1, prepack: bool = True, unexposed: Collection[str] = ()):
        light, stubbed = _weightless(model, sample)
        exposed, self.names = exposed_model(light, unexposed)
        sizes = _sizes(light, exposed)
        del light
        shapes = _shapes(_weightless(model, {})[0])
        # the model's own live bytes (in ``exposed`` every tensor is an output), shared by the pieces whose
        # outputs the runner holds at once (``at_once``: 2 where it folds one while the next runs)
        budget = max(live_bytes(model, sizes) // at_once, LEAST_PIECE_BYTES)
        joined = {v.name for v in exposed.graph.value_info if v.type.tensor_type.elem_type in _UNRETURNED}
        self._weights = _WeightFile(model, stubbed)
        # basic: see runner_child.session_options. Prepacked weights kept where the values are compared with
        # the FP32 model's: without, onnxruntime's LSTM takes another GEMM path, and its outputs differ in
        # the last bits
        def load(pieces: Iterator[onnx.ModelProto]) -> list[Session]:
            return runner.load_chain(_with_weights(pieces, exposed, model, self._weights), basic=True, chained=True,
                                     data_folder=self._weights.folder, prepack=prepack)

        try:
            try:
                self.sessions = load(chain_pieces(exposed, self.names, sizes, budget, joined, shapes))
            except ModelRefusedError:  # a piece onnxruntime refuses: the model whole, as it loads it
                self.sessions = load(iter([exposed]))
        finally:  # the sessions hold what they read (mapped pages outlive the file): nothing is left behind
            self._weights.remove()
        graph_inputs = {i.name for i in model.graph.input}
        self.inputs = {n: t for s in self.sessions for n, t in zip(s.input_names, s.input_types, strict=True)
                       if n in graph_inputs}
        self.runs = 0

    def feeds(self, sample: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The arrays of ``sample`` the chain takes, in the types it takes them (:func:`as_input`)."""
        return session_feeds(sample, self.inputs)

    def close(self) -> None:
        for session in self.sessions:
            session.close()
        self.sessions = []


#: Pieces are cut at the live bytes' share (``at_once``), but not smaller than this: a piece's run costs
#: onnxruntime's per-run work and a session's load whatever its size, and below a few MB of outputs that
#: is most of it (BERT's small catalog entry: 64 pieces, 3 runs in 0.11 s, against 3 pieces in 0.04
#: s), while two pieces of this size are nothing against a model whose live bytes are many times it
#: (ViT-B's chain: 61 pieces, its child's peak 431 MB, against 280 pieces and 442 MB at its 1.4 MB share).
LEAST_PIECE_BYTES = 8 << 20
#: Where the chain's weights file goes: memory (tmpfs) where the system has it.
_SHARED_MEMORY = "/dev/shm"
_WEIGHTS = "weights.bin"
_ALIGN = 4096  # each weight starts on a page: onnxruntime maps it from the file


class _WeightFile:
    """The weights :func:`_weightless` left out of ``model`` (``stubbed``), written once into a file of a
    new folder that the pieces refer to as external data: each piece's session maps them from there, and
    no weight is serialized into a piece, sent through the runner's pipe or copied into a session's bytes
    (a ViT-B's 346 MB took 2-3 s so, on 2 cores). The folder is in memory (``/dev/shm``) where that has
    room for them twice over (a container's is often 64 MB), else in the temporary folder; where neither
    can take them (the write fails), there is no file (``folder`` None, no ``places``) and the pieces
    carry their weights as before. The file is removed once the sessions are made (a tmpfs file holds
    memory until it is)."""

    def __init__(self, model: onnx.ModelProto, stubbed: set[str]):
        self.folder: str | None = None
        self.places: dict[str, tuple[int, int]] = {}  # name -> (offset, length)
        self.weights = {t.name: t for t in model.graph.initializer if t.name in stubbed}
        needed = sum(_value_bytes(t) + _ALIGN for t in self.weights.values())
        if not needed:
            return
        try:
            self.folder = tempfile.mkdtemp(prefix="amp-chain-", dir=_room(_SHARED_MEMORY, 2 * needed))
            with open(os.path.join(self.folder, _WEIGHTS), "wb") as f:
                for t in self.weights.values():
                    data = t.raw_data if t.HasField("raw_data") else numpy_helper.to_array(t).tobytes()
                    f.write(b"\0" * (-f.tell() % _ALIGN))
                    self.places[t.name] = (f.tell(), len(data))
                    f.write(data)
                    del data
        except OSError:  # no room (ENOSPC), no folder: the pieces carry their weights
            self.remove()
            self.places.clear()
        except BaseException:
            self.remove()
            raise

    def put(self, tensor: onnx.TensorProto) -> None:
        """Give the stub ``tensor`` (its name, type and dims) its values: a reference to the file, or where
        there is none, the values themselves."""
        if tensor.name not in self.places:
            tensor.CopyFrom(self.weights[tensor.name])
            return
        offset, length = self.places[tensor.name]
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", _WEIGHTS), ("offset", str(offset)), ("length", str(length))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value

    def remove(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def _room(folder: str, needed: int) -> str | None:
    """``folder`` where it is a writable folder with ``needed`` bytes free, else None (the default
    temporary folder)."""
    try:
        stat = os.statvfs(folder)
    except (OSError, AttributeError):  # no such folder, or no statvfs (Windows)
        return None
    return folder if os.access(folder, os.W_OK) and stat.f_bavail * stat.f_frsize >= needed else None


def _with_weights(
    pieces: Iterator[onnx.ModelProto], exposed: onnx.ModelProto, model: onnx.ModelProto, weights: _WeightFile
) -> Iterator[onnx.ModelProto]:
    """``pieces`` (of ``exposed``, :func:`_weightless`'s copy of ``model`` with every tensor exposed) with
    their stubbed weights put back (:meth:`_WeightFile.put`), one at a time; a single piece takes ``model``'s
    own inputs (no shapes bound to the sample)."""
    for piece in pieces:
        if piece is exposed:
            del piece.graph.input[:], piece.graph.value_info[:]
            piece.graph.input.extend(model.graph.input)
        for t in piece.graph.initializer:
            if t.name in weights.weights:
                weights.put(t)
        yield piece


def _weightless(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]) -> tuple[onnx.ModelProto, set[str]]:
    """A copy of ``model`` whose large float initializers hold their dims but no values (shape inference
    reads no more; the weights are not copied), and whose inputs' dims are ``sample``'s (so that shape
    inference gives every tensor's size, for cutting the pieces by size); and the names of those
    initializers. Their size is their dims' (protobuf's ``ByteSize`` encodes the whole message to
    count it: 0.6 s for a model of 350 MB of weights)."""
    light = onnx.ModelProto()
    _copy_fields(model, light, skip="graph")
    graph = light.graph
    _copy_fields(model.graph, graph, skip="initializer")
    stubbed = set()
    for t in model.graph.initializer:
        if t.data_type in EXPOSED_TYPES and t.data_location != t.EXTERNAL and _value_bytes(t) >= _STUB_BYTES:
            graph.initializer.append(onnx.TensorProto(name=t.name, data_type=t.data_type, dims=t.dims))
            stubbed.add(t.name)
        else:
            graph.initializer.append(t)
    for value in graph.input:
        given = sample.get(value.name)
        dims = value.type.tensor_type.shape.dim
        if given is not None and value.type.HasField("tensor_type") and len(dims) == given.ndim:
            for d, size in zip(dims, given.shape, strict=True):
                d.dim_value = int(size)
    return light, stubbed


def _value_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes of a float tensor's values, from its dims and element type."""
    return int(np.prod(tensor.dims)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


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


def _shapes(unbound: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """The types of ``unbound``'s main-graph tensors (a weightless copy of the model at its own inputs'
    dims) with the shapes onnx's inference gives them there: what holds for every sample, which the
    pieces' inputs declare (:func:`amp_compiler.onnx.measure.pieces.chain_pieces`); none where inference
    fails."""
    try:
        inferred = onnx.shape_inference.infer_shapes(unbound, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):
        return {}
    graph = inferred.graph
    return {v.name: v.type for v in (*graph.input, *graph.value_info, *graph.output)}


def _sizes(light: onnx.ModelProto, exposed: onnx.ModelProto) -> dict[str, int]:
    """Bytes of each main-graph tensor of ``light`` (:func:`_weightless`: its inputs sized as the sample's)
    from onnx's shape inference with data propagation, which follows the shapes a graph computes
    (``Shape -> Gather -> Concat -> Reshape``, as exporters write every transformer's head split): plain
    inference (``exposed``'s, which falls back to it where data propagation fails) sized 23 of ViT-B's 422
    tensors, and a piece whose outputs' sizes are unknown is cut by its node count alone (48 nodes: 50
    MB of outputs, ViT-B's chain's child 498 MB at its peak against 465 MB)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(light, strict_mode=False, data_prop=True)
    except (onnx.shape_inference.InferenceError, ValueError, RuntimeError):  # an op's data propagation refused
        return _tensor_bytes(exposed)
    return _tensor_bytes(inferred)


def _tensor_bytes(model: onnx.ModelProto) -> dict[str, int]:
    """Bytes of each main-graph tensor whose shape inference found a static shape."""
    out = {}
    for value in (*model.graph.input, *model.graph.value_info, *model.graph.output):
        tensor = value.type.tensor_type
        dims = tensor.shape.dim
        static = value.type.HasField("tensor_type") and tensor.HasField("shape")
        if static and all(d.HasField("dim_value") for d in dims):
            known = tensor.elem_type in _SIZED
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).itemsize if known else 4
            out[value.name] = itemsize * int(np.prod([d.dim_value for d in dims]))
    return out
