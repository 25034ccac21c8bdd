"""Conversion options: what to convert to and what to leave alone, and their checks."""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Mapping
from typing import Any

from amp_compiler import targets
from amp_compiler.core.tensor_error import ErrorMetric, Metric, parse_metric
from amp_compiler.errors import OptionError
from amp_compiler.policy import PolicyTable, schemas
from amp_compiler.targets import Provider, Target

__all__ = [
    "CUSTOM_OP_PRECISIONS", "ConvertOptions", "Fp8Calibration", "check_allow_ops", "check_block_ops",
    "check_custom_op_precision", "check_fallback", "check_fp8_options", "check_input_ranges", "check_keep_io_types",
    "FP32_PRODUCTS", "RANGE_FALLBACKS", "RANGE_FALLBACK_DEFAULTS", "parse_custom_op_precision", "parse_input_range",
    "check_target_provider", "range_fallback", "resolve_options",
]


@dataclasses.dataclass(frozen=True)
class ConvertOptions:
    """What to convert to and what to leave alone.

    ``keep_io_types``: True keeps every graph input and output in its type, False lets each take the
    low-precision type, names (``("logits",)``) keep those and let the others take it.
    ``block_ops``: op types kept in FP32. ``block_nodes``: regular expressions searched in node
    names; matching nodes are kept in FP32. ``allow_ops``/``allow_nodes``: the same, for nodes forced
    into low precision against the policy (rule ``user.allow``). Precedence, highest first: a dtype
    fixed by the schema or the model > ``block_nodes`` > ``allow_nodes`` > ``block_ops`` >
    ``allow_ops`` > the policy table; a forced node still stays FP32 where low precision cannot run
    (no kernel on the provider) or cannot hold its values (constants or ranges beyond the target's)
    (:mod:`amp_compiler.passes.analysis.classify`).
    """

    target: Target = Target.FP16
    provider: Provider = Provider.CUDA
    keep_io_types: bool | tuple[str, ...] = True
    block_ops: frozenset[str] = frozenset()
    block_nodes: tuple[str, ...] = ()
    allow_ops: frozenset[str] = frozenset()
    allow_nodes: tuple[str, ...] = ()
    # Nodes kept FP32 by the --tolerance refinement, and nodes it keeps in low precision (what it
    # measured them at): (position in node_order(), reason).
    pinned_nodes: tuple[tuple[int, str], ...] = ()
    kept_nodes: tuple[tuple[int, str], ...] = ()
    # "mincut": re-decide painting's free choices to move the fewest cast bytes; "paint": painting only.
    placement: str = "mincut"
    # Pad low-precision MatMul/Gemm/Conv weights to multiples of 8 with zeros and Slice back (exact).
    pad_tensor_cores: bool = False
    # Graph input shapes for the cast-cost model, where the model's dims are dynamic (--input-shape):
    # ((name, (dim, ...)), ...). The output keeps its dynamic dims.
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # Refuse to leave nodes as they are for want of an element type (UntypedTensorsError) instead of
    # warning about them (ConversionResult.untyped_nodes).
    strict: bool = False
    # Ranges of float graph inputs (--input-range): ((name, (lo, hi)), ...). What provably overflows the
    # target for inputs within them stays FP32 (a static range analysis).
    input_ranges: tuple[tuple[str, tuple[float, float]], ...] = ()
    # Target FP8 only: activation scales are amax * 2^fp8_margin / 448 (headroom for values beyond the
    # calibration amax); a GEMM takes FP8 inputs when its output error with them (relative L2 vs FP16
    # inputs, on the calibration samples) is at most fp8_max_error and at most fp8_max_subnormal of its
    # nonzero scaled input values fall below FP8's smallest normal; of those, the set with the most
    # FLOPs whose error at the outputs (relative L2 vs FP32 on the calibration samples, worst output)
    # stays within fp8_budget.
    fp8_margin: int = targets.FP8_MARGIN
    fp8_budget: float = targets.FP8_BUDGET
    fp8_max_error: float = targets.FP8_MAX_ERROR
    fp8_max_subnormal: float = targets.FP8_MAX_SUBNORMAL
    # Target FP8 only: an activation's amax is the max of |x| over the calibration samples ("max"), or
    # its fp8_percentile-th percentile ("percentile": values above it saturate, outliers are clipped).
    fp8_calibration: str = targets.FP8_CALIBRATION
    fp8_percentile: float = targets.FP8_PERCENTILE
    # Target FP8 only: the precision of everything that does not run in FP8 (the ops the FP16 policy
    # lowers, the GEMMs kept out of FP8, the Q/DQ scales): fp16 or bf16; None is fp16.
    fallback: Target | None = None
    # Target FP8 only: the GEMMs the --tolerance refinement chose for FP8 ((position in node_order(),
    # why), ...), instead of the choice by their statistics and fp8_budget; None: that choice.
    fp8_nodes: tuple[tuple[int, str], ...] | None = None
    # The precision of ops no table knows (custom domains: TensorRT plugins, which declare their output
    # types): ((op, "fp16" | "bf16" | "fp32"), ...), op as "Op" or "domain::Op". Their float inputs and
    # outputs take that type instead of keeping FP32 with Casts around them.
    custom_op_precision: tuple[tuple[str, str], ...] = ()
    # Without ranges from calibration data: run the FP32 model on generated inputs first (the range
    # probe, amp_compiler.onnx.measure.range_probe), keep FP32 what they show overflowing or flushing
    # (rules probe.overflow, probe.underflow), and measure the written model's output error on them.
    # On by default, in the CLI and in Python, as issue 23 asks of every conversion (--no-probe or
    # probe=False skips it); it runs in the budgeted child process, or in the runner passed to convert.
    probe: bool = True
    # --tolerance and the FP8 budget: how the error at the outputs is measured (--metric: a Metric or,
    # from Python, a callable (FP32 outputs, converted outputs) -> error), and the share of the
    # calibration samples held out: the choice is made on the rest and tightened until it holds on the
    # held-out ones too (none are held out from fewer than 2 samples; 0 holds none out).
    metric: ErrorMetric = Metric.REL_L2
    holdout: float = targets.HOLDOUT
    # FP16 conversions: the type of nodes kept out of FP16 only by their range (constants, observed or
    # provable overflow: core.plan.RANGE_ONLY_RULES): "scaled" (Tensor Core ops in FP16 on power-of-two
    # scaled operands where observed ranges allow it, else as "bf16"), "bf16" (where the provider has a
    # BF16 kernel; BF16 Tensor Cores: Ampere sm_80 and later, not Turing/Volta) or "fp32". None: the
    # provider's default, RANGE_FALLBACK_DEFAULTS.
    range_fallback: str | None = None
    # Tensor Core ops kept in FP32 for their precision: "plain" (as they are; a GPU reading FP32 products
    # as TF32, onnxruntime's CUDA provider and TensorRT by default, reads their operands at FP16's
    # precision) or "split" (written TF32-proof: four products of BF16-exact high parts and remainders,
    # summed in FP32; passes.onnx.split_products).
    fp32_products: str = "plain"

    def __post_init__(self) -> None:
        """Take the plain types people write (``target="bf16"``, ``block_ops=["Softmax"]``,
        ``input_shapes={"x": (1, 3, 224, 224)}``) as well as the declared ones; a bad name is one
        :class:`OptionError`."""
        def set_(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if isinstance(self.target, str):
            set_("target", Target.parse(self.target))
        if isinstance(self.fallback, str):
            set_("fallback", Target.parse(self.fallback, option="fallback"))
        if isinstance(self.provider, str):
            set_("provider", Provider.parse(self.provider))
        if not isinstance(self.keep_io_types, bool):  # names, given as any iterable of them
            set_("keep_io_types", keep_io_names(self.keep_io_types))
        for name in ("block_ops", "allow_ops"):
            if not isinstance(getattr(self, name), frozenset):
                set_(name, frozenset(_names(name, getattr(self, name))))
        for name in ("block_nodes", "allow_nodes"):
            if not isinstance(getattr(self, name), tuple):
                set_(name, _names(name, getattr(self, name)))
        for name in ("pinned_nodes", "kept_nodes"):  # (position, reason) pairs, set by the refinement
            if not isinstance(getattr(self, name), tuple):
                set_(name, tuple(getattr(self, name) or ()))
        if self.fp8_nodes is not None and not isinstance(self.fp8_nodes, tuple):
            set_("fp8_nodes", tuple(self.fp8_nodes))
        for name in ("input_shapes", "input_ranges"):
            if isinstance(getattr(self, name), Mapping):
                set_(name, tuple((k, tuple(v)) for k, v in getattr(self, name).items()))
        if isinstance(self.custom_op_precision, Mapping):
            set_("custom_op_precision", tuple(self.custom_op_precision.items()))
        set_("metric", parse_metric(self.metric))
        if self.fp32_products not in FP32_PRODUCTS:
            raise OptionError(f"unknown way {self.fp32_products!r}: expected plain or split", option="fp32_products")
        if not (math.isfinite(self.holdout) and 0 <= self.holdout < 1):
            raise OptionError(f"expected a share in [0, 1), got {self.holdout}", option="holdout")

    @property
    def low_target(self) -> Target:
        """The target the FP16/BF16 pipeline converts to: ``target``, or for FP8 its fallback."""
        if self.target is Target.FP8:
            return self.fallback or Target.FP16
        return self.target


def _names(option: str, value: Any) -> tuple[str, ...]:
    """Op or node names as given: any iterable of strings, one string (a name, not its letters), or None
    (none); anything else is an :class:`OptionError` naming the option."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    try:
        names = tuple(value)
    except TypeError:
        raise OptionError(f"expected names (a list of strings), got {type(value).__name__}", option=option) from None
    wrong = next((n for n in names if not isinstance(n, str)), None)
    if wrong is not None:
        raise OptionError(f"expected names (strings), got {wrong!r}", option=option)
    return names


#: ``range_fallback`` per provider when not given: scaled FP16 (then BF16) on the GPU providers (the
#: catalog's range-pinned models: as accurate as FP32 fallbacks within 1%, more than BF16 fallbacks, no
#: Tensor Core FLOPs left in FP32, Convs before opset 22 included; benchmarks/RESULTS.md), FP32 on the
#: CPU provider (it has no FP16 Tensor Cores and almost no BF16 kernels).
RANGE_FALLBACK_DEFAULTS = {Provider.CUDA: "scaled", Provider.TENSORRT: "scaled", Provider.CPU: "fp32"}
RANGE_FALLBACKS = ("scaled", "bf16", "fp32")
FP32_PRODUCTS = ("plain", "split")


def range_fallback(opts: ConvertOptions) -> str:
    """The range fallback ``opts`` ask for (their provider's default when not given), checked: an
    :class:`OptionError` for anything but ``scaled``/``bf16``/``fp32``, and for ``scaled``/``bf16`` given to a
    BF16 target (which has FP32's range: they would be ignored; sweep Y)."""
    if opts.range_fallback is None:
        return RANGE_FALLBACK_DEFAULTS[opts.provider]
    if opts.range_fallback not in RANGE_FALLBACKS:
        raise OptionError(f"unknown range fallback {opts.range_fallback!r}: expected scaled, bf16 or fp32",
                          option="range_fallback")
    if opts.target is Target.BF16 and opts.range_fallback != "fp32":  # given, it would be ignored
        raise OptionError(f"{opts.range_fallback} is for --target fp16 (and fp8's fp16 fallback): BF16 has FP32's "
                          "range, nothing of a bf16 conversion is kept out of it by its range", option="range_fallback")
    return opts.range_fallback


def resolve_options(options: ConvertOptions | None, overrides: Mapping[str, Any]) -> ConvertOptions:
    """``options`` (default: ``ConvertOptions()``) with keyword ``overrides`` of its fields, given in
    the plain types people write (``target="bf16"``, ``block_ops=["Softmax"]``, ``input_shapes={...}``)."""
    opts = options or ConvertOptions()
    if not overrides:
        return opts
    fields = {f.name for f in dataclasses.fields(ConvertOptions)}
    unknown = set(overrides) - fields
    if unknown:
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    return dataclasses.replace(opts, **overrides)  # __post_init__ reads the plain types


#: What ``custom_op_precision`` may declare, by name.
CUSTOM_OP_PRECISIONS = ("fp16", "bf16", "fp32")


def check_custom_op_precision(pairs: Iterable[tuple[str, str]]) -> None:
    """Raise :class:`OptionError` for a declaration without an op name, of an unknown precision, or
    given twice for one op."""
    seen: set[str] = set()
    for op, precision in pairs:
        if not op or op.endswith("::") or op.startswith("::"):
            raise OptionError(f"{op!r}: expected an op name, Op or domain::Op", option="custom_op_precision")
        if precision not in CUSTOM_OP_PRECISIONS:
            raise OptionError(f"{op}={precision}: expected fp16, bf16 or fp32", option="custom_op_precision")
        if op in seen:
            raise OptionError(f"{op} is declared twice", option="custom_op_precision")
        seen.add(op)


def parse_custom_op_precision(text: str) -> tuple[str, str]:
    """``com.example::MyPlugin=fp16`` -> ("com.example::MyPlugin", "fp16")."""
    op, sep, precision = text.rpartition("=")
    if not sep or not op:
        raise OptionError(f"{text!r}: expected OP=fp16|bf16|fp32 (e.g. MyPlugin=fp16)", option="custom_op_precision")
    pair = (op.strip(), precision.strip().lower())
    check_custom_op_precision([pair])
    return pair


def check_fp8_options(opts: ConvertOptions) -> None:
    """Raise :class:`OptionError` for FP8 settings out of range, and options FP8 does not take."""
    if opts.pad_tensor_cores:
        raise OptionError("padding is for fp16/bf16 weights, not fp8 ones", option="pad_tensor_cores")
    if opts.fallback not in (None, Target.FP16, Target.BF16):
        raise OptionError(f"expected fp16 or bf16, got {opts.fallback.value}", option="fallback")
    if not 0 <= opts.fp8_margin <= 16:
        raise OptionError(f"expected 0..16, got {opts.fp8_margin}", option="fp8_margin")
    Fp8Calibration.parse(opts.fp8_calibration)
    check_percentile(opts.fp8_percentile)
    for name in ("fp8_max_error", "fp8_max_subnormal", "fp8_budget"):
        value = getattr(opts, name)
        if not (math.isfinite(value) and value >= 0):
            raise OptionError(f"expected a finite share >= 0, got {value}", option=name)


def check_fallback(opts: ConvertOptions) -> None:
    """Raise :class:`OptionError` for a fallback given to a target that has none (fp16, bf16)."""
    if opts.fallback is not None and opts.target is not Target.FP8:
        raise OptionError(f"is for --target fp8 (every op of a {opts.target.value} conversion is {opts.target.value})",
                          option="fallback")


def check_target_provider(opts: ConvertOptions) -> None:
    """Raise :class:`OptionError` for a BF16 target on the CPU provider: onnxruntime's CPU provider has no
    bfloat16 kernel for MatMul, Gemm, Conv, Pad and most other ops, and inserts no Casts around them (it
    does for float16), so the written model would not load there (sweep Y: ``NOT_IMPLEMENTED`` for MatMul)."""
    if opts.target is Target.BF16 and opts.provider is Provider.CPU:
        raise OptionError("onnxruntime's CPU provider has no bfloat16 kernels for MatMul, Conv and most ops: a BF16 "
                          "model would not load there; convert with --target fp16 for cpu, or bf16 for cuda/tensorrt",
                          option="target")


def keep_io_names(names: Iterable[str]) -> tuple[str, ...]:
    """``keep_io_types`` given as names: a tuple of them (a bare string is refused: it would be read as
    its letters)."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise OptionError(
            f"expected True, False or a list of graph input/output names, got {names!r}", option="keep_io_types"
        )
    return tuple(names)


def check_keep_io_types(keep: bool | tuple[str, ...], inputs: Iterable[str], outputs: Iterable[str]) -> None:
    """Raise :class:`OptionError` for names ``keep_io_types`` gives that are no graph input or output
    of the model (``inputs``, ``outputs``: the main graph's)."""
    if isinstance(keep, bool):
        return
    inputs, outputs = list(inputs), list(outputs)
    unknown = [name for name in keep if name not in inputs and name not in outputs]
    if unknown:
        raise OptionError(
            f"{', '.join(unknown)}: not a graph input or output of the model "
            f"(inputs: {', '.join(inputs) or 'none'}; outputs: {', '.join(outputs) or 'none'})",
            option="keep_io_types",
        )


def check_block_ops(ops: Iterable[str], policy: PolicyTable, option: str = "block_ops") -> None:
    """Raise :class:`OptionError` for op types that neither the policy table nor the ONNX schemas know
    (``option``: the API keyword that gives them)."""
    known = policy.op_names()
    unknown = sorted(op for op in ops if op not in known and not schemas.lookup("", op, 100))
    if unknown:
        raise OptionError(f"unknown op type(s): {', '.join(unknown)}", option=option)


def check_allow_ops(opts: ConvertOptions, policy: PolicyTable) -> None:
    """Raise :class:`OptionError` for ``allow_ops`` that are unknown op types or blocked too."""
    check_block_ops(opts.allow_ops, policy, option="allow_ops")
    both = sorted(opts.allow_ops & opts.block_ops)
    if both:
        raise OptionError(f"{', '.join(both)}: blocked too; an op type is either blocked or allowed",
                          option="allow_ops")


def check_input_ranges(graph_inputs: Mapping[str, bool], ranges: Mapping[str, tuple[float, float]]) -> None:
    """Raise :class:`OptionError` unless every name is a graph input whose values reach a float
    (``graph_inputs``: name -> whether it is a float tensor or an integer one cast to float: positions, raw
    counts) and every range is finite with ``lo <= hi``."""
    for name, (lo, hi) in ranges.items():
        if name not in graph_inputs:
            raise OptionError(
                f"{name} is not a graph input (inputs: {', '.join(sorted(graph_inputs))})", option="input_ranges"
            )
        if not graph_inputs[name]:
            raise OptionError(f"{name} is neither a float input nor an integer one cast to float: its range "
                              "decides nothing", option="input_ranges")
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            raise OptionError(f"{name}: expected a finite range LO <= HI, got {lo:g}, {hi:g}", option="input_ranges")


def parse_input_range(text: str) -> tuple[str, tuple[float, float]]:
    """``name:-32768,32767`` -> ("name", (-32768.0, 32767.0))."""
    name, sep, values = text.rpartition(":")
    try:
        lo_text, comma, hi_text = values.partition(",")
        if not sep or not name or not comma:
            raise ValueError
        bounds = (float(lo_text), float(hi_text))
    except ValueError:
        raise OptionError(
            f"{text!r}: expected NAME:LO,HI (e.g. audio:-32768,32767)", option="input_ranges"
        ) from None
    return name, bounds


class Fp8Calibration(enum.Enum):
    """How an activation's amax is taken from the calibration samples."""

    MAX = "max"  # the largest |x| observed (Transformer Engine's and ModelOpt's default)
    PERCENTILE = "percentile"  # a percentile of |x|: outliers are clipped

    @classmethod
    def parse(cls, text: str) -> Fp8Calibration:
        try:
            return cls(text.lower())
        except ValueError:
            raise OptionError(f"unknown calibration {text!r}: expected max or percentile",
                              option="fp8_calibration") from None


def check_percentile(q: float) -> None:
    """Raise :class:`OptionError` unless ``0 < q <= 100``."""
    if not (math.isfinite(q) and 0 < q <= 100):
        raise OptionError(f"expected a percentile in (0, 100], got {q}", option="fp8_percentile")
