"""The installed onnxruntime: the one import of it, with one clear error when there is none, or two.

onnxruntime ships as several distributions that all install the same ``onnxruntime`` package
(``onnxruntime`` for the CPU, ``onnxruntime-gpu`` for CUDA and TensorRT, ``onnxruntime-directml``,
...). amp-compiler depends on none of them: its ``[cpu]`` and ``[gpu]`` extras pick one. Two of them
in one environment overwrite each other's files (the last one installed wins, usually the CPU build,
which then hides the CUDA provider), so that is refused too. Everything that needs onnxruntime (its
op schemas, a model run, its symbolic shape inference) gets the module from :func:`onnxruntime`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType

from amp_compiler.errors import RuntimeMissingError

__all__ = ["INSTALL_HINT", "installed_distributions", "is_installed", "onnxruntime", "require"]

PACKAGE = "onnxruntime"
INSTALL_HINT = "pip install 'amp-compiler[cpu]' (or 'amp-compiler[gpu]' for CUDA/TensorRT)"


@functools.cache
def installed_distributions() -> tuple[str, ...]:
    """The installed distributions that provide the ``onnxruntime`` package (``onnxruntime``,
    ``onnxruntime-gpu``, ...), from their metadata."""
    from importlib import metadata  # only when onnxruntime is needed (importing it costs start-up time)

    return tuple(sorted(set(metadata.packages_distributions().get(PACKAGE, ()))))


def onnxruntime(needed_for: str) -> ModuleType:
    """The ``onnxruntime`` module. Raises :class:`RuntimeMissingError` (one line, saying what it was
    ``needed_for``) when it cannot be imported, or when two distributions of it are installed."""
    distributions = installed_distributions()
    if len(distributions) > 1:
        raise RuntimeMissingError(
            f"{' and '.join(distributions)} are all installed: they overwrite each other's files in one "
            f"'onnxruntime' package (the CPU build usually wins and hides the CUDA provider); "
            f"pip uninstall {' '.join(distributions)}, then {INSTALL_HINT}"
        )
    try:
        return _import()
    except ImportError as exc:
        if distributions:  # installed, but broken (a missing shared library, ...)
            raise RuntimeMissingError(f"{distributions[0]} is installed but does not load ({exc}); needed to "
                                      f"{needed_for}") from None
        raise _missing(needed_for) from None


def is_installed() -> bool:
    """Whether an ``onnxruntime`` package can be found (without importing it: cheap)."""
    return importlib.util.find_spec(PACKAGE) is not None


def require(needed_for: str) -> None:
    """Raise :class:`RuntimeMissingError` when no ``onnxruntime`` package can be found, without
    importing it (for work that imports it in a child process)."""
    if not is_installed():
        raise _missing(needed_for)


def _missing(needed_for: str) -> RuntimeMissingError:
    return RuntimeMissingError(f"onnxruntime is not installed (needed to {needed_for}): {INSTALL_HINT}")


def _import() -> ModuleType:
    return importlib.import_module(PACKAGE)
