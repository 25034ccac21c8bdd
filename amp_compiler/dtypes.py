"""Element types by name: the one table of the short names decisions and reports use ("fp16"), and their order."""

from __future__ import annotations

import onnx_ir as ir

__all__ = [
    "FLOAT_TYPES", "HIGH_PRECISION", "LOW_PRECISIONS", "MIXED", "NO_FLOAT", "PRECISIONS",
    "from_schema_type", "from_short_name", "precision_rank", "schema_type", "short_name",
]

# The float types a conversion may change; everything else keeps its type.
FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})

_SHORT_NAMES = {
    ir.DataType.FLOAT: "fp32",
    ir.DataType.FLOAT16: "fp16",
    ir.DataType.BFLOAT16: "bf16",
    ir.DataType.DOUBLE: "fp64",
    ir.DataType.FLOAT8E4M3FN: "fp8",
    ir.DataType.FLOAT8E5M2: "fp8e5m2",
}


#: The low-precision formats a decision names, fewest bits first: FP8 E4M3, FP16, BF16.
LOW_PRECISIONS = tuple(_SHORT_NAMES[t] for t in (ir.DataType.FLOAT8E4M3FN, ir.DataType.FLOAT16, ir.DataType.BFLOAT16))
HIGH_PRECISION = _SHORT_NAMES[ir.DataType.FLOAT]
MIXED = "mixed"  # a node whose float tensors are of more than one type
NO_FLOAT = "none"  # a node without float data (or that reads only a shape)
#: Every precision a decision names, in the order reports list and stack them: low precision first.
PRECISIONS = (*LOW_PRECISIONS, MIXED, HIGH_PRECISION, NO_FLOAT)


def precision_rank(precision: str) -> tuple[int, str]:
    """Sort key of a precision: its place in :data:`PRECISIONS` (other names after them, by name)."""
    return (PRECISIONS.index(precision) if precision in PRECISIONS else len(PRECISIONS), precision)


def short_name(dtype: ir.DataType) -> str:
    """"fp32", "fp16", "bf16", "fp64", "fp8" (E4M3), "fp8e5m2" for the float types, else the type's
    name in lower case ("int64")."""
    name = _SHORT_NAMES.get(dtype)
    return name if name is not None else dtype.name.lower()


def from_short_name(name: str) -> ir.DataType | None:
    """The float type a short name names ("fp16" -> FLOAT16), or None."""
    return next((dtype for dtype, short in _SHORT_NAMES.items() if short == name), None)


def schema_type(dtype: ir.DataType) -> str:
    """The ONNX schema spelling of a tensor type, as in type constraints: ``tensor(float16)``."""
    return f"tensor({dtype.name.lower()})"


def from_schema_type(type_str: str) -> ir.DataType | None:
    """The element type a schema's ``tensor(float16)`` names (None for other type strings: sequences,
    maps, optionals)."""
    if not (type_str.startswith("tensor(") and type_str.endswith(")")):
        return None
    return ir.DataType.__members__.get(type_str[len("tensor(") : -1].upper())
