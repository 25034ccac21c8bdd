"""A loss scaler with ``torch.amp.GradScaler``'s semantics, whose scale is a tensor the graph reads.

Dynamic scaling (the default): the scale starts at ``init_scale`` (2**16); a step whose gradients hold
an inf or NaN is skipped and the scale is multiplied by ``backoff_factor`` (0.5); after
``growth_interval`` (2000) consecutive finite steps it is multiplied by ``growth_factor`` (2.0).
``unscale_(optimizer)`` divides the gradients by the scale (call it before clipping them);
``step(optimizer)`` unscales if that was not done and skips the step on inf/NaN; ``update()`` moves
the scale. The arithmetic is GradScaler's own (``torch._amp_foreach_non_finite_check_and_unscale_``
and ``torch._amp_update_scale_`` on an FP32 scale), so the scale sequence is the same.

``dynamic=False`` keeps the scale fixed (a static loss scale); steps with inf/NaN gradients are still
skipped. ``enabled=False`` scales by 1 and never skips (BF16 needs no loss scaling).

MindSpore's names are accepted as equivalents: ``scale_value`` = ``init_scale``; ``scale_factor`` = f
sets ``growth_factor`` = f and ``backoff_factor`` = 1/f (MindSpore divides by the same factor it
multiplies by); ``scale_window`` = ``growth_interval``.

``state_dict()`` has exactly GradScaler's keys (``scale``, ``growth_factor``, ``backoff_factor``,
``growth_interval``, ``_growth_tracker``), so either loads the other's state and behaves the same
from there. A static scale is written the way GradScaler can run it: growth and backoff factors of
1.0 (the scale never moves; non-finite steps are still skipped); loading factors of 1.0 makes a
scaler static, any others dynamic.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

__all__ = ["LossScaler"]


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


class LossScaler:
    def __init__(
        self,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
        dynamic: bool = True,
        *,
        scale_value: float | None = None,
        scale_factor: float | None = None,
        scale_window: int | None = None,
    ):
        if scale_value is not None:
            init_scale = float(scale_value)
        if scale_factor is not None:
            if scale_factor <= 1.0:
                raise ValueError("scale_factor must be > 1 (MindSpore multiplies and divides the scale by it)")
            growth_factor, backoff_factor = float(scale_factor), 1.0 / float(scale_factor)
        if scale_window is not None:
            growth_interval = int(scale_window)
        if growth_factor <= 1.0:
            raise ValueError("growth_factor should be > 1.")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError("backoff_factor should be < 1.")
        if growth_interval <= 0:
            raise ValueError("growth_interval should be a positive integer.")
        self._enabled = bool(enabled)
        self.dynamic = bool(dynamic)
        self._init_scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        # The graph multiplies the loss by this tensor: it is updated in place, never replaced.
        self.scale_tensor = torch.tensor(self._init_scale if self._enabled else 1.0, dtype=torch.float32)
        self._growth_tracker = torch.zeros((), dtype=torch.int32)
        self._states: dict[int, dict] = {}

    # -- queries -----------------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        return float(self.scale_tensor.item()) if self._enabled else 1.0

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    # -- the step ----------------------------------------------------------------------------------
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss`` times the scale (for losses computed outside the graph)."""
        return loss * self.scale_tensor.to(loss.device) if self._enabled else loss

    def _state(self, optimizer) -> dict:
        return self._states.setdefault(id(optimizer), {"stage": _Stage.READY, "found_inf": None})

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and record whether any is inf/NaN."""
        if not self._enabled:
            return
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self.scale_tensor.double().reciprocal().float()
        found_inf = torch.zeros((), dtype=torch.float32)
        groups: dict[tuple, list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients: master parameters must be FP32.")
                grad = p.grad._values() if p.grad.is_sparse else p.grad
                groups.setdefault((grad.device, grad.dtype), []).append(grad)
        for (device, _), grads in groups.items():
            dev_inf = torch.zeros((), dtype=torch.float32, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, dev_inf, inv_scale.to(device))
            found_inf += dev_inf.cpu()
        state["found_inf"] = found_inf
        state["stage"] = _Stage.UNSCALED

    def found_inf(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the gradients unscaled for ``optimizer`` in this step hold an inf or NaN."""
        state = self._states.get(id(optimizer))
        return bool(state and state["found_inf"] is not None and state["found_inf"].item())

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless the (unscaled) gradients hold an inf or NaN; returns its result."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        result = None
        if not state["found_inf"].item():
            result = optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return result

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        """Move the scale: back off after a non-finite step, grow after ``growth_interval`` good ones."""
        if not self._enabled:
            return
        if new_scale is not None:
            value = new_scale.item() if isinstance(new_scale, torch.Tensor) else float(new_scale)
            self.scale_tensor.fill_(value)
        elif self.dynamic:
            infs = [s["found_inf"] for s in self._states.values() if s["found_inf"] is not None]
            if not infs:
                raise RuntimeError("No inf checks were recorded prior to update.")
            found = infs[0].clone()
            for f in infs[1:]:
                found += f
            torch._amp_update_scale_(
                self.scale_tensor, self._growth_tracker, found,
                self._growth_factor, self._backoff_factor, self._growth_interval,
            )
        self._states = {}

    # -- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        if not self._enabled:
            return {}
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor if self.dynamic else 1.0,
            "backoff_factor": self._backoff_factor if self.dynamic else 1.0,
            "growth_interval": self._growth_interval,
            "_growth_tracker": int(self._growth_tracker.item()),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError(
                "The source state dict is empty, possibly because it was saved from a disabled instance."
            )
        self.scale_tensor.fill_(float(state_dict["scale"]))  # in place: the graph holds this tensor
        growth, backoff = float(state_dict["growth_factor"]), float(state_dict["backoff_factor"])
        self.dynamic = not (growth == 1.0 and backoff == 1.0)
        if self.dynamic:  # a static state keeps this scaler's own factors, for set_* calls later
            self._growth_factor, self._backoff_factor = growth, backoff
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker.fill_(int(state_dict["_growth_tracker"]))

    def __repr__(self) -> str:
        kind = "disabled" if not self._enabled else ("dynamic" if self.dynamic else "static")
        return f"LossScaler({kind}, scale={self.get_scale():g})"
