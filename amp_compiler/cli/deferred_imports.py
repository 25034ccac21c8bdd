"""Libraries the command line imports only when something uses them: stand-in modules until then.

onnx_ir imports sympy when it is imported (for the arithmetic of symbolic dims, which a conversion
never does); sympy takes 0.2 s to import on a quiet machine and up to 0.9 s on a busy one, a large
part of a small conversion's time. :func:`defer` puts a stand-in module in ``sys.modules`` that
imports the real one the first time anything reads an attribute of it (``sympy.Expr``, ``from sympy
import Symbol``, a submodule's import) and from then on is the real one (its namespace copied in;
``sys.modules`` holds the real module). ``import sympy`` alone does not load it.

Only the ``amp-compiler`` process does this (:func:`amp_compiler.cli.main`), before it imports
anything else: a library user's process keeps its modules as it imported them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
import types

__all__ = ["defer"]

#: What the command line defers: imported by a dependency at its import, not used by a plain conversion
#: (onnx_ir's own module for symbolic dims reads sympy's functions when it is imported).
DEFERRED = ("sympy", "onnx_ir._symbolic_shapes")

_LOCK = threading.RLock()


class _StandIn(types.ModuleType):
    """A module that imports the real one on first attribute access and then takes its namespace."""

    def __getattr__(self, attr: str) -> object:
        return getattr(self._load(), attr)

    def _load(self) -> types.ModuleType:
        name = self.__name__
        with _LOCK:
            if sys.modules.get(name) is self:
                del sys.modules[name]
                try:
                    real = importlib.import_module(name)
                except BaseException:
                    sys.modules.setdefault(name, self)
                    raise
                self.__dict__.update(real.__dict__)
            return sys.modules[name]


def defer(names: tuple[str, ...] = DEFERRED) -> None:
    """Put a stand-in in ``sys.modules`` for each of ``names`` that is installed and not yet imported."""
    for name in names:
        top = name.partition(".")[0]  # a submodule's package is not imported to look for it
        if name in sys.modules or importlib.util.find_spec(top) is None:
            continue
        sys.modules[name] = _StandIn(name)


def is_deferred(name: str) -> bool:
    """True while ``name`` is a stand-in that has not imported the real module."""
    return isinstance(sys.modules.get(name), _StandIn)
