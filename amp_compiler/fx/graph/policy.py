"""The ATen precision policy: ``aten_ops.toml`` loaded with the ONNX table's machinery.

Categories, reasons and sensitivities are read by :class:`amp_compiler.policy.PolicyTable` (domain
``"aten"``, keyed by overload packet name), so the analysis passes treat both frontends alike. The FX
frontend also reads a few fields of its own (``fp32_args``, ``follow_outputs``, ``observer``, and for
target fp8 ``fp8_operands``, ``fp8_bias``, ``fp8_transposed``, ``fp8_kept``), kept in :class:`AtenOpInfo`.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources

import tomllib
import torch

from amp_compiler.policy import OpPolicy, PolicyTable

__all__ = ["AtenOpInfo", "AtenPolicy", "default_policy", "op_name", "policy_name"]

DOMAIN = "aten"


@dataclasses.dataclass(frozen=True)
class AtenOpInfo:
    """What the FX frontend needs beyond the category: how the op's arguments and outputs relate."""

    fp32_args: frozenset[str] = frozenset()  # schema arguments that keep FP32 (mixed-type kernels)
    follow_outputs: tuple[int, ...] | None = None  # outputs that follow the op (None: all of them)
    observer: bool = False  # reads metadata only (its dtype argument follows its input)
    # Target fp8: the schema arguments of the two matrix operands of an op lowered to the FP8 GEMM, the
    # argument added to the product, and whether the second operand is stored [N, K] (linear's weight).
    fp8_operands: tuple[str, str] | None = None
    fp8_bias: str | None = None
    fp8_transposed: bool = False
    fp8_kept: str | None = None  # a Tensor Core op that stays in the fallback precision for fp8: why


@dataclasses.dataclass(frozen=True)
class AtenPolicy:
    table: PolicyTable
    info: dict[str, AtenOpInfo]

    def get(self, op: str) -> OpPolicy | None:
        return self.table.get(DOMAIN, op)

    def info_of(self, op: str) -> AtenOpInfo:
        return self.info.get(op, _DEFAULT_INFO)


_DEFAULT_INFO = AtenOpInfo()


def load_policy(text: str) -> AtenPolicy:
    table = PolicyTable.from_toml(text)
    info = {}
    for raw in tomllib.loads(text).get("op", []):
        extra = AtenOpInfo(
            fp32_args=frozenset(raw.get("fp32_args", ())),
            follow_outputs=tuple(raw["follow_outputs"]) if "follow_outputs" in raw else None,
            observer=bool(raw.get("observer", False)),
            fp8_operands=_pair(raw["fp8_operands"]) if "fp8_operands" in raw else None,
            fp8_bias=raw.get("fp8_bias"),
            fp8_transposed=bool(raw.get("fp8_transposed", False)),
            fp8_kept=raw.get("fp8_kept"),
        )
        if extra != _DEFAULT_INFO:
            info[raw["op"]] = extra
    return AtenPolicy(table, info)


def _pair(names: list[str]) -> tuple[str, str]:
    if len(names) != 2:
        raise ValueError(f"fp8_operands names two arguments, not {names}")
    return names[0], names[1]


@functools.cache
def default_policy() -> AtenPolicy:
    """The table shipped with the package (read once; it is immutable)."""
    text = resources.files("amp_compiler.policy").joinpath("aten_ops.toml").read_text("utf-8")
    return load_policy(text)


def op_name(target: object) -> str | None:
    """The table key of an FX call target: the ATen overload packet name, or None for other callables."""
    if isinstance(target, torch._ops.OpOverload) and target.namespace == DOMAIN:
        return target._schema.name.split("::", 1)[1]
    return None


def policy_name(name: str) -> str:
    """The entry an op name uses: in-place variants (``add_``) use the functional op's entry."""
    if name.endswith("_") and not name.endswith("__") and len(name) > 1:
        return name[:-1]
    return name
