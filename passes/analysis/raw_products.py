"""Raw small products: keep FP32 a Tensor Core op whose contraction is shorter than one MMA tile and which
reads raw coordinates or features.

Pairwise squared distances written as ``|a|^2 + |b|^2 - 2 a.b^T`` (DGCNN's ``knn``, PointNet++'s
``square_distance``, SchNet-style cutoffs and radial bases) take the Gram matrix ``pos @ pos^T`` of raw
coordinates, a MatMul with K = 3, and cancel it: for two atoms 1.5 A apart at 40 A from the origin
``a.b`` is about 5000, stored in FP16 to within 2 (spacing 4), and the difference is about 2. Its
absolute error is the result's, whatever comes after. A tabular model's first Gemm reading raw features
(K = 4, incomes up to 3e5) casts them to FP16 first, beyond its largest finite value (65504). Measured under
exact FP16 emulation (sweep Q): the Gram-distance cutoff ``0.5 (cos(pi d / 5) + 1)`` of a 24-atom
molecule 57% of range off at +40 A (9.3% at +10 A, 0.66% at 0-10 A) with the MatMul FP16, 0 with it FP32;
a SchNet with Gram distances, 40 A from the origin, energy 25.8% of range (8 eV) and atom energies 70% off
before, 0.055% (0.010 eV) and 0.12% with this pass; DGCNN's kNN neighbour sets, a room 20 m from the origin,
36% equal before, 100% after (logits 2.4% -> 0.73% of range); the tabular model 155 of 192 outputs Inf/NaN
before, 0.03% of range after. The range probe cannot see it: it draws coordinates ~ N(0, 1) for one atom.

What FP16 saves there is nothing measurable: FP16/BF16 MMA instructions take K = 16 on Ampere and Hopper
(m16n8k16), and cuBLAS/cuDNN pad a shorter K to a tile, so such a product does at most K/16 of the work
its Tensor Core tile costs and is bound by memory: its FLOPs are 2K < 32 per output element, under 8 per
byte of an FP32 output, below the ratio (about 13 on an A100, 20 on an H100, from their FP32 FLOPs and memory
bandwidth; not timed here) at which even FP32 CUDA cores stop waiting for memory. What FP32 costs is that
write at 4 bytes an element instead of 2 where the consumers are low (catalog: vae-decoder-overflow's
post_quant_conv, K = 4 over raw latents, 0.03% of the decoder's FLOPs; convtranspose-einsum's K = 8 Einsum);
where they are FP32 already (the cancelling Sub, a Cos, a Sqrt of the distances), it saves the Cast. No
other catalog model changes (ONNX and FX: stems, depthwise Convs, attention all stay low).
A long contraction (an image stem's Conv, K = 3 x 7 x 7 = 147, on raw pixels) does gain from Tensor
Cores, and a short one of learned activations (a depthwise Conv, K = 9) cancels nothing raw: both are
left to the other rules.

The same holds, with less to lose, for the matrix-vector products and dots the ATen table lays out without
``tensor_core`` (``mv``, ``addmv``, ``linalg_vecdot``, ``dot``, ``vdot``): no Tensor Core work at any K (2 FLOPs per
element read, bound by memory), so FP32 there costs no Tensor Core FLOP, only bytes. Point-to-plane distances
``n.p - d`` of LiDAR points ~1000 m out into an RBF MLP, converted with ``amp_compiler.fx``: ``mv`` 15.6% of range
in FP16 and ``linalg_vecdot`` 17.1% before, 0.106% now (``pts @ n`` and the ONNX wing: 0.106%); an einsum Gram
``einsum("bnd,bmd->bnm", pos, pos)`` of atoms 40-50 A out, 5.0% before, 0% now (a kNN-distance MLP 67.7% ->
0.021%; the ONNX wing 0.026%).

Found on the precision graph: a free vertex of a matrix product (:func:`is_product`: the table's ``gemm``
layout) whose contraction size K (:func:`contraction_size`: a matmul's A [..., M, K], ONNX Gemm's ``transA``
read, linalg_vecdot's ``dim``; a convolution's weight [C_out, C_in/group, kernel...], K = C_in/group x kernel; an
einsum's summed indices, :func:`amp_compiler.core.einsum.contraction_size` of the ONNX attribute's or the ATen
argument's equation and the operands' shapes) is statically known and below :data:`MMA_K`, and one of whose
operands is computed from a float graph input (:func:`~amp_compiler.passes.analysis.phase.is_raw`'s first
kind; not a float computed from integers, such as a mask's or position ids' Cast: a mask gating features is no
coordinate, and a rotary angle is the phase-argument pass's) through ops linear in their input
(:func:`~amp_compiler.passes.analysis.phase.is_linear`, the table's ``signal``: data movement, Add, Sub, Mul,
powers and sums) that are no products themselves (a projection computes learned features), on
:func:`~amp_compiler.core.graph.dataflow`. The Gram case's operands are ``pos`` and ``Transpose(pos)``. A
Gather of a table by token ids is constant-derived, no raw value. A K not statically known (symbolic ONNX
dims, an einsum equation that cannot be read) leaves the op as it was on both frontends: no pin, the other
rules decide. On FX graphs a dim is its traced size (symbolic sizes count as their hint).

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``), is DENY with rule ``policy.high.raw-small-product`` and a reason naming K, the raw value and
what FP16 would save; nothing else changes. DENY, as the phase-argument pins: the ops after it that follow
their inputs (the cancelling Sub) stay FP32 with it. It runs after the passes whose pins say more (a rotary
angle, a tree's input, a router keep their own rule) and before the range rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import ml_dtypes
import networkx as nx
import onnx_ir as ir

from amp_compiler.core.einsum import contraction_size as einsum_contraction
from amp_compiler.core.graph import PrecisionGraph, SlotKind, Vertex, dataflow
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.onnx.ir.slots import attribute_value
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, paths_into, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.passes.analysis.phase import angle_error, constant_derived, is_linear, is_raw
from amp_compiler.policy import GemmKind, GemmLayout, OpPolicy

__all__ = ["MMA_K", "RawSmallProductPass", "contraction_size", "is_product", "raw_small_products"]

#: The K of one FP16/BF16 MMA instruction on Ampere and Hopper (mma.m16n8k16, wgmma's k16): a product with a
#: shorter contraction is padded to it, so its FLOPs gain nothing on Tensor Cores.
MMA_K = 16


def _dims(shape: ir.Shape | None) -> tuple[int | None, ...] | None:
    """A shape's dims, each a known int or None (symbolic); None when the rank is unknown."""
    if shape is None:
        return None
    return tuple(d if isinstance(d, int) else None for d in shape)


def _product(dims: Sequence[int | None]) -> int | None:
    """The product of ``dims`` when each one is known."""
    known = [d for d in dims if d is not None]
    return math.prod(known) if len(known) == len(dims) else None


def _operand_shape(vertex: Vertex, operand: int | str) -> ir.Shape | None:
    """The shape of a Tensor Core op's operand as its vertex's input slot holds it: ONNX layouts name operands
    by input index (the slot's ``index``), ATen ones by schema argument (an FX slot's ``arg``)."""
    for slot in vertex.slots:
        if slot.kind is not SlotKind.NODE_IN or slot.value is None:
            continue
        if (slot.index if isinstance(operand, int) else getattr(slot, "arg", None)) == operand:
            return slot.value.shape
    return None


def _attribute(node: object, name: str) -> object:
    """An op's attribute: an ONNX node's, an ATen call's non-tensor schema argument (the FX frontend's
    ``FxOp.attribute``, einsum's ``equation``); None when absent."""
    if isinstance(node, ir.Node):
        return attribute_value(node, name)
    read = getattr(node, "attribute", None)
    return read(name) if callable(read) else None


def _operand_shapes(vertex: Vertex, layout: GemmLayout, count: int) -> list[tuple[int | None, ...] | None]:
    """The dims of an einsum's ``count`` operands as its vertex's input slots hold them, by slot index: every
    input of an ONNX Einsum (its layout names none), the elements of an ATen einsum's ``tensors`` list (the
    call's only tensor arguments); None for an operand no slot holds (not a float)."""
    shapes: list[tuple[int | None, ...] | None] = [None] * count
    for slot in vertex.slots:
        if slot.kind is not SlotKind.NODE_IN or slot.value is None or not 0 <= slot.index < count:
            continue
        if not layout.operands or getattr(slot, "arg", None) in layout.operands:
            shapes[slot.index] = _dims(slot.value.shape)
    return shapes


def is_product(policy: OpPolicy | None) -> bool:
    """A matrix product: a Tensor Core op, or a product the table lays out (``gemm``) that runs on no Tensor
    Core (a matrix-vector product, a dot: bound by memory)."""
    return policy is not None and (policy.tensor_core or policy.gemm is not None)


def contraction_size(vertex: Vertex) -> int | None:
    """How many products each output element of a matrix product sums (K), where its shapes say statically:
    a matmul's A [..., M, K] (ONNX Gemm's ``transA``: [K, M]; ATen mv's matrix, a dot's vector), a
    convolution's C_in/group x kernel (its weight [C_out, C_in/group, kernel...]), an einsum's summed indices
    (:func:`amp_compiler.core.einsum.contraction_size`, its equation read from the ONNX attribute or the ATen
    argument); None otherwise."""
    policy = vertex.policy
    layout = policy.gemm if policy is not None else None
    if layout is None or vertex.node is None:
        return None
    if layout.kind is GemmKind.MATMUL:
        a = _dims(_operand_shape(vertex, layout.operands[0]))
        if not a:
            return None
        if layout.k_axis is not None:  # linalg_vecdot's dim (left out: the last)
            axis = _attribute(vertex.node, layout.k_axis)
            axis = -1 if axis is None else axis
            return a[axis] if isinstance(axis, int) and -len(a) <= axis < len(a) else None
        transposed = bool(layout.transpose and _attribute(vertex.node, layout.transpose[0]))
        return a[-2] if transposed and len(a) >= 2 else a[-1]
    if layout.kind is GemmKind.CONV:
        weight = _dims(_operand_shape(vertex, layout.operands[1]))
        return _product(weight[1:]) if weight and len(weight) >= 3 else None
    if layout.kind is GemmKind.EINSUM:
        equation = _attribute(vertex.node, "equation")
        if not isinstance(equation, str):
            return None
        count = equation.partition("->")[0].count(",") + 1
        return einsum_contraction(equation, _operand_shapes(vertex, layout, count))
    return None


def _carries_raw(vertex: Vertex, digraph: nx.DiGraph, derived: set[int]) -> bool:
    """Passes raw values on: linear in its input (:func:`~amp_compiler.passes.analysis.phase.is_linear`) and no
    product of its own. A projection with learned weights computes features (MobileNet's convolutions from the
    image on, a value projection from the hidden states), not coordinates."""
    return is_linear(vertex, digraph, derived) and not is_product(vertex.policy)


def raw_small_products(graph: PrecisionGraph) -> dict[int, tuple[Vertex, int]]:
    """Per free product vertex (:func:`is_product` with a ``gemm`` layout) with K below :data:`MMA_K` reading an
    operand computed linearly from a float graph input: (that input's vertex, K)."""
    digraph = dataflow(graph)
    derived = constant_derived(graph, digraph)
    found: dict[int, tuple[Vertex, int]] = {}
    for vertex in graph.vertices:
        if not vertex.free:
            continue
        k = contraction_size(vertex)
        if k is None or not 0 < k < MMA_K:
            continue
        path = paths_into(graph, vertex, lambda v: v.node is None and is_raw(v, digraph, derived),
                          lambda v: _carries_raw(v, digraph, derived), digraph)
        if path:
            found[vertex.id] = (graph.vertices[min(path.values())], k)
    return found


@dataclasses.dataclass
class RawSmallProductPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        found = raw_small_products(graph)
        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.RAW_SMALL_PRODUCT}), found)
        ensure_pinned(self, graph, plan, found, f"is a matrix product with K < {MMA_K} reading raw values")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        name = graph.target.value.upper()
        err = angle_error(graph.target.numpy_dtype, 5000.0)
        top = float(ml_dtypes.finfo(graph.target.numpy_dtype).max)
        beyond = f", and no raw value beyond {top:.6g}" if top < 1e6 else ""  # FP16's range; BF16's is FP32's
        for vid, (raw, k) in sorted(raw_small_products(graph).items()):
            if not pinnable(plan, vid):
                continue
            policy = graph.vertices[vid].policy
            saves = (
                f"K < {MMA_K} gains nothing on Tensor Cores (one MMA tile takes K = {MMA_K}: the product is bound by "
                "memory)" if policy is not None and policy.tensor_core else
                "it is no Tensor Core work (a matrix-vector product or a dot: bound by memory), so FP32 costs no "
                "Tensor Core FLOP, only the bytes of its FP32 operands and result"
            )
            plan.set_role(
                vid, Role.DENY, Rule.RAW_SMALL_PRODUCT,
                f"FP32: a product over K = {k} of values computed linearly from {raw.describe()} (raw coordinates "
                f"or features): its result is cancelled or its absolute value matters ({name} stores a Gram entry "
                f"a.b = 5000 of coordinates 40 from the origin to within {err:g}, which |a|^2 + |b|^2 - 2 a.b "
                f"cancels{beyond}), and {saves}",
            )
