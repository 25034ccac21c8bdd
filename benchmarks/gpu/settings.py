"""How much the GPU benchmark measures: the settings of a full run and of ``--quick``, shared by the
command line and the worker processes (as JSON)."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["Settings", "full", "quick"]


@dataclasses.dataclass(frozen=True)
class Settings:
    provider: str  # cuda | tensorrt | cpu: where sessions run and what amp-compiler converts for
    workdir: str  # FP32 models, variants and reference outputs, one folder per model
    batches: tuple[int, ...] = (1, 8)
    warmup: int = 10
    repeats: int = 100
    step_timeout_s: float = 900.0  # one variant of one model (conversion and measurements)
    deadline: float | None = None  # time.time() after which no step starts
    fx_train_batch: int = 32
    fx_infer_batch: int = 8
    fx_warmup: int = 5
    fx_steps: int = 20
    fx_inner: str = "inductor"  # the compile backend's inner backend

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Settings:
        return cls(**{**data, "batches": tuple(data["batches"])})


def full(provider: str, workdir: str) -> Settings:
    return Settings(provider, workdir)


def quick(provider: str, workdir: str) -> Settings:
    """Reduced models' settings: enough runs to exercise every code path, in a couple of minutes on
    a CPU (the compile backend's inner backend ``eager``: Inductor's C++ build would take minutes)."""
    return Settings(provider, workdir, warmup=2, repeats=10, step_timeout_s=240.0, fx_train_batch=4,
                    fx_infer_batch=2, fx_warmup=1, fx_steps=2, fx_inner="eager")
