"""The ``amp-compiler`` command line: a thin layer over :func:`amp_compiler.convert` and
:func:`amp_compiler.analyze`.

``app`` builds the parser from the commands and turns errors into one line and an exit status;
``convert``, ``report`` and ``compare`` are the commands, one module each; ``args`` holds the argument groups the
commands are made of (each group owns its options, reads them back, and does the work they ask for).
:func:`main` imports them only once it runs, so that Ctrl-C while numpy, onnx and onnx_ir load (a
second or more) ends the command with one line, not a traceback.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    """Run ``amp-compiler`` with ``argv`` (default: the process's arguments); returns the exit status."""
    try:
        from amp_compiler.cli.deferred_imports import defer

        defer()  # before onnx_ir imports sympy, which a conversion never uses
        from amp_compiler.cli.app import main as run
    except KeyboardInterrupt:
        print("amp-compiler: interrupted", file=sys.stderr)
        return 130
    return run(argv)


__all__ = ["main"]
