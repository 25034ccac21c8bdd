"""The ``compare`` command's options: the two models, the inputs, where they run, and the output."""

from __future__ import annotations

import argparse
from pathlib import Path

from amp_compiler.cli.args.group import ArgGroup
from amp_compiler.errors import OptionError
from amp_compiler.targets import Metric, Provider

__all__ = ["CompareArgs", "FORMATS"]

#: :func:`amp_compiler.report.comparison.render_comparison`'s formats, spelt here so that building the
#: parser does not import the comparison (numpy, onnx_ir); a test checks they are the same.
FORMATS = ("terminal", "json")


class CompareArgs(ArgGroup):
    """``FP32_MODEL CONVERTED_MODEL``, ``--data``, ``--input-shape``, ``--provider``, ``--tf32``, ``--top``,
    ``--metric``, ``--format``, ``-o``. Depends on nothing. ``--input-shape``'s names are checked against
    the model once it is read (the command's ``bind_input_shapes``)."""

    title = "comparison"
    flags = {"provider": "--provider", "data": "--data", "top": "--top", "metric": "--metric", "tf32": "--tf32",
             "input_shapes": "--input-shape"}

    def __init__(self) -> None:
        self.fp32 = Path()
        self.converted = Path()
        self.data: Path | None = None
        self.input_shapes: dict[str, tuple[int, ...]] | None = None  # None: no --input-shape
        self.provider = Provider.CPU
        self.tf32 = False
        self.top = 5
        self.metric = Metric.REL_L2
        self.format = "terminal"
        self.output: Path | None = None

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument("fp32_model", help="the FP32 ONNX model (the reference)")
        group.add_argument("converted_model", help="its conversion (by amp-compiler or any other tool)")
        group.add_argument(
            "--data", metavar="PATH",
            help="inputs: an .npz keyed by graph input name, or a folder of them (default: the inputs convert's "
                 "range probe generates)",
        )
        group.add_argument(
            "--input-shape", action="append", default=[], metavar="NAME:DIMS",
            help="without --data: fix a graph input's shape for the generated inputs, e.g. input_ids:1x256 "
            "(as convert's --input-shape; repeatable)",
        )
        group.add_argument(
            "--provider", default="cpu", choices=["cpu", "cuda"],
            help="where the converted model runs: cpu (exact FP16/BF16 emulation, the default) or cuda "
            "(its real kernels; needs onnxruntime-gpu)",
        )
        group.add_argument(
            "--tf32", action="store_true",
            help="emulate the FP32 matrix products and convolutions as Ampere and later GPUs run them by "
            "default: their operands rounded to TF32's 10 mantissa bits (onnxruntime's CUDA provider, "
            "use_tf32; TensorRT's TF32 flag); with --provider cpu",
        )
        group.add_argument(
            "--top", type=int, default=5, metavar="N", help="name the N nodes where the error grows most"
        )
        group.add_argument(
            "--metric", choices=[m.value for m in Metric], default=Metric.REL_L2.value,
            help="the outputs' error reported as 'worst output error' (the one --tolerance holds; "
            "default: %(default)s)",
        )
        group.add_argument("--format", default="terminal", choices=list(FORMATS), help="output format (json for CI)")
        group.add_argument("-o", "--output", metavar="FILE", help="write the comparison here instead of stdout")

    def parse(self, args: argparse.Namespace) -> None:
        self.fp32, self.converted = Path(args.fp32_model), Path(args.converted_model)
        self.data = Path(args.data) if args.data else None
        if args.input_shape:
            from amp_compiler.onnx.costs.costs import parse_input_shapes

            if self.data is not None:
                raise OptionError("sizes the generated inputs; --data gives the inputs", option="input_shapes")
            self.input_shapes = parse_input_shapes(args.input_shape)
        self.provider = Provider.parse(args.provider)
        self.tf32 = bool(args.tf32)
        if self.tf32 and self.provider is not Provider.CPU:
            raise OptionError("emulates TF32 on the cpu provider; on cuda onnxruntime's use_tf32 decides "
                              "(on by default)", option="tf32")
        if args.top < 0:
            raise OptionError(f"must be 0 or more, got {args.top}", option="top")
        self.top, self.format, self.metric = args.top, args.format, Metric(args.metric)
        self.output = Path(args.output) if args.output else None
