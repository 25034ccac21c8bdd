"""The ``amp-compiler`` command line: a thin layer over :func:`amp_compiler.convert` and
:func:`amp_compiler.analyze.analyze`.

``app`` builds the parser from the commands and turns errors into one line and an exit status;
``convert`` and ``report`` are the commands, one module each; ``args`` holds the argument groups the
commands are made of (each group owns its options, reads them back, and does the work they ask for).
"""

from amp_compiler.cli.app import main

__all__ = ["main"]
