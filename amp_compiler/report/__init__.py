"""Per-node precision reports: the data model (``model``), how it is built (``build``), and renderers."""

from amp_compiler.report.model import (
    SCHEMA_VERSION,
    NodeError,
    NodeReport,
    OutputAccuracy,
    PrecisionReport,
    Summary,
    TensorRange,
)

__all__ = [
    "SCHEMA_VERSION",
    "NodeError",
    "NodeReport",
    "OutputAccuracy",
    "PrecisionReport",
    "Summary",
    "TensorRange",
]
