"""The rows of the GPU benchmark: what one (part, model, variant) measured, as dataclasses and JSON.

Every variant the harness tries becomes a :class:`Row`, whatever happened to it: ``status`` says
what (``ok``; ``failed``, ``timeout`` or ``crashed`` with ``error``; ``unavailable`` when a tool or
library is missing here; ``skipped`` when the variant does not apply to the model; ``not run`` when
the run's deadline came first). The JSON file is a list of these rows with the run's environment.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["FINAL", "SCHEMA_VERSION", "Accuracy", "Placement", "Row", "Timing", "Step"]

SCHEMA_VERSION = 1
#: Statuses a resumed run keeps (the others are measured again).
FINAL = frozenset({"ok", "failed", "timeout", "crashed", "unavailable", "skipped"})


@dataclasses.dataclass(frozen=True)
class Step:
    """One thing to measure: a variant of a model in one part of the benchmark."""

    part: str  # onnx | tensorrt | fx-train | fx-infer
    model: str  # catalog name (fx: the architecture's)
    variant: str


@dataclasses.dataclass
class Timing:
    """Latency (or a training step's time) at one batch size, over ``runs`` timed runs."""

    batch: int
    median_ms: float | None = None  # None: not measured (``note`` says why)
    p90_ms: float | None = None
    runs: int = 0
    note: str = ""


@dataclasses.dataclass
class Placement:
    """Where onnxruntime ran the nodes of one inference (from its profile)."""

    provider: str  # the provider asked for
    nodes: int  # nodes in the profile
    fallback: list[str]  # "OpType name (provider)": nodes with float data on another provider
    shape_like: list[str]  # nodes on another provider that touch no float tensor (shape arithmetic)
    copies: int  # Memcpy nodes onnxruntime inserted between providers


@dataclasses.dataclass
class Accuracy:
    """Worst float output of a run against a reference run."""

    cosine: float | None  # None: a NaN/Inf where the reference is finite
    error_of_range: float | None  # max |error| / (max - min) of the reference output
    nonfinite: bool
    outputs: int  # float outputs compared


@dataclasses.dataclass
class Row:
    part: str
    model: str
    variant: str
    status: str = "ok"
    error: str = ""
    note: str = ""
    seconds: float | None = None  # conversion, engine build or FX preparation time
    size_mb: float | None = None  # the variant's file
    providers: list[str] = dataclasses.field(default_factory=list)  # the session's, as started
    latency: list[Timing] = dataclasses.field(default_factory=list)
    memory_bytes: int | None = None
    memory_how: str = ""
    placement: Placement | None = None
    accuracy_device: Accuracy | None = None  # on the device against FP32 on the same device
    accuracy_emulated: Accuracy | None = None  # amp_compiler's CPU emulation against FP32 on the CPU
    emulator_vs_device: Accuracy | None = None  # the device's outputs against the emulation's
    loss: float | None = None  # FX training: the last step's loss
    skipped_steps: int | None = None  # FX training: steps the loss scaler skipped

    @property
    def step(self) -> Step:
        return Step(self.part, self.model, self.variant)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Row:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in fields}
        values["latency"] = [Timing(**t) for t in values.get("latency") or []]
        if values.get("placement") is not None:
            values["placement"] = Placement(**values["placement"])
        for name in ("accuracy_device", "accuracy_emulated", "emulator_vs_device"):
            if values.get(name) is not None:
                values[name] = Accuracy(**values[name])
        return cls(**values)

    @classmethod
    def failed(cls, step: Step, status: str, error: str) -> Row:
        return cls(step.part, step.model, step.variant, status=status, error=error)
