"""Pausing Python's cyclic garbage collector while a conversion runs."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import ParamSpec, TypeVar

__all__ = ["gc_paused"]

P = ParamSpec("P")
R = TypeVar("R")


def gc_paused(func: Callable[P, R]) -> Callable[P, R]:
    """Run ``func`` with Python's cyclic garbage collector paused (and restored after).

    A conversion allocates millions of long-lived objects (the IR, the precision graph); each full
    collection walks all of them, which made converting a 100,000-node graph twice as slow. What a
    conversion leaves behind is freed by reference counting, or by the next collection after it.
    """

    @functools.wraps(func)
    def paused(*args: P.args, **kwargs: P.kwargs) -> R:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return func(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()

    return paused
