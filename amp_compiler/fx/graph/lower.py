"""Lower a precision plan onto the FX graph.

Guarantees (the FX counterpart of ``passes/lower.py``):
- every float tensor a node reads has the dtype its vertex was given: where the producer's dtype
  differs, one ``aten._to_copy(x, dtype=...)`` node per (tensor, dtype) is inserted before its first
  user and shared by all users;
- a ``dtype`` argument that follows the plan (explicit conversions from integers, conversions to
  the type the input already has, factories of the input's type) is rewritten to the vertex's dtype;
  ``_assert_tensor_metadata`` checks are rewritten to the dtype their tensor ends up with;
- parameters and buffers: with ``store_low`` (inference), a tensor whose every use wants one other
  dtype is stored in that dtype (the module attribute is replaced; the caller's model is untouched);
  otherwise, and always in training, it stays as it is and users that need another dtype read a cast
  of it (so gradients flow back through the cast to the FP32 master parameter);
- graph inputs and outputs keep their dtypes; nothing else changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from amp_compiler.core.graph import SlotKind
from amp_compiler.core.plan import PrecisionPlan
from amp_compiler.dtypes import short_name
from amp_compiler.fx.graph.arguments import (
    replace_tensor_arguments,
    schema_argument,
    set_schema_argument,
    tensor_arguments,
)
from amp_compiler.fx.graph.precision_graph import FxPrecisionGraph
from amp_compiler.fx.graph.views import FP8_TO_IR, IR_TO_TORCH, TORCH_TO_IR, FxSlot, tensor_dtype

__all__ = ["CAST", "CastInfo", "Lowering", "StoredConstant", "lower_plan", "short"]

CAST = torch.ops.aten._to_copy.default


def short(dtype: torch.dtype | None) -> str:
    """A torch dtype's short name: the ONNX path's for float types ("fp16"), else torch's ("int64")."""
    if dtype is None:
        return ""
    ir_dtype = TORCH_TO_IR.get(dtype, FP8_TO_IR.get(dtype))
    return short_name(ir_dtype) if ir_dtype is not None else str(dtype).removeprefix("torch.")


@dataclasses.dataclass
class CastInfo:
    """A cast node that lowering inserted, and the nodes it serves."""

    node: fx.Node
    source: fx.Node
    dtype: torch.dtype
    users: list[str]


@dataclasses.dataclass
class StoredConstant:
    """A parameter or buffer stored in another dtype."""

    target: str
    before: torch.dtype
    after: torch.dtype
    users: list[str]


@dataclasses.dataclass
class Lowering:
    slot_dtypes: dict[FxSlot, torch.dtype]
    casts: dict[fx.Node, CastInfo]
    stored: dict[str, StoredConstant]
    dtype_rewrites: dict[fx.Node, torch.dtype]


def slot_dtypes(fxg: FxPrecisionGraph, plan: PrecisionPlan) -> dict[FxSlot, torch.dtype]:
    out = {}
    for slot in fxg.slots:
        vertex = fxg.vertex_of(slot)
        if not vertex.free:
            out[slot] = slot.dtype
        else:
            out[slot] = IR_TO_TORCH[plan.decisions[vertex.id].dtype]
    return out


def lower_plan(
    gm: fx.GraphModule, fxg: FxPrecisionGraph, plan: PrecisionPlan, *, store_low: bool
) -> Lowering:
    graph = gm.graph
    dtypes = slot_dtypes(fxg, plan)
    produced: dict[fx.Node, torch.dtype | None] = {t: dtypes[s] for t, s in fxg.defining.items()}
    lowering = Lowering(dtypes, {}, {}, {})

    # 1. dtype arguments that follow the plan.
    for node, slot in fxg.dtype_arg_slots.items():
        new = dtypes[slot]
        if schema_argument(node, "dtype")[1] != new:
            set_schema_argument(node, "dtype", new)
            lowering.dtype_rewrites[node] = new

    # 2. Parameters and buffers.
    replacements: dict[fx.Node, dict[int, fx.Node]] = {}
    casts: dict[tuple[fx.Node, torch.dtype], fx.Node] = {}

    def cast_of(source: fx.Node, dtype: torch.dtype, before: fx.Node, user: str) -> fx.Node:
        key = (source, dtype)
        node = casts.get(key)
        if node is None:
            with graph.inserting_before(before):
                node = graph.create_node(
                    "call_function", CAST, (source,), {"dtype": dtype}, name=f"{source.name}_{short(dtype)}"
                )
            casts[key] = node
            lowering.casts[node] = CastInfo(node, source, dtype, [])
        if user not in lowering.casts[node].users:
            lowering.casts[node].users.append(user)
        return node

    kept = set(fxg.fixed_inputs.values())  # sources some node reads as they are (fp32_args)
    by_tensor: dict[int, list[fx.Node]] = {}
    for source in fxg.constant_slots:
        by_tensor.setdefault(id(_tensor(gm, source)), []).append(source)
    for sources in by_tensor.values():
        uses = [s for src in sources for s in fxg.constant_slots[src]]
        wanted = {dtypes[s] for s in uses}
        current = tensor_dtype(sources[0]) if sources[0].op != "get_attr" else _tensor(gm, sources[0]).dtype
        readers = {s.owner for s in uses}
        only_slots = all(set(src.users) <= readers and src not in kept for src in sources)
        if (
            store_low
            and len(wanted) == 1
            and (new := next(iter(wanted))) != current
            and only_slots
            and all(src.op == "get_attr" for src in sources)
        ):
            tensor = _tensor(gm, sources[0])
            converted = _converted(tensor, new)
            for name in _aliases(gm, tensor) | {str(src.target) for src in sources}:
                _set_attr(gm, name, converted)
            lowering.stored[str(sources[0].target)] = StoredConstant(
                str(sources[0].target), tensor.dtype, new, sorted({s.owner.name for s in uses})
            )
            for src in sources:
                produced[src] = new
            continue
        for src in sources:
            produced[src] = current
        for s in uses:
            if dtypes[s] != current:
                cast = cast_of(s.tensor, dtypes[s], s.owner, s.owner.name)
                replacements.setdefault(s.owner, {})[s.index] = cast

    # 3. Tensors computed in the graph.
    for slot in fxg.slots:
        if slot.defines or slot.tensor in fxg.constant_slots:
            continue
        need = dtypes[slot]
        have = produced.get(slot.tensor, slot.dtype)
        if need != have:
            user = slot.owner.name if slot.kind is SlotKind.NODE_IN else f"graph output {slot.index}"
            cast = cast_of(slot.tensor, need, slot.owner, user)
            replacements.setdefault(slot.owner, {})[slot.index] = cast
    for node, repl in replacements.items():
        replace_tensor_arguments(node, repl)

    # 4. Metadata checks follow their tensor.
    for node in fxg.observers:
        args = tensor_arguments(node)
        if args and "dtype" in node.kwargs:
            t = args[0][1]
            dtype = produced.get(t, tensor_dtype(t))
            if dtype is not None and dtype != node.kwargs["dtype"]:
                set_schema_argument(node, "dtype", dtype)
                lowering.dtype_rewrites[node] = dtype

    graph.lint()
    gm.recompile()
    return lowering


def _tensor(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor:
    if node.op != "get_attr":
        return node.meta["val"]
    obj: Any = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    return obj


def _aliases(gm: fx.GraphModule, tensor: torch.Tensor) -> set[str]:
    """Every attribute name of ``gm`` holding ``tensor`` (tied weights), used in the graph or not."""
    named = list(gm.named_parameters(remove_duplicate=False)) + list(gm.named_buffers(remove_duplicate=False))
    return {name for name, t in named if t is tensor}


def _converted(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    data = tensor.detach().to(dtype)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(data, requires_grad=False)
    return data


def _set_attr(gm: fx.GraphModule, target: str, value: torch.Tensor) -> None:
    *path, name = target.split(".")
    module = gm
    for part in path:
        module = getattr(module, part)
    if isinstance(value, torch.nn.Parameter):
        module._parameters[name] = value
    elif name in getattr(module, "_buffers", {}):
        module._buffers[name] = value
    else:
        setattr(module, name, value)
