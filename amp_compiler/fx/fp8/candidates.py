"""FP8 candidates of an FX graph: the matrix products that may take FP8 (E4M3) inputs, their operands
and scales, and what one computes with them.

Guarantees:
- :func:`find_candidates` lists the FP32 calls of the ops whose policy entry has ``fp8_operands``
  (linear, mm, addmm, bmm, matmul) with both matrix operands float32 tensors of rank >= 2 and
  unit ``alpha``/``beta`` where the op has them. A constant operand (a parameter or buffer) is a
  weight: quantized once, from its FP32 values, with one scale per output channel when it is the
  2-D second operand (``amax / 448``, margin 0), else per tensor. Any other operand is an
  activation: one scale per tensor, set by :meth:`Operand.calibrate` from the calibration amax
  (``amax * 2^margin / 448``).
- :meth:`Candidate.fp8_output` computes what the converted graph's FP8 GEMM computes from the
  values the FP32 graph gives the op (activations and bias rounded to FP16 first, as the fallback
  graph holds them), in FP32; :meth:`Candidate.fp16_output` the op on FP16-rounded values, in FP32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, cast

import torch
import torch.fx as fx

from amp_compiler.core.fp8_numbers import Fp8Format
from amp_compiler.fx.fp8.numerics import channel_scales, fp8_matmul, quantize, scale_for_amax
from amp_compiler.fx.graph.arguments import schema_argument
from amp_compiler.fx.graph.policy import AtenOpInfo, AtenPolicy, op_name, policy_name

__all__ = ["FALLBACK", "Candidate", "Operand", "argument_values", "attr_tensor", "find_candidates", "gemm_operands"]

FALLBACK = torch.float16  # what the rest of an FP8 graph computes in (Target.FP8.fallback)


@dataclasses.dataclass
class Operand:
    """One matrix operand of a candidate: its schema argument and its node; for a weight, its FP32
    values and its quantized form (the second operand as [..., N, K]); the FP32 scale(s) and amax."""

    position: int  # 0: the left operand (rows of the output), 1: the right one
    arg: str
    node: fx.Node
    weight: torch.Tensor | None = None
    quantized: torch.Tensor | None = None
    axis: int | None = None  # the weight's output-channel axis as the op reads it (None: per tensor)
    # FP32, per tensor or per output channel; an activation's is 1 until :meth:`calibrate` sets it
    scale: torch.Tensor = dataclasses.field(default_factory=lambda: torch.ones((), dtype=torch.float32))
    amax: float = 0.0

    @property
    def is_weight(self) -> bool:
        return self.weight is not None

    def calibrate(self, amax: float, margin: int) -> None:
        """An activation's per-tensor scale from its calibration amax."""
        self.amax = amax
        self.scale = torch.tensor(scale_for_amax(amax, Fp8Format.E4M3, margin), dtype=torch.float32)

    def describe(self) -> str:
        if not self.is_weight:
            return f"{self.arg} scale {float(self.scale):.3g} per tensor (amax {self.amax:.3g})"
        if self.axis is not None:
            return f"{self.arg} (a weight) scales per output channel (axis {self.axis})"
        return f"{self.arg} (a weight) scale {float(self.scale):.3g} per tensor"


@dataclasses.dataclass
class Candidate:
    node: fx.Node
    op: str
    operands: tuple[Operand, Operand]
    bias_arg: str | None
    transposed: bool  # the second operand is [..., N, K] as the op takes it (linear's weight)
    flops: int

    @property
    def activations(self) -> list[Operand]:
        return [o for o in self.operands if not o.is_weight]

    def quantized_operand(self, operand: Operand, value: torch.Tensor) -> torch.Tensor:
        """The operand as the FP8 GEMM reads it (the second one as [..., N, K])."""
        if operand.quantized is not None:
            return operand.quantized
        q = quantize(value.to(FALLBACK), operand.scale)
        return q if operand.position == 0 or self.transposed else q.mT

    def fp8_output(self, values: dict[str, Any]) -> torch.Tensor:
        """The FP8 GEMM on the op's argument ``values`` (by schema name), in FP32."""
        a, b = self.operands
        qa = self.quantized_operand(a, values[a.arg])
        qb = self.quantized_operand(b, values[b.arg])
        bias = values.get(self.bias_arg) if self.bias_arg else None
        bias = bias.to(FALLBACK) if isinstance(bias, torch.Tensor) else None
        return fp8_matmul(qa, a.scale, qb, b.scale, bias, out_dtype=torch.float32)

    def fp16_output(self, args: tuple, kwargs: dict) -> torch.Tensor:
        """The op on its arguments rounded to FP16, computed in FP32."""
        def rounded(v):
            return v.to(FALLBACK).to(torch.float32) if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        op = cast(Callable[..., torch.Tensor], self.node.target)
        return op(*[rounded(v) for v in args], **{k: rounded(v) for k, v in kwargs.items()})


def argument_values(node: fx.Node, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's argument values (as an interpreter fetched them) by schema argument name."""
    out = dict(kwargs)
    for a, value in zip(node.target._schema.arguments, args, strict=False):  # type: ignore[union-attr]
        out[a.name] = value
    return out


def attr_tensor(gm: fx.GraphModule, node: fx.Node) -> torch.Tensor:
    """The parameter or buffer a ``get_attr`` node reads."""
    obj: Any = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part)
    return obj


def _val(node: Any) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _weight(gm: fx.GraphModule, position: int, arg: str, node: fx.Node, transposed: bool) -> Operand:
    w = attr_tensor(gm, node).detach().to(torch.float32)
    if position == 1 and w.ndim == 2:
        axis = 0 if transposed else 1
        as_nk = w if transposed else w.t()
        scale = channel_scales(as_nk, 0)
        q = quantize(as_nk, scale.reshape(-1, 1)).contiguous()
        return Operand(position, arg, node, w, q, axis, scale, float(w.abs().max()))
    amax = float(w.abs().max()) if w.numel() else 0.0
    scale = torch.tensor(scale_for_amax(amax), dtype=torch.float32)
    q = quantize(w, scale)
    q = q if position == 0 or transposed else q.mT
    return Operand(position, arg, node, w, q, None, scale, amax)


def gemm_operands(node: fx.Node, policy: AtenPolicy) -> tuple[AtenOpInfo, fx.Node, fx.Node] | None:
    """For a call of an op lowered to the FP8 GEMM, in FP32, with unit ``alpha``/``beta`` and matrix
    operands of rank >= 2: its policy info and its two operand nodes; else None."""
    name = op_name(node.target) if node.op == "call_function" else None
    if name is None:
        return None
    info = policy.info_of(policy_name(name))
    out_val = _val(node)
    if info.fp8_operands is None or out_val is None or out_val.dtype != torch.float32:
        return None
    if any(schema_argument(node, s)[1] not in (None, 1) for s in ("alpha", "beta")):
        return None
    operands = [schema_argument(node, arg)[1] for arg in info.fp8_operands]
    for value in operands:
        val = _val(value)
        if val is None or val.dtype != torch.float32 or val.ndim < 2:
            return None
    return info, operands[0], operands[1]


def find_candidates(
    gm: fx.GraphModule, policy: AtenPolicy, exclude: Iterable[fx.Node] = ()
) -> list[Candidate]:
    """The graph's FP8 candidates (see module doc), in graph order, except the nodes in ``exclude``."""
    skip = set(exclude)
    out = []
    for node in gm.graph.nodes:
        found = gemm_operands(node, policy) if node not in skip else None
        if found is None:
            continue
        info, *nodes = found
        assert info.fp8_operands is not None
        operands = []
        for position, (arg, value) in enumerate(zip(info.fp8_operands, nodes, strict=True)):
            if value.op == "get_attr":
                operands.append(_weight(gm, position, arg, value, info.fp8_transposed))
            else:
                operands.append(Operand(position, arg, value))
        a_val, out_val = _val(nodes[0]), _val(node)
        flops = 2 * out_val.numel() * int(a_val.shape[-1]) if a_val is not None and out_val is not None else 0
        name = op_name(node.target) or ""
        out.append(Candidate(node, name, (operands[0], operands[1]), info.fp8_bias, info.fp8_transposed, flops))
    return out
