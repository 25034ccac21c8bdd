"""Which providers run DequantizeLinear -> Tensor Core op as one integer kernel (``qdq_units.toml``).

A product whose quantizable operands all come from DequantizeLinear (a statically quantized model's
convolution or matrix product, with or without a QuantizeLinear after it) is a "node unit" that
TensorRT's explicit quantization, and for MatMul/Gemm onnxruntime's CPU QDQ transformer, fuse into an
int8 kernel. Only a DequantizeLinear output that feeds the product directly is fused: a Cast between
them makes the int8 product a float product on dequantized values. The table says, per provider and
op, whether it fuses the unit (``fused``) or runs it as a DequantizeLinear and a float product
(``unfused``), each with the reason and source the decisions quote.
"""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources

import tomllib

from amp_compiler.targets import Provider

__all__ = ["QdqUnitFact", "QdqUnitTable", "qdq_unit_table"]


@dataclasses.dataclass(frozen=True)
class QdqUnitFact:
    """What ``provider`` does with a DequantizeLinear -> ``op`` unit: ``fused`` into an integer kernel or not,
    and why."""

    provider: Provider
    op: str
    fused: bool
    reason: str
    source: str


@dataclasses.dataclass(frozen=True)
class QdqUnitTable:
    facts: dict[tuple[Provider, str], QdqUnitFact]

    def fact(self, provider: Provider, domain: str, op_type: str) -> QdqUnitFact | None:
        """The provider's fact for an ai.onnx ``op_type`` (None: no entry, or another domain)."""
        if domain not in ("", "ai.onnx"):
            return None
        return self.facts.get((provider, op_type))

    @classmethod
    def from_toml(cls, text: str) -> QdqUnitTable:
        raw = tomllib.loads(text)
        facts: dict[tuple[Provider, str], QdqUnitFact] = {}
        for key, fused in (("fused", True), ("unfused", False)):
            for entry in raw.get(key, ()):
                provider = Provider(entry["provider"])
                for op in entry["ops"]:
                    if (provider, op) in facts:
                        raise ValueError(f"qdq_units.toml: {provider.value} {op} listed twice")
                    facts[(provider, op)] = QdqUnitFact(provider, op, fused, entry["reason"], entry["source"])
        return cls(facts)


@functools.cache
def qdq_unit_table() -> QdqUnitTable:
    """The table shipped with the package (read once)."""
    return QdqUnitTable.from_toml(resources.files("amp_compiler.policy").joinpath("qdq_units.toml").read_text("utf-8"))
