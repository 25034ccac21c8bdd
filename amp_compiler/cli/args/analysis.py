"""Calibration and accuracy options: the analysis path (:func:`amp_compiler.analyze`)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from amp_compiler.cli.args.conversion import ConversionArgs
from amp_compiler.cli.args.group import ArgGroup

if TYPE_CHECKING:  # imported when the analysis runs, not to build the parser
    import onnx

    from amp_compiler.analysis import Analysis
    from amp_compiler.runtime.runner import Runner

__all__ = ["AnalysisArgs"]


class AnalysisArgs(ArgGroup):
    """``--calibration-data`` and ``--tolerance``. Either one asks for the analysis path, which reads
    every weight into memory and runs the model in onnxruntime. Depends on :class:`ConversionArgs`
    (the options and input shapes the analysis converts with)."""

    title = "calibration and accuracy"
    flags = {"calibration_data": "--calibration-data", "tolerance": "--tolerance"}

    def __init__(self, conversion: ConversionArgs):
        self.conversion = conversion
        self.calibration_data: str | None = None
        self.tolerance: float | None = None

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--calibration-data", metavar="PATH",
            help="sample inputs: an .npz keyed by graph input name, or a folder of them",
        )
        group.add_argument(
            "--tolerance", type=float, metavar="REL_L2",
            help="pin nodes to FP32 until every float output is within this relative L2 error of FP32 "
            "(needs --calibration-data)",
        )

    def parse(self, args: argparse.Namespace) -> None:
        self.calibration_data, self.tolerance = args.calibration_data, args.tolerance

    @property
    def asked(self) -> bool:
        """True when an option of this group asks for the analysis path."""
        return bool(self.calibration_data) or self.tolerance is not None

    def run(self, model: onnx.ModelProto, *, model_name: str, runner: Runner) -> Analysis:
        """Convert and explain ``model`` (every weight in memory, checked), running it with ``runner``."""
        from amp_compiler.analysis import analyze

        return analyze(
            model,
            self.conversion.options,
            model_name=model_name,
            calibration_data=self.calibration_data,
            tolerance=self.tolerance,
            runner=runner,
        )
