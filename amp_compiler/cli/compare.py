"""``amp-compiler compare``: run an FP32 model and its conversion side by side and say where they differ.

    both model files (read safely) -> inputs (--data, or generated: --input-shape) -> compare_models -> text or JSON
"""

from __future__ import annotations

import argparse
import sys

from amp_compiler.cli.args.compare import CompareArgs
from amp_compiler.cli.args.report import write_text
from amp_compiler.cli.args.run import RunArgs
from amp_compiler.cli.command import Command

__all__ = ["CompareCommand"]


class CompareCommand(Command):
    """Compare two models' outputs and intermediate tensors (nothing is written but the comparison)."""

    name = "compare"
    help = "compare a converted model with its FP32 original: outputs, and where the error grows"

    def __init__(self) -> None:
        self.options = CompareArgs()
        self.running = RunArgs(load_check=False)
        self.groups = [self.options, self.running]

    def run(self, args: argparse.Namespace) -> int:
        from amp_compiler.onnx.compare import compare_models
        from amp_compiler.onnx.costs.costs import bind_input_shapes
        from amp_compiler.onnx.load import files as onnx_files
        from amp_compiler.report.comparison import render_comparison
        from amp_compiler.runtime.samples import load_samples

        o = self.options
        fp32 = onnx_files.load_model(o.fp32)
        converted = onnx_files.load_model(o.converted)
        samples = load_samples(o.data, fp32) if o.data is not None else None
        shapes = bind_input_shapes(fp32, o.input_shapes) if o.input_shapes else None  # OptionError: a bad name
        with self.running.runner() as runner:  # both models run in one budgeted child process
            comparison = compare_models(
                fp32, converted, samples, provider=o.provider, top=o.top, names=(o.fp32.name, o.converted.name),
                input_shapes=shapes, runner=runner, metric=o.metric, tf32=o.tf32,
            )
        text = render_comparison(comparison, o.format)
        if o.output is not None:
            write_text(o.output, text, o.fp32, o.converted)
        else:
            sys.stdout.write(text)
        return 0
