"""The budget of running an untrusted model: seconds per load or run, bytes of address space.

Kept apart from :mod:`amp_compiler.runtime.runner` (which imports numpy and onnx) so that the command line
can show the defaults in its help without loading them.
"""

from __future__ import annotations

import dataclasses
import math
import os

from amp_compiler.errors import OptionError
from amp_compiler.sizes import format_bytes

__all__ = ["DEFAULT_SECONDS", "MIN_MEMORY", "RunBudget", "default_memory"]

#: Default time budget of one load or one run of the model, in seconds.
DEFAULT_SECONDS = 300.0
#: The least memory budget: onnxruntime and numpy alone take about 200 MB of address space.
MIN_MEMORY = 512 * 2**20


def default_memory() -> int:
    """The default memory budget: half of the machine's physical memory (at least ``MIN_MEMORY``)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 * 2**30
    return max(MIN_MEMORY, total // 2)


@dataclasses.dataclass(frozen=True)
class RunBudget:
    """What running an untrusted model may take: ``seconds`` per load or run of it, ``memory`` bytes
    of address space for the process that runs it (onnxruntime's ~200 MB included)."""

    seconds: float = DEFAULT_SECONDS
    memory: int = dataclasses.field(default_factory=default_memory)

    def __post_init__(self) -> None:
        if not (self.seconds > 0 and math.isfinite(self.seconds)):
            raise OptionError(f"must be a positive number of seconds, got {self.seconds}", option="run_seconds")
        if self.memory < MIN_MEMORY:
            raise OptionError(
                f"{format_bytes(self.memory)} is too little to run onnxruntime (at least {format_bytes(MIN_MEMORY)})",
                option="run_memory",
            )
