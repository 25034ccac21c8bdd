"""The precision policy: one declarative table of op categories, each with a reason."""

from amp_compiler.policy.table import (
    Category,
    GemmKind,
    GemmLayout,
    OpPolicy,
    PolicyTable,
    Sensitivity,
    default_table,
)

__all__ = ["Category", "GemmKind", "GemmLayout", "OpPolicy", "PolicyTable", "Sensitivity", "default_table"]
