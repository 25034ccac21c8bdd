"""Cost estimates per node: floating-point operations, bytes moved, Tensor Core eligibility.

Shapes come from onnx shape inference on the model with its graph inputs' dynamic dims fixed
(``input_shapes``, e.g. ``{"pixel_values": (1, 3, 224, 224)}``), and where it has none for a model
with ops onnx does not define, from onnxruntime's symbolic shape inference
(:mod:`amp_compiler.onnx.load.symbolic_shapes`); dims still unknown count as 1, and the caller is told
(``CostModel.assumed``: the graph inputs' dims, which ``--input-shape`` fixes; ``CostModel.underived``: how
many inside the graph inference could not derive from them).

FLOPs count a multiply-add as 2: MatMul/Gemm ``2*M*N*K``, Conv ``2 * out elements * C_in/group *
kernel``, ConvTranspose ``2 * in elements * C_out/group * kernel``, LSTM/GRU/RNN their gate GEMMs per
step, Einsum the product of all index sizes (times 2), onnxruntime's fused attention and GEMM ops
their matrix products and softmax (:mod:`amp_compiler.onnx.costs.fused`), other numeric ops one per
output element, data movement none. Bytes are the sizes of all inputs and outputs at their element
types.

Tensor Core ops are the policy table's ``tensor_core`` entries, and where their operands hold the
product's dims is the table's ``gemm`` layout of each (:class:`~amp_compiler.policy.GemmLayout`): the
FLOPs above are read from it. One in FP16/BF16 is eligible when the dims its kernel tiles are
multiples of 8 (read for the matmuls and convolutions the table lays out and the fused ops
:func:`~amp_compiler.onnx.costs.fused.fused_gemm_dims` knows; the others are not assessed).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping

import onnx
import onnx.shape_inference

from amp_compiler.core.einsum import einsum_flops
from amp_compiler.errors import OptionError
from amp_compiler.onnx.costs import dims
from amp_compiler.onnx.costs.fused import attr, fused_flops, fused_gemm_dims
from amp_compiler.onnx.load.foreign_ops import foreign_ops
from amp_compiler.onnx.load.proto_walk import iter_proto_graphs
from amp_compiler.onnx.load.symbolic_shapes import symbolic_infos
from amp_compiler.policy import GemmKind, GemmLayout, PolicyTable, default_table, schemas

__all__ = [
    "CostModel", "NodeCost", "bind_input_shapes", "estimate", "iter_nodes", "parse_input_shape",
    "parse_input_shapes", "placement_elements",
]

LOW_TYPES = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
DATA_MOVEMENT = {
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "Expand", "Tile", "Identity", "Shape", "Size", "Cast", "CastLike",
    "Pad", "Constant", "ConstantOfShape", "ScatterND", "ScatterElements", "DepthToSpace",
    "SpaceToDepth", "If", "Loop", "Scan", "Dropout",
}


@dataclasses.dataclass
class NodeCost:
    flops: int
    bytes: int
    tensor_core: bool | None  # None: not a Tensor Core op, or not in low precision
    tensor_core_note: str


@dataclasses.dataclass
class CostModel:
    """Costs of every node, in the order of :func:`iter_nodes`."""

    nodes: list[NodeCost]
    assumed: list[str]  # the graph inputs' dynamic dims that were taken as 1 (--input-shape fixes them)
    underived: int = 0  # dims inside the graph taken as 1: onnx's inference could not derive them from the inputs'


def iter_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of every graph, in the order the converter reports them."""
    for graph in iter_proto_graphs(model.graph):
        yield from graph.node


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``name:1x3x224x224`` -> ("name", (1, 3, 224, 224)); the text only (the model checks it:
    :func:`bind_input_shapes`)."""
    name, sep, dims = text.rpartition(":")
    try:
        if not sep or not name:
            raise ValueError
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        if any(d < 0 for d in shape):
            raise ValueError
    except ValueError:
        raise OptionError(
            f"{text!r}: expected NAME:DIMxDIMx... (e.g. input:1x3x224x224)", option="input_shapes"
        ) from None
    return name, shape


def parse_input_shapes(texts: Iterable[str]) -> dict[str, tuple[int, ...]]:
    """``--input-shape`` options (:func:`parse_input_shape` each) by input name; a name given twice is an
    :class:`OptionError`."""
    shapes: dict[str, tuple[int, ...]] = {}
    for text in texts:
        name, shape = parse_input_shape(text)
        if name in shapes:
            raise OptionError(f"{name} is given twice", option="input_shapes")
        shapes[name] = shape
    return shapes


def bind_input_shapes(
    model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """The one check of user-given graph input shapes, and what they fix: the given shapes, plus every
    other graph input whose dims are all fixed by the model or named by a ``dim_param`` the given
    shapes bind (``input_ids:2x16`` fixes ``attention_mask [batch, sequence]`` too).

    Raises :class:`OptionError` (``option="input_shapes"``) for a name that is not a graph input, a
    rank or a fixed dim the model contradicts, a dim below 1, or a named dim given two values."""
    inputs = {i.name: i for i in model.graph.input}
    unknown = sorted(set(input_shapes) - set(inputs))
    if unknown:
        raise OptionError(
            f"{', '.join(unknown)} is not a graph input (inputs: {', '.join(sorted(inputs))})", option="input_shapes"
        )
    bound: dict[str, tuple[int, str]] = {}  # dim_param -> (its value, the input that gave it)
    for name, shape in input_shapes.items():
        tt = inputs[name].type.tensor_type
        dims = tt.shape.dim if tt.HasField("shape") else None
        if dims is not None and len(dims) != len(shape):
            raise OptionError(f"{name}: rank {len(shape)}, the model says {len(dims)}", option="input_shapes")
        for k, value in enumerate(shape):
            if value < 1:
                raise OptionError(f"{name}: dim {k} is {value}; dims must be at least 1", option="input_shapes")
            d = dims[k] if dims is not None else None
            if d is not None and d.HasField("dim_value") and d.dim_value > 0 and d.dim_value != value:
                raise OptionError(
                    f"{name}: dim {k} is {value}, but the model fixes it at {d.dim_value}", option="input_shapes"
                )
            if d is not None and d.HasField("dim_param"):
                first = bound.setdefault(d.dim_param, (value, name))
                if first[0] != value:
                    raise OptionError(
                        f"the dim {d.dim_param!r} is {first[0]} in {first[1]} but {value} in {name}",
                        option="input_shapes",
                    )
    out = {name: tuple(shape) for name, shape in input_shapes.items()}
    for name, info in inputs.items():
        tt = info.type.tensor_type
        if name in out or not tt.HasField("shape") or not tt.shape.dim:
            continue
        dims = tt.shape.dim
        if any(d.HasField("dim_param") for d in dims) and all(
            (d.HasField("dim_value") and d.dim_value > 0) or (d.HasField("dim_param") and d.dim_param in bound)
            for d in dims
        ):
            out[name] = tuple(d.dim_value if d.HasField("dim_value") else bound[d.dim_param][0] for d in dims)
    return out


def with_input_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of the model whose graph inputs have the given shapes (bound: :func:`bind_input_shapes`)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for inp in out.graph.input:
        if inp.name in input_shapes:
            shape = input_shapes[inp.name]
            del inp.type.tensor_type.shape.dim[:]
            for d in shape:
                inp.type.tensor_type.shape.dim.add().dim_value = d
    return out


def element_counts(model: onnx.ModelProto, input_shapes: Mapping[str, tuple[int, ...]]) -> dict[str, int]:
    """Per tensor name, its number of elements once the graph inputs have ``input_shapes`` (shape
    inference on a copy; ``input_shapes`` bound by :func:`bind_input_shapes`); tensors whose shape is
    still not fully known are left out."""
    try:
        inferred = onnx.shape_inference.infer_shapes(
            with_input_shapes(model, input_shapes), strict_mode=False, data_prop=True
        )
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return {}
    bound = dims.bindings(model, input_shapes)
    counts: dict[str, int] = {}
    for graph in iter_proto_graphs(inferred.graph):
        for vi in (*graph.input, *graph.output, *graph.value_info):
            tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
            if tt is None or not tt.HasField("shape"):
                continue
            values = [dims.dim_value(d, bound) for d in tt.shape.dim]
            if all(v is not None for v in values):
                counts[vi.name] = math.prod(values)  # type: ignore[arg-type]
    return counts


def placement_elements(
    model: onnx.ModelProto, unshaped: set[str], input_shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, int]:
    """Element counts for the cast costs of placement: by tensor name, from onnx's inference with
    ``input_shapes`` fixed (:func:`element_counts`, when given), and for the ``unshaped`` tensors
    that onnx's inference cannot shape (outputs of ops it does not define, and what follows them)
    from onnxruntime's symbolic shape inference (dynamic dims counted as 1)."""
    counts = element_counts(model, input_shapes) if input_shapes else {}
    missing = unshaped - counts.keys()
    if missing:
        fixed = with_input_shapes(model, input_shapes) if input_shapes else model
        for name, info in symbolic_infos(fixed).items():
            n = info.elements() if name in missing else None
            if n is not None:
                counts[name] = n
    return counts


def _shapes(
    model: onnx.ModelProto, bound: Mapping[str, int]
) -> tuple[dict[str, tuple[int, ...]], dict[str, int], list[str]]:
    """Per tensor name: shape (named dims from ``bound``, unknown dims as 1) and element type; and
    the unknown dims seen."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        inferred = model
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    assumed: set[str] = set()
    for graph in iter_proto_graphs(inferred.graph):
        infos = list(graph.input) + list(graph.output) + list(graph.value_info)
        for vi in infos:
            if not vi.type.HasField("tensor_type"):
                continue
            tt = vi.type.tensor_type
            types[vi.name] = tt.elem_type
            if tt.HasField("shape"):
                shape: list[int] = []
                for d in tt.shape.dim:
                    value = dims.dim_value(d, bound)  # some exporters write -1: unknown
                    if value is None:
                        assumed.add(d.dim_param or "?")
                    shape.append(value or 1)
                shapes[vi.name] = tuple(shape)
        for init in graph.initializer:
            shapes[init.name] = tuple(init.dims)
            types[init.name] = init.data_type
        for node in graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
                types[node.output[0]] = node.attribute[0].t.data_type
    if foreign_ops(model).nodes:  # ops onnx does not define: onnxruntime's symbolic inference knows them
        for name, info in symbolic_infos(model).items():
            if info.elem_type and not types.get(name):
                types[name] = info.elem_type
            if info.dims is not None and name not in shapes:  # its symbols derive from the inputs' dims
                shapes[name] = tuple(d if isinstance(d, int) else 1 for d in info.dims)
    return shapes, types, sorted(assumed)


def _numel(shape: tuple[int, ...] | None) -> int:
    return math.prod(shape) if shape is not None else 0


def _flops(node: onnx.NodeProto, shape, gemm: GemmLayout | None) -> int:
    ins = [shape(i) for i in node.input]
    out = shape(node.output[0]) if node.output else None
    if gemm is not None:
        flops = _gemm_flops(node, gemm, ins, out)
        if flops is not None:
            return flops
    if not schemas.is_onnx_domain(node.domain) or not onnx.defs.has(node.op_type):  # onnxruntime's ops
        fused = fused_flops(node, shape)
        if fused is not None:
            return fused
    if node.op_type in DATA_MOVEMENT or out is None:
        return 0
    return _numel(out)


def _operand(ins: list, i: int | str) -> tuple[int, ...] | None:
    return ins[i] if isinstance(i, int) and i < len(ins) else None


def _transposed(node: onnx.NodeProto, gemm: GemmLayout, operand: int) -> bool:
    return bool(gemm.transpose and attr(node, gemm.transpose[operand], 0))


def _gemm_flops(node: onnx.NodeProto, gemm: GemmLayout, ins: list, out: tuple[int, ...] | None) -> int | None:
    """FLOPs of a Tensor Core op from its layout (None: its shapes are unknown)."""
    if gemm.kind is GemmKind.EINSUM:
        return _einsum_flops(node, ins)
    a, b, *rest = (_operand(ins, i) for i in gemm.operands)
    if gemm.kind is GemmKind.MATMUL and a and out is not None:
        k = a[-2] if _transposed(node, gemm, 0) else a[-1]
        biased = gemm.bias is not None and len(node.input) > int(gemm.bias)
        return 2 * _numel(out) * k + (_numel(out) if biased else 0)
    if gemm.kind is GemmKind.CONV and b and out is not None:  # weight (C_out, C_in/group, k...)
        return 2 * _numel(out) * math.prod(b[1:])
    if gemm.kind is GemmKind.CONV_TRANSPOSE and a and b:  # weight (C_in, C_out/group, k...)
        return 2 * _numel(a) * math.prod(b[1:])
    if gemm.kind is GemmKind.RECURRENT and a and b and rest[0]:
        seq, batch, size = a
        dirs, gates_h, hidden = rest[0][0], rest[0][1], rest[0][2]
        return 2 * seq * batch * dirs * gates_h * (size + hidden)
    return None


def _einsum_flops(node: onnx.NodeProto, ins: list) -> int | None:
    eq = attr(node, "equation", b"")
    return einsum_flops(eq.decode() if isinstance(eq, bytes) else eq, ins)


def _gemm_dims(node: onnx.NodeProto, gemm: GemmLayout, ins: list) -> dict[str, int] | None:
    """The dims a matmul's or a convolution's Tensor Core kernel wants in multiples of 8 (None: shapes unknown)."""
    a, b = (_operand(ins, i) for i in gemm.operands[:2])
    if gemm.kind is GemmKind.MATMUL:
        if not a or not b:
            return None
        k = a[-2] if _transposed(node, gemm, 0) else a[-1]
        return {"K": k, "N": b[gemm.weight_axes(len(b), _transposed(node, gemm, 1))[1]]}
    if b and len(b) >= 2:  # a weight's axis 0 holds all of its channels, axis 1 one group's
        group = attr(node, "group", 1)
        c_in, c_out = (b[axis] // (group if axis == 0 else 1) for axis in gemm.weight_axes(len(b)))
        return {"C_in/group": c_in, "C_out/group": c_out}
    return None


_DIMS_CHECKED = (GemmKind.MATMUL, GemmKind.CONV, GemmKind.CONV_TRANSPOSE)


def _tensor_core(node: onnx.NodeProto, shape, types, policy: PolicyTable) -> tuple[bool | None, str]:
    """Eligibility of a low-precision Tensor Core op (None: not one, or not assessed) and why."""
    low = bool(node.input) and types.get(node.input[0]) in LOW_TYPES
    if not low or not policy.is_tensor_core(node.domain, node.op_type):
        return None, ""
    ins = [shape(i) for i in node.input]
    gemm = policy.gemm_layout(node.domain, node.op_type)
    if gemm is not None and gemm.kind in _DIMS_CHECKED:
        dims = _gemm_dims(node, gemm, ins)
    elif not schemas.is_onnx_domain(node.domain):
        dims = fused_gemm_dims(node, ins)
    else:
        return None, f"the GEMM dims of {node.op_type} are not checked"
    if dims is None:
        return None, "shapes unknown"
    bad = {k: v for k, v in dims.items() if v % 8}
    if bad:
        return False, "not multiples of 8: " + ", ".join(f"{k}={v}" for k, v in bad.items())
    return True, ", ".join(f"{k}={v}" for k, v in dims.items())


def estimate(
    model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None, policy: PolicyTable | None = None
) -> CostModel:
    """Costs of every node of ``model`` (see the module docstring) with ``input_shapes`` (bound by
    :func:`bind_input_shapes`); ``policy`` says which ops are Tensor Core ops and how their operands
    hold the product's dims (default: the shipped table)."""
    policy = policy or default_table()
    fixed = with_input_shapes(model, input_shapes) if input_shapes else model
    shapes, types, unknown = _shapes(fixed, dims.bindings(model, input_shapes or {}))
    # the inputs' own dims are the user's to give; the rest (onnx's unk__N, an exporter's names inside) follow them
    given = {d.dim_param or "?" for i in fixed.graph.input if i.type.HasField("tensor_type")
             for d in i.type.tensor_type.shape.dim if not d.HasField("dim_value") or d.dim_value <= 0}
    assumed = [d for d in unknown if d in given]
    sizes = {t: onnx.helper.tensor_dtype_to_np_dtype(t).itemsize for t in set(types.values()) if t}

    def shape(name: str):
        return shapes.get(name) if name else None

    def nbytes(name: str) -> int:
        return _numel(shape(name)) * sizes.get(types.get(name, 0), 0) if name else 0

    costs = []
    for node in iter_nodes(fixed):
        tc, note = _tensor_core(node, shape, types, policy)
        costs.append(
            NodeCost(
                flops=_flops(node, shape, policy.gemm_layout(node.domain, node.op_type)),
                bytes=sum(nbytes(n) for n in node.input) + sum(nbytes(n) for n in node.output),
                tensor_core=tc,
                tensor_core_note=note,
            )
        )
    return CostModel(costs, assumed, len(unknown) - len(assumed))
