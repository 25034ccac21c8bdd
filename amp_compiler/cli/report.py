"""``amp-compiler report``: what a conversion would decide per node, and why (nothing is written but the report)."""

from __future__ import annotations

import argparse

from amp_compiler.cli.args.analysis import AnalysisArgs
from amp_compiler.cli.args.conversion import ConversionArgs
from amp_compiler.cli.args.model_file import ModelFileArgs
from amp_compiler.cli.args.report import ReportViewArgs
from amp_compiler.cli.args.run import RunArgs
from amp_compiler.cli.command import Command

__all__ = ["ReportCommand"]


class ReportCommand(Command):
    """Analyze the model (every weight in memory) and show its precision report."""

    name = "report"
    help = "show what a conversion would decide per node, and why"

    def __init__(self) -> None:
        self.files = ModelFileArgs(output=False)
        self.conversion = ConversionArgs()
        self.analysis = AnalysisArgs(self.conversion)
        self.view = ReportViewArgs()
        self.running = RunArgs(load_check=False)
        self.groups = [self.files, self.conversion, self.analysis, self.view, self.running]

    def run(self, args: argparse.Namespace) -> int:
        files = self.files.open()
        with self.running.runner() as runner:  # onnxruntime's child starts while the model is read
            model = files.load()
            report = self.analysis.run(model, model_name=files.source.name, runner=runner).report
        self.view.show(report, files.source)
        return 0
