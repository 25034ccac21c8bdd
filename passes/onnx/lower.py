"""Lower a precision plan onto the ONNX model.

Guarantees:
- every slot gets the dtype its vertex was given: node outputs and graph inputs are retyped, the
  attributes that set an output's type (Cast ``to``, ConstantOfShape ``value``, ``dtype``) follow;
- where a tensor's dtype differs from what a user needs, exactly one Cast per (tensor, dtype) is
  inserted right after the tensor's producer (or at the top of its graph), shared by all users in
  every nested subgraph;
- constants are converted offline, never through a Cast node: in place when every user wants the
  new dtype, else as one converted copy per dtype;
- graph outputs keep their names: when an output needs a Cast, the Cast's output takes the name;
- nothing else changes (names, metadata, functions, attributes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import BinaryIO

import ml_dtypes
import numpy as np
import onnx
import onnx.defs
import onnx_ir as ir

from amp_compiler.core.graph import SlotKind
from amp_compiler.core.plan import PrecisionPlan
from amp_compiler.dtypes import FLOAT_TYPES, short_name
from amp_compiler.onnx.graph.precision_graph import OnnxPrecisionGraph
from amp_compiler.onnx.ir.constants import SCREEN_BYTES, constant_array, raw_float32_bytes
from amp_compiler.onnx.ir.slots import Slot
from amp_compiler.onnx.ir.walk import home_graph, is_constant, iter_graphs
from amp_compiler.onnx.load.deferred import DeferredTensor

__all__ = ["CastRecord", "ConvertedConstant", "LowerPlanPass", "cast_to", "raw_bytes"]

_NUMPY: dict[ir.DataType, np.dtype] = {
    ir.DataType.FLOAT: np.dtype(np.float32),
    ir.DataType.DOUBLE: np.dtype(np.float64),
}


def numpy_dtype(dtype: ir.DataType) -> np.dtype:
    """The numpy dtype of an element type (ml_dtypes' for bfloat16)."""
    found = _NUMPY.get(dtype)
    if found is not None:
        return found
    return np.dtype(dtype.numpy())


def _attribute_types(node: ir.Node) -> dict[str, ir.AttributeType]:
    """The node's schema attributes and their types (empty without a schema)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, node.version or 100, node.domain)
    except onnx.defs.SchemaError:
        return {}
    # onnx's stubs type AttrType without __int__; it is an int enum.
    return {name: ir.AttributeType(int(a.type)) for name, a in schema.attributes.items()}  # type: ignore[call-overload]


def raw_bytes(array: np.ndarray) -> memoryview:
    """An array's values as ONNX stores them in ``raw_data`` (little-endian), from its own buffer
    where it can (no copy into a bytes object)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.byteorder == ">":
        flat = flat.byteswap()
    return flat.view(np.uint8).data


class ConvertedConstant(ir.LazyTensor):
    """A constant's tensor in another dtype, converted each time its values are read (when the model
    is serialized, or by a later pass), so that no converted copy is kept and a constant still on
    disk is read only then. ``rewrite``: values below the target's lowest finite value that stand
    for -infinity (an attention mask) become this one."""

    __slots__ = ("_source", "_rewrite", "_bytes")

    def __init__(
        self, source: ir.TensorProtocol, dtype: ir.DataType, name: str | None, rewrite: float | None = None
    ):
        # No thunk: _evaluate is this class's own. The source's shape is an onnx_ir Shape.
        super().__init__(None, dtype, source.shape, name=name, doc_string=source.doc_string)  # type: ignore[arg-type]
        self._source = source
        self._rewrite = rewrite
        self._bytes: bytes | None = None  # set by convert_together, read once by tobytes

    @staticmethod
    def convert_together(tensors: Iterable[ConvertedConstant]) -> None:
        """Convert many FP32 constants held as raw bytes in the model, a group of about
        ``SCREEN_BYTES`` of one target type at a time, in one numpy call over the group's
        concatenated bytes (per tensor, numpy's own overhead is most of the cost; one call for all
        would copy every weight at once); each keeps its bytes until :meth:`tobytes` hands them over.
        Others (on disk, rewritten, other types) are left to convert themselves."""
        groups: dict[ir.DataType, tuple[list[ConvertedConstant], list[bytes]]] = {}
        pending: dict[ir.DataType, int] = {}
        for tensor in tensors:
            data = raw_float32_bytes(tensor._source) if tensor._rewrite is None else None
            if data is None:
                continue
            members, chunks = groups.setdefault(tensor.dtype, ([], []))
            members.append(tensor)
            chunks.append(data)
            pending[tensor.dtype] = pending.get(tensor.dtype, 0) + len(data)
            if pending[tensor.dtype] >= SCREEN_BYTES:
                ConvertedConstant._convert_group(tensor.dtype, *groups.pop(tensor.dtype))
                pending[tensor.dtype] = 0
        for dtype, (members, chunks) in groups.items():
            ConvertedConstant._convert_group(dtype, members, chunks)

    @staticmethod
    def _convert_group(dtype: ir.DataType, members: list[ConvertedConstant], chunks: list[bytes]) -> None:
        target = numpy_dtype(dtype)
        with np.errstate(over="ignore"):
            data = np.frombuffer(b"".join(chunks), dtype="<f4").astype(target).tobytes()
        width, offset = target.itemsize, 0
        for tensor, chunk in zip(members, chunks, strict=True):
            size = len(chunk) // 4 * width
            tensor._bytes = data[offset:offset + size]
            offset += size

    def numpy(self) -> np.ndarray:
        array = np.asarray(self._source.numpy())
        target = numpy_dtype(self.dtype)
        if self._rewrite is not None:
            limit = float(ml_dtypes.finfo(target).max)
            array = np.where(np.isfinite(array) & (array < -limit), self._rewrite, array)
        with np.errstate(over="ignore"):  # values beyond the range were pinned FP32 by analysis
            return array.astype(target)

    def tobytes(self) -> bytes:
        if self._bytes is not None:
            data, self._bytes = self._bytes, None
            return data
        return self.numpy().tobytes()

    def tofile(self, file: BinaryIO) -> None:
        """Write the converted bytes to ``file`` (the array's own buffer: no copy into a bytes object;
        a plain conversion of a tensor still on disk a chunk at a time)."""
        if self._bytes is not None:
            file.write(self.tobytes())
            return
        source = self._source
        if isinstance(source, DeferredTensor) and self._rewrite is None and source.dtype.bitwidth in (16, 32, 64):
            source.tofile_as(file, numpy_dtype(self.dtype))
            return
        file.write(raw_bytes(self.numpy()))

    def _evaluate(self) -> ir.Tensor:
        return ir.Tensor(self.numpy(), name=self.name)


def _constant_tensor(value: ir.Value):
    """The tensor behind an initializer or a Constant node's ``value`` (None otherwise)."""
    if value.const_value is not None:
        return value.const_value
    producer = value.producer()
    attr = producer.attributes.get("value") if producer is not None else None
    return attr.value if attr is not None and attr.type == ir.AttributeType.TENSOR else None


@dataclasses.dataclass
class CastRecord:
    """A Cast node that lowering inserted, and the users it serves."""

    node: ir.Node
    source: ir.Value
    to: ir.DataType
    users: list[Slot]


class _Names:
    """Fresh, deterministic value and node names that collide with nothing in the model."""

    def __init__(self, model: ir.Model):
        self.model = model
        self._taken: set[str] | None = None  # gathered on the first fresh name: most plans need few

    @property
    def taken(self) -> set[str]:
        if self._taken is None:
            self._taken = set()
            for g in iter_graphs(self.model.graph):
                self._taken.update(v.name for v in g.inputs if v.name)
                self._taken.update(g.initializers)
                for node in g:
                    if node.name:
                        self._taken.add(node.name)
                    self._taken.update(v.name for v in node.outputs if v.name)
        return self._taken

    def fresh(self, base: str) -> str:
        name, k = base, 1
        taken = self.taken
        while name in taken:
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        return name


def cast_to(model: ir.Model, dtype: ir.DataType) -> ir.Attr:
    """Cast's ``to`` attribute for ``model``, as its opset spells it (a string before opset 6)."""
    imports = model.opset_imports
    if "" not in imports:  # a model of other domains only (ai.onnx.ml): Cast needs the default
        imports[""] = 13
    if imports[""] < 6:
        return ir.AttrString("to", dtype.name)
    return ir.AttrInt64("to", int(dtype))


class LowerPlanPass(ir.passes.InPlacePass):
    """Apply a :class:`PrecisionPlan` computed on ``graph`` (built from the same model object)."""

    def __init__(self, graph: OnnxPrecisionGraph, plan: PrecisionPlan):
        super().__init__()
        self.graph = graph
        self.plan = plan
        self.casts: list[CastRecord] = []
        self.converted_constants: dict[str | None, ir.DataType] = {}

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model is not self.graph.model:
            raise ValueError("the plan was computed on another model object")
        names = _Names(model)
        modified = self._retype_definitions()
        requests = self._requests()
        # numpy's overflow warnings are off for the constant conversions, as they always were, but
        # switched once for the whole loop (an errstate per constant costs more than the conversion).
        with np.errstate(over="ignore"):
            for value, by_dtype in requests.items():
                if is_constant(value):
                    modified |= self._convert_constant(value, by_dtype, names)
                else:
                    for dtype, users in by_dtype.items():
                        self._insert_cast(value, dtype, users, names)
                        modified = True
        return ir.passes.PassResult(model, modified)

    # -- definitions ---------------------------------------------------------------------------
    def _vertex_dtypes(self) -> dict[int, ir.DataType | None]:
        """Per vertex id, the dtype decided (None for UNDEFINED): what :meth:`_dtype` reads, once."""
        undefined = ir.DataType.UNDEFINED
        return {
            vid: (None if d.dtype is undefined else d.dtype) for vid, d in self.plan.decisions.items()
        }

    def _retype_definitions(self) -> bool:
        modified = False
        vertices = self.graph.vertices
        for slot, value, dtype in self._slot_values(defining=True):
            if dtype is None or value.dtype == dtype:
                continue
            value.type = ir.TensorType(dtype)
            modified = True
            if slot.kind is SlotKind.NODE_OUT:
                policy = vertices[self.graph.slot_vertex[slot]].policy
                if policy is not None and policy.dtype_attr:
                    self._retarget_attribute(slot.owner, policy.dtype_attr, dtype)
        return modified

    def _slot_values(self, defining: bool):
        """(slot, its tensor, its vertex's decided dtype) for every defining slot (node outputs,
        graph inputs) or every using slot (node inputs, graph outputs)."""
        dtypes = self._vertex_dtypes()
        for slot, vid in self.graph.slot_vertex.items():
            if slot.defines == defining:
                yield slot, slot.value, dtypes[vid]

    @staticmethod
    def _retarget_attribute(node: ir.Node, name: str, dtype: ir.DataType) -> None:
        """Set the attribute ``name`` that decides the node's output type (Cast ``to``,
        ConstantOfShape ``value``, ``dtype``) to ``dtype``."""
        if name not in _attribute_types(node):
            return  # the type is set by an input (CastLike), which its own slot retypes
        attr = node.attributes.get(name)
        if attr is None:  # the default (float32) applies: write the attribute out
            if _attribute_types(node)[name] == ir.AttributeType.TENSOR:
                zero = np.zeros([1], numpy_dtype(dtype))  # ConstantOfShape's default value is a 0
                node.attributes[name] = ir.AttrTensor(name, ir.tensor(zero))
            else:
                node.attributes[name] = ir.AttrInt64(name, int(dtype))
        elif attr.type == ir.AttributeType.INT:
            node.attributes[name] = ir.AttrInt64(name, int(dtype))
        elif attr.type == ir.AttributeType.TENSOR:
            arr = attr.value.numpy().astype(numpy_dtype(dtype))
            node.attributes[name] = ir.AttrTensor(name, ir.tensor(arr, name=attr.value.name))

    # -- uses ----------------------------------------------------------------------------------
    def _requests(self) -> dict[ir.Value, dict[ir.DataType, list[Slot]]]:
        """For each tensor: the dtypes its users need that differ from its own, and who needs them."""
        requests: dict[ir.Value, dict[ir.DataType, list[Slot]]] = {}
        for slot, value, dtype in self._slot_values(defining=False):
            if dtype is None or value is None or value.dtype == dtype:
                continue
            requests.setdefault(value, {}).setdefault(dtype, []).append(slot)
        return requests

    def _insert_cast(self, value: ir.Value, dtype: ir.DataType, users: list[Slot], names: _Names) -> None:
        graph_out = [s for s in users if s.kind is SlotKind.GRAPH_OUT]
        short = short_name(dtype)
        if graph_out:
            # The graph output keeps its name: the Cast's output takes it, the tensor is renamed.
            out_name = value.name
            source = short_name(value.dtype) if value.dtype in FLOAT_TYPES else "src"
            value.name = names.fresh(f"{out_name}_{source}")
        else:
            out_name = names.fresh(f"{value.name}_{short}")
        out = ir.Value(name=out_name, type=ir.TensorType(dtype), shape=value.shape)
        cast = ir.Node(
            "",
            "Cast",
            [value],
            attributes=[self._cast_to(dtype)],
            outputs=[out],
            name=names.fresh(f"{out_name}/Cast"),
        )
        producer = value.producer()
        if producer is not None:
            home_graph(producer).insert_after(producer, cast)
        else:
            home = home_graph(value)
            if len(home) > 0:
                home.insert_before(next(iter(home)), cast)
            else:
                home.append(cast)
        for slot in users:
            self._rewire(slot, out)
        self.casts.append(CastRecord(cast, value, dtype, users))

    def _cast_to(self, dtype: ir.DataType) -> ir.Attr:
        return cast_to(self.graph.model, dtype)

    @staticmethod
    def _rewire(slot: Slot, new: ir.Value) -> None:
        """Make a using slot (a node input, a graph output) read ``new``."""
        owner = slot.owner
        if isinstance(owner, ir.Node):
            owner.replace_input_with(slot.index, new)
        else:
            owner.outputs[slot.index] = new

    def _convert_constant(
        self, value: ir.Value, by_dtype: dict[ir.DataType, list[Slot]], names: _Names
    ) -> bool:
        tensor = _constant_tensor(value)
        array = None if tensor is not None else constant_array(value)  # value_float(s) attributes
        if tensor is None and array is None:
            return False
        n_requested = sum(len(users) for users in by_dtype.values())
        n_uses = len(value.uses()) + int(value.is_graph_output())
        in_place = len(by_dtype) == 1 and n_requested >= n_uses and not value.is_graph_output()
        rewrite = self.plan.constant_rewrites.get(value)
        for dtype, users in by_dtype.items():
            mask = rewrite[0] if rewrite is not None and dtype != value.dtype else None
            if tensor is None:
                tensor = ir.Tensor(np.asarray(array, dtype=np.float32))
            if in_place:
                self._replace_constant(value, ConvertedConstant(tensor, dtype, value.name, mask), dtype)
                self.converted_constants[value.name] = dtype
                continue
            name = names.fresh(f"{value.name}_{short_name(dtype)}")
            new = self._new_constant(value, ConvertedConstant(tensor, dtype, name, mask), name, dtype)
            self.converted_constants[name] = dtype
            for slot in users:
                self._rewire(slot, new)
        return True

    @staticmethod
    def _replace_constant(value: ir.Value, tensor: ConvertedConstant, dtype: ir.DataType) -> None:
        producer = value.producer()
        if producer is not None:  # a Constant node
            producer.attributes.clear()
            producer.attributes["value"] = ir.AttrTensor("value", tensor)
        else:
            value.const_value = tensor
        value.type = ir.TensorType(dtype)

    @staticmethod
    def _new_constant(value: ir.Value, tensor: ConvertedConstant, name: str, dtype: ir.DataType) -> ir.Value:
        producer = value.producer()
        if producer is not None:  # a Constant node: add a converted twin right after it
            out = ir.Value(name=name, type=ir.TensorType(dtype), shape=value.shape)
            twin = ir.Node(
                "", "Constant", [], attributes=[ir.AttrTensor("value", tensor)], outputs=[out],
                name=name,
            )
            home_graph(producer).insert_after(producer, twin)
            return out
        new = ir.Value(name=name, type=ir.TensorType(dtype), shape=value.shape, const_value=tensor)
        home_graph(value).register_initializer(new)
        return new
