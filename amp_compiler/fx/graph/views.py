"""The FX frontend's views of a torch.fx graph: the ops, tensors and slots the analysis passes read.

:class:`FxOp`, :class:`FxValue` and :class:`FxSlot` implement the Protocols of
:mod:`amp_compiler.core.graph` (``OpView``, ``ValueView``, ``SlotView``) over ``torch.fx`` nodes: an
FxOp's ``op_type`` is the ATen packet name (``"linear"``), its ``domain`` ``"aten"``, its ``name``
the FX node name.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import optimization_hint

from amp_compiler.core.graph import SlotKind
from amp_compiler.fx.graph.arguments import schema_argument

__all__ = [
    "FLOAT_DTYPES", "FP8_TO_IR", "FxOp", "FxSlot", "FxValue", "IR_TO_TORCH", "TORCH_TO_IR", "dim_hint", "is_float",
    "tensor_dtype",
]

TORCH_TO_IR = {
    torch.float32: ir.DataType.FLOAT,
    torch.float16: ir.DataType.FLOAT16,
    torch.bfloat16: ir.DataType.BFLOAT16,
    torch.float64: ir.DataType.DOUBLE,
}
IR_TO_TORCH = {v: k for k, v in TORCH_TO_IR.items()}
FLOAT_DTYPES = frozenset(TORCH_TO_IR)
# FP8 tensors (the FP8 path's weights and quantized inputs): named like the ONNX path's types, never
# part of the precision analysis (FLOAT_DTYPES).
FP8_TO_IR = {torch.float8_e4m3fn: ir.DataType.FLOAT8E4M3FN, torch.float8_e5m2: ir.DataType.FLOAT8E5M2}


def dim_hint(d: object) -> int:
    """A tensor dim as an int: a symbolic size counts as its hint (the size it was traced at), or 1
    when it has none (a data-dependent size).

    The hint is read without a guard: ``int(SymInt)`` installs ``Eq(s77, 2)`` in the shape
    environment, and under ``torch.compile`` that specialized every graph to its first input's shape
    (a model called at 10 sequence lengths compiled 6 graphs, then hit dynamo's recompile limit and
    ran 4 of the 10 calls unconverted, in FP32). The analysis reads sizes only to weigh choices
    (cast bytes, FLOPs), so the hint is what it needs."""
    if isinstance(d, torch.SymInt):
        try:
            return int(optimization_hint(d, fallback=1))
        except (TypeError, ValueError, RuntimeError, AttributeError):
            return 1
    try:
        return int(d)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 1


def tensor_dtype(node: object) -> torch.dtype | None:
    """The dtype of the tensor an FX node produces (from its traced ``val``), None if not a tensor."""
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None


def is_float(node: object) -> bool:
    """True when ``node`` is an FX node producing a float tensor."""
    return tensor_dtype(node) in FLOAT_DTYPES


class FxOp:
    """What the analysis passes read of a node (``op_type``, ``domain``, ``name``, ``inputs``)."""

    __slots__ = ("fx", "op_type", "domain", "name", "inputs")

    def __init__(self, node: fx.Node, op_type: str, domain: str, inputs: list):
        self.fx = node
        self.op_type = op_type
        self.domain = domain
        self.name = node.name
        self.inputs = inputs

    def attribute(self, name: str) -> object:
        """The value of the call's schema argument ``name`` where it holds no tensor (einsum's ``equation``):
        what an ONNX node holds as an attribute. None when the call leaves it out (or passes tensors there)."""
        present, value = schema_argument(self.fx, name)
        tensors: list[fx.Node] = []
        fx.node.map_arg(value, tensors.append)  # the mapped copy is not kept: only what it met
        return value if present and not tensors else None

    def __repr__(self) -> str:
        return f"FxOp({self.op_type}, {self.name})"


class FxValue:
    """A tensor of the FX graph as the passes read values (:class:`~amp_compiler.core.graph.ValueView`):
    its name and its shape (symbolic sizes count as their hint, or 1)."""

    __slots__ = ("name", "shape")

    def __init__(self, node: fx.Node):
        self.name = node.name
        val = node.meta.get("val")
        dims = [dim_hint(d) for d in getattr(val, "shape", ())]
        self.shape = ir.Shape(dims) if val is not None else None

    def __repr__(self) -> str:
        return f"FxValue({self.name})"


@dataclasses.dataclass(frozen=True, eq=False)
class FxSlot:
    """A float tensor a node reads (NODE_IN, GRAPH_OUT) or produces (NODE_OUT, GRAPH_IN)."""

    kind: SlotKind
    owner: fx.Node  # the node reading or producing the tensor (the output node for GRAPH_OUT)
    index: int  # NODE_IN/GRAPH_OUT: position among the owner's tensor arguments; NODE_OUT: output index
    tensor: fx.Node  # the node whose value the tensor is (a getitem node for tuple outputs)
    dtype: torch.dtype  # the traced dtype
    value: FxValue  # one view per tensor, shared by all its slots
    arg: str | None = None  # the schema argument name (NODE_IN)

    @property
    def defines(self) -> bool:
        return self.kind in (SlotKind.NODE_OUT, SlotKind.GRAPH_IN)
