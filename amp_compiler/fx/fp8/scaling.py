"""FP8 training's delayed scaling (Transformer Engine's recipe) and the FP8 GEMM with its backward.

Each FP8 GEMM quantizes three tensors: its input and its weight in E4M3 (forward), the gradient of
its output in E5M2 (backward; E4M3 too with ``fp8_format="E4M3"``). Every one has a column in two
buffers of the graph module: ``fp8_amax_history`` [history length, tensors] and ``fp8_scale``
[tensors] (FP32 dequantization scales, ``q = saturate(x / scale)``; TE's ``scale_inv``).

Guarantees:
- a step quantizes with the scales decided before it (1.0 at the first step, as in TE) and records
  each tensor's amax in row 0 of the history (:class:`Fp8GemmFunction`);
- :meth:`DelayedScalingState.update`, after the step: amax = the max over the history (the step's
  own row and the ``amax_history_len - 1`` before it; ``"most_recent"``: row 0 only), scale =
  ``amax * 2^margin / fp8_max``, kept where that amax is 0 or not finite; then the oldest row is
  dropped and row 0 cleared. A step the loss scaler skipped (inf/NaN gradients) records nothing;
- the GEMM computes its output, the input's and the weight's gradients as FP8 matrix products
  (:func:`~amp_compiler.fx.fp8.numerics.fp8_matmul`: ``torch._scaled_mm`` on an FP8 GPU, the exact
  emulation elsewhere) of the quantized tensors, FP32 accumulation; the bias gradient from the
  unquantized gradient; each gradient in its tensor's dtype (FP32 for an FP32 master weight).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx as fx

from amp_compiler.core.fp8_numbers import Fp8Format
from amp_compiler.errors import OptionError
from amp_compiler.fx.fp8.numerics import fp8_matmul, quantize

__all__ = ["HISTORY_BUFFER", "SCALE_BUFFER", "DelayedScaling", "DelayedScalingState", "Fp8GemmFunction",
    "ScaledTensor", "fp8_train_gemm"]

HISTORY_BUFFER = "fp8_amax_history"
SCALE_BUFFER = "fp8_scale"


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """Transformer Engine's ``recipe.DelayedScaling``, by its names and defaults: ``fp8_format``
    "HYBRID" (E4M3 forward, E5M2 gradients) or "E4M3" (both), ``margin`` (scales leave 2^margin of
    headroom), ``amax_history_len``, ``amax_compute_algo`` "max" or "most_recent"."""

    margin: int = 0
    fp8_format: str = "HYBRID"
    amax_history_len: int = 1024
    amax_compute_algo: str = "max"

    def __post_init__(self) -> None:
        if self.fp8_format not in ("HYBRID", "E4M3"):
            raise OptionError(f"fp8_format: expected 'HYBRID' or 'E4M3', got {self.fp8_format!r}",
                              option="fp8_recipe")
        if self.amax_compute_algo not in ("max", "most_recent"):
            raise OptionError(f"amax_compute_algo: expected 'max' or 'most_recent', got {self.amax_compute_algo!r}",
                              option="fp8_recipe")
        if not isinstance(self.amax_history_len, int) or self.amax_history_len < 1:
            raise OptionError(f"amax_history_len: expected an integer >= 1, got {self.amax_history_len!r}",
                              option="fp8_recipe")
        if not isinstance(self.margin, int) or not 0 <= self.margin <= 16:
            raise OptionError(f"margin: expected an integer 0..16, got {self.margin!r}", option="fp8_recipe")

    @property
    def grad_format(self) -> Fp8Format:
        return Fp8Format.E5M2 if self.fp8_format == "HYBRID" else Fp8Format.E4M3


@dataclasses.dataclass(frozen=True)
class ScaledTensor:
    """One column of the state: which GEMM, which of its tensors, and its format."""

    gemm: str
    role: str  # "input" | "weight" | "grad_output"
    fmt: Fp8Format


class DelayedScalingState:
    """The delayed-scaling buffers of a graph module and their update (see module doc)."""

    def __init__(self, gm: fx.GraphModule, recipe: DelayedScaling, columns: list[ScaledTensor]):
        self.recipe = recipe
        self.columns = columns
        n = len(columns)
        gm.register_buffer(HISTORY_BUFFER, torch.zeros(recipe.amax_history_len, n, dtype=torch.float32))
        gm.register_buffer(SCALE_BUFFER, torch.ones(n, dtype=torch.float32))
        self.history: torch.Tensor = getattr(gm, HISTORY_BUFFER)
        self.scale: torch.Tensor = getattr(gm, SCALE_BUFFER)
        self.fmt_max = torch.tensor([c.fmt.max for c in columns], dtype=torch.float32)

    def column(self, gemm: str, role: str) -> int:
        return next(k for k, c in enumerate(self.columns) if c.gemm == gemm and c.role == role)

    @torch.no_grad()
    def update(self, skipped: bool = False) -> None:
        """New scales from the history, then the history moves on one step (see module doc)."""
        h, s = self.history, self.scale
        if skipped:
            h[0].zero_()
        amax = h.amax(0) if self.recipe.amax_compute_algo == "max" else h[0].clone()
        new = amax * 2.0**self.recipe.margin / self.fmt_max.to(amax.device)
        s.copy_(torch.where(torch.isfinite(amax) & (amax > 0), new, s))
        if h.shape[0] > 1:
            h.copy_(torch.roll(h, 1, 0))
        h[0].zero_()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"amax_history": self.history.detach().clone(), "scale": self.scale.detach().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.history.copy_(state["amax_history"])
        self.scale.copy_(state["scale"])


def _record(history: torch.Tensor, column: int, x: torch.Tensor) -> None:
    with torch.no_grad():
        history[0, column] = x.detach().abs().amax().to(torch.float32)


class Fp8GemmFunction(torch.autograd.Function):
    """``a @ b (+ bias)`` with FP8 operands and delayed scaling (see module doc). ``b`` is [N, K]
    when ``b_transposed`` (a linear layer's weight), else [K, N]; ``columns``: the state columns of
    (input, weight, grad_output)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor,
                history: torch.Tensor, columns: tuple[int, int, int], b_transposed: bool, grad_format: str,
                out_dtype: torch.dtype) -> torch.Tensor:
        ia, ib, ig = columns
        sa, sb = scale[ia].clone(), scale[ib].clone()
        qa, qb = quantize(a, sa), quantize(b, sb)
        _record(history, ia, a)
        _record(history, ib, b)
        b_t = qb if b_transposed else qb.mT
        ctx.save_for_backward(qa, b_t, sa, sb)
        ctx.state = (scale, history)  # buffers the step writes: held, not saved (no version check)
        ctx.meta = (ig, Fp8Format(grad_format), a.dtype, b.dtype, b_transposed,
                    bias.dtype if bias is not None else None, a.shape, bias.shape if bias is not None else None)
        return fp8_matmul(qa, sa, b_t, sb, bias, out_dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        qa, b_t, sa, sb = ctx.saved_tensors
        scale, history = ctx.state
        ig, fmt, a_dtype, b_dtype, b_transposed, bias_dtype, a_shape, bias_shape = ctx.meta
        sg = scale[ig].clone()
        _record(history, ig, grad)
        qg = quantize(grad, sg, fmt)
        k = qa.shape[-1]
        n = b_t.shape[-2]
        # input gradient: grad [..., N] @ b [N, K] -> [..., K]; a product of FP8 tensors
        grad_a = fp8_matmul(qg, sg, b_t.mT, sb, out_dtype=torch.float32).sum_to_size(a_shape).to(a_dtype)
        # weight gradient: sum over rows of grad^T @ a -> [N, K] (b_t's layout)
        rows_g, rows_a = qg.reshape(-1, n), qa.reshape(-1, k)
        grad_bt = fp8_matmul(rows_g.t(), sg, rows_a.t(), sa, out_dtype=torch.float32)
        grad_b = (grad_bt if b_transposed else grad_bt.t()).to(b_dtype)
        grad_bias = None
        if bias_shape is not None:
            grad_bias = grad.to(torch.float32).sum_to_size(bias_shape).to(bias_dtype)
        return grad_a, grad_b, grad_bias, None, None, None, None, None, None


def fp8_train_gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor,
                   history: torch.Tensor, *, columns: tuple[int, int, int], b_transposed: bool, grad_format: str,
                   out_dtype: torch.dtype) -> torch.Tensor:
    """The FP8 training GEMM as a node of a training graph calls it (:class:`Fp8GemmFunction`)."""
    out = Fp8GemmFunction.apply(a, b, bias, scale, history, columns, b_transposed, grad_format, out_dtype)
    return out
