"""Running the model: the time and memory budget of onnxruntime's child process, and the load check."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from amp_compiler.cli.args.group import ArgGroup
from amp_compiler.errors import OptionError
from amp_compiler.runtime.budget import DEFAULT_SECONDS, RunBudget, default_memory
from amp_compiler.sizes import format_bytes, parse_bytes

if TYPE_CHECKING:  # the runner (numpy, onnx) is imported when a command starts one
    from amp_compiler.runtime.runner import ChildRunner

__all__ = ["RunArgs"]


class RunArgs(ArgGroup):
    """``--max-run-seconds``, ``--max-run-memory`` and, for a command that writes a model,
    ``--no-load-check``. Every onnxruntime load and run of the user's model (calibration, accuracy,
    ``--tolerance``, the load check) happens in one child process with this budget
    (:class:`~amp_compiler.runtime.runner.ChildRunner`). Depends on nothing."""

    title = "running the model (onnxruntime, in a child process)"
    flags = {"run_seconds": "--max-run-seconds", "run_memory": "--max-run-memory"}

    def __init__(self, *, load_check: bool):
        self.has_load_check = load_check
        self.budget = RunBudget()
        self.load_check = load_check

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--max-run-seconds", type=float, default=DEFAULT_SECONDS, metavar="SECONDS",
            help=f"the longest one load or run of the model may take; past it the model is stopped "
            f"and the command fails (default: {DEFAULT_SECONDS:g})",
        )
        group.add_argument(
            "--max-run-memory", default=None, metavar="SIZE",
            help="the memory onnxruntime may use for the model, e.g. 4G or 512MiB; past it the command "
            f"fails (default: half of this machine's memory, {format_bytes(default_memory())})",
        )
        if self.has_load_check:
            group.add_argument(
                "--no-load-check", dest="load_check", action="store_false",
                help="write the converted model without first checking that onnxruntime loads it "
                "(a crash of onnxruntime on it is otherwise an error, and nothing is written)",
            )

    def parse(self, args: argparse.Namespace) -> None:
        memory = default_memory()
        if args.max_run_memory is not None:
            try:
                memory = parse_bytes(args.max_run_memory)
            except ValueError as exc:
                raise OptionError(str(exc), option="run_memory") from None
        self.budget = RunBudget(seconds=args.max_run_seconds, memory=memory)
        self.load_check = self.has_load_check and args.load_check

    def runner(self) -> ChildRunner:
        """A child process with the budget, started now (its import of onnxruntime overlaps the
        command's own work); close it (a context manager) when done."""
        from amp_compiler.runtime.runner import ChildRunner

        return ChildRunner(self.budget)
