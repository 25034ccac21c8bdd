"""What to convert to and what to keep in FP32: the options of :class:`~amp_compiler.ConvertOptions`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from amp_compiler import targets
from amp_compiler.cli.args.group import ArgGroup
from amp_compiler.targets import Metric, Provider, Target

if TYPE_CHECKING:  # imported once the options are read back, not to build the parser
    from amp_compiler.options import ConvertOptions

__all__ = ["ConversionArgs"]


class ConversionArgs(ArgGroup):
    """``--target``, ``--provider``, ``--block-op``, ``--block-node``, ``--allow-op``, ``--allow-node``,
    ``--keep-io-types``, ``--no-keep-io-types``,
    ``--input-shape``, ``--input-range``, ``--pad-tensor-cores``, ``--range-fallback``, ``--fp32-products``,
    ``--fallback``, ``--fp8-margin``,
    ``--fp8-calibration``, ``--fp8-percentile``, ``--fp8-max-error``, ``--fp8-budget``, ``--strict``,
    ``--custom-op-precision``, ``--metric``, ``--holdout``.
    Depends on nothing.
    The ``--input-shape`` values are checked against the model in one place, by the conversion
    (:func:`amp_compiler.onnx.costs.costs.bind_input_shapes`), for the plain and the analysis path alike."""

    title = "conversion"
    flags = {
        "target": "--target",
        "provider": "--provider",
        "block_ops": "--block-op",
        "block_nodes": "--block-node",
        "allow_ops": "--allow-op",
        "allow_nodes": "--allow-node",
        "keep_io_types": "--keep-io-types",
        "input_shapes": "--input-shape",
        "pad_tensor_cores": "--pad-tensor-cores",
        "strict": "--strict",
        "input_ranges": "--input-range",
        "fallback": "--fallback",
        "range_fallback": "--range-fallback",
        "fp32_products": "--fp32-products",
        "fp8_margin": "--fp8-margin",
        "fp8_calibration": "--fp8-calibration",
        "fp8_percentile": "--fp8-percentile",
        "fp8_max_error": "--fp8-max-error",
        "fp8_budget": "--fp8-budget",
        "custom_op_precision": "--custom-op-precision",
        "metric": "--metric",
        "holdout": "--holdout",
    }

    def __init__(self) -> None:
        self._options: ConvertOptions | None = None  # read back by parse
        self.input_shapes: dict[str, tuple[int, ...]] | None = None  # None: no --input-shape

    def add_arguments(self, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--target", default="fp16", choices=[t.value for t in Target],
            help="the low-precision type to convert to (default: fp16)",
        )
        group.add_argument(
            "--provider", default="cuda", choices=[p.value for p in Provider],
            help="execution provider the model is meant for (default: cuda)",
        )
        group.add_argument(
            "--block-op", action="append", default=[], metavar="OP",
            help="keep every node of this op type in FP32 (repeatable)",
        )
        group.add_argument(
            "--block-node", action="append", default=[], metavar="REGEX",
            help="keep nodes whose name matches this regular expression (re.search) in FP32 (repeatable)",
        )
        group.add_argument(
            "--allow-op", action="append", default=[], metavar="OP",
            help="force every node of this op type into the low-precision type against the policy, unless "
            "its dtype is fixed, it has no kernel there, or its values do not fit (repeatable; a warning)",
        )
        group.add_argument(
            "--allow-node", action="append", default=[], metavar="REGEX",
            help="force nodes whose name matches this regular expression (re.search) into the low-precision "
            "type, as --allow-op; --block-node beats it, it beats --block-op (repeatable)",
        )
        io = group.add_mutually_exclusive_group()
        io.add_argument(
            "--keep-io-types", dest="keep_io_names", nargs="*", action="extend", default=None, metavar="NAME",
            help="keep these graph inputs and outputs in their type and let the others take the low-precision "
            "type (e.g. --keep-io-types logits: FP16 KV-cache inputs and outputs, FP32 logits); without "
            "names, keep them all (the default)",
        )
        io.add_argument(
            "--no-keep-io-types", dest="keep_io_types", action="store_false",
            help="let graph inputs and outputs take the low-precision type too",
        )
        group.add_argument(
            "--input-shape", action="append", default=[], metavar="NAME:DIMS",
            help="fix a graph input's shape, e.g. input:1x3x224x224; inputs sharing its named dims get them "
            "too (cost estimates, cast placement, random inputs; repeatable)",
        )
        group.add_argument(
            "--input-range", action="append", default=[], metavar="NAME:LO,HI",
            help="the range of a float graph input's values, e.g. audio:-32768,32767: what provably "
            "overflows the target for inputs within it stays FP32; or of an integer input cast to float, "
            "e.g. position_ids:0,8191, which generated inputs then draw in it (repeatable)",
        )
        group.add_argument(
            "--pad-tensor-cores", action="store_true",
            help="pad FP16/BF16 MatMul/Gemm/Conv weights to multiples of 8 with zeros and slice the "
            "outputs back (exact; off by default)",
        )
        group.add_argument(
            "--range-fallback", choices=["scaled", "bf16", "fp32"], default=None,
            help="--target fp16: the type of nodes kept out of FP16 only by their range (constants, "
            "calibration, probe or input-range overflow): scaled runs MatMul/Gemm/Conv among them in FP16 on "
            "power-of-two scaled operands where the observed ranges allow it, and the rest as bf16; "
            "bf16 where the provider has a BF16 kernel (BF16 Tensor "
            "Cores: Ampere sm_80 and later, Ada, Hopper, Blackwell; not Turing/T4 or Volta/V100: give "
            "fp32 there), or fp32 (default: scaled for cuda and tensorrt, fp32 for cpu and with --tolerance)",
        )
        group.add_argument(
            "--fp32-products", choices=["plain", "split"], default="plain",
            help="MatMul/Gemm/Conv kept in FP32 for their precision: plain (as they are: GPUs from Ampere "
            "on read FP32 products as TF32 by default, at FP16's operand precision) or split (written "
            "TF32-proof: each operand split into a BF16-exact part and the rest, four products summed in "
            "FP32; 4x their Tensor Core work) (default: %(default)s)",
        )
        group.add_argument(
            "--fallback", choices=[Target.FP16.value, Target.BF16.value], default=None,
            help="--target fp8: the precision of every op that does not run in FP8, and of the Q/DQ scales "
            "(default: fp16)",
        )
        group.add_argument(
            "--fp8-margin", type=int, default=targets.FP8_MARGIN, metavar="N",
            help="--target fp8: activation scales are calibration amax * 2^N / 448, headroom for larger "
            "values (default: %(default)s)",
        )
        group.add_argument(
            "--fp8-calibration", choices=["max", "percentile"], default=targets.FP8_CALIBRATION,
            help="--target fp8: an activation's amax is the max of |x| over the calibration data, or a "
            "percentile of it (values above saturate: outliers are clipped) (default: %(default)s)",
        )
        group.add_argument(
            "--fp8-percentile", type=float, default=targets.FP8_PERCENTILE, metavar="P",
            help="--target fp8 with --fp8-calibration percentile: the percentile of |x| taken as amax "
            "(default: %(default)s)",
        )
        group.add_argument(
            "--fp8-max-error", type=float, default=targets.FP8_MAX_ERROR, metavar="REL_L2",
            help="--target fp8: a MatMul/Gemm/Conv takes FP8 inputs only when its output moves by at most "
            "this relative L2 error vs FP16 inputs on the calibration data (default: %(default)s)",
        )
        group.add_argument(
            "--fp8-budget", type=float, default=targets.FP8_BUDGET, metavar="REL_L2",
            help="--target fp8: of those, the GEMMs with the most FLOPs whose FP8 inputs together move the "
            "outputs by at most this relative L2 error vs FP32 on the calibration data (default: %(default)s)",
        )
        group.add_argument(
            "--custom-op-precision", action="append", default=[], metavar="OP=fp16|bf16|fp32",
            help="the precision of a custom op no table knows (Op or domain::Op; a TensorRT plugin declares its "
            "output types): its float inputs and outputs take it instead of FP32 with Casts around it (repeatable)",
        )
        group.add_argument(
            "--metric", choices=[m.value for m in Metric], default=Metric.REL_L2.value,
            help="how --tolerance and --fp8-budget measure an output's error against FP32: relative L2, max "
            "|error| as a share of FP32's range, 1 - cosine, or the share of argmax (top-1) changes over the "
            "last axis; the worst output counts (default: %(default)s)",
        )
        group.add_argument(
            "--holdout", type=float, default=targets.HOLDOUT, metavar="SHARE",
            help="--tolerance and --fp8-budget choose on the calibration samples less this share of them, "
            "and tighten the choice until it holds on the held-out ones too (none from fewer than 2 "
            "samples; 0: none) (default: %(default)s)",
        )
        group.add_argument(
            "--no-probe", dest="probe", action="store_false",
            help="without --calibration-data, do not run the FP32 model on generated inputs first (the range "
            "probe: what overflows or flushes on them stays FP32, and the output error is measured on them)",
        )
        group.add_argument(
            "--strict", action="store_true",
            help="fail (exit 2) instead of warning when nodes would be left as they are because the "
            "element type of a tensor of theirs is unknown (custom ops no schema describes)",
        )

    @property
    def options(self) -> ConvertOptions:
        """The conversion options read back (the defaults before :meth:`parse`)."""
        if self._options is None:
            from amp_compiler.options import ConvertOptions

            self._options = ConvertOptions()
        return self._options

    def parse(self, args: argparse.Namespace) -> None:
        from amp_compiler.onnx.costs.costs import parse_input_shapes
        from amp_compiler.options import (
            ConvertOptions,
            check_custom_op_precision,
            parse_custom_op_precision,
            parse_input_range,
        )

        shapes = parse_input_shapes(args.input_shape)  # OptionError(option="input_shapes") when malformed
        self.input_shapes = shapes or None
        declared = tuple(parse_custom_op_precision(text) for text in args.custom_op_precision)
        check_custom_op_precision(declared)  # an op declared twice
        self._options = ConvertOptions(
            target=Target.parse(args.target),
            provider=Provider.parse(args.provider),
            keep_io_types=tuple(args.keep_io_names) if args.keep_io_names else args.keep_io_types,
            block_ops=frozenset(args.block_op),
            block_nodes=tuple(args.block_node),
            allow_ops=frozenset(args.allow_op),
            allow_nodes=tuple(args.allow_node),
            pad_tensor_cores=args.pad_tensor_cores,
            input_shapes=tuple(shapes.items()),
            strict=args.strict,
            input_ranges=tuple(parse_input_range(text) for text in args.input_range),
            fallback=Target.parse(args.fallback, option="fallback") if args.fallback else None,
            range_fallback=args.range_fallback,
            fp32_products=args.fp32_products,
            fp8_margin=args.fp8_margin,
            fp8_calibration=args.fp8_calibration,
            fp8_percentile=args.fp8_percentile,
            fp8_max_error=args.fp8_max_error,
            fp8_budget=args.fp8_budget,
            custom_op_precision=declared,
            metric=Metric(args.metric),
            holdout=args.holdout,
            probe=args.probe,
        )
