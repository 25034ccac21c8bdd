"""The precision plan: what the analysis decided for every vertex, and why.

Analysis passes write the plan; lowering reads it. Every decision carries a stable rule id (for tools
and tests) and a sentence for people.
"""

from __future__ import annotations

import dataclasses
import enum

import onnx_ir as ir

__all__ = [
    "INSERTED_RULES", "OVERFLOW_RULES", "RANGE_ONLY_RULES", "Decision", "PrecisionPlan", "Role", "Rule", "Scaling",
]


class Role(enum.Enum):
    """A vertex's part in painting (TensorFlow AMP's allow/deny/infer/clear, plus fixed vertices)."""

    ALLOW = "allow"  # wants low precision
    DENY = "deny"  # must stay FP32
    INFER = "infer"  # FOLLOW: low precision only between low-precision neighbours
    CLEAR = "clear"  # PASS: joins low-precision neighbours
    FIXED = "fixed"  # dtype cannot change


class Rule(enum.Enum):
    """Stable ids of the rules that decide a node's precision (every id a decision can carry)."""

    POLICY_LOW = "policy.low"
    POLICY_HIGH_RANGE = "policy.high.range"
    POLICY_HIGH_ARITHMETIC = "policy.high.arithmetic"
    POLICY_FP32_INSIDE = "policy.high.fp32-inside"
    POLICY_BF16_RECURRENCE = "policy.high.bf16-recurrence"  # a recurrent op, FP32 for BF16
    POLICY_FOLLOW = "policy.follow"
    POLICY_PASS = "policy.pass"
    SIGNAL_PATH = "policy.high.signal-path"  # on a raw signal's linear path into Log
    PHASE_ARGUMENT = "policy.high.phase-argument"  # computes a Sin/Cos argument linearly from raw positions
    POSITION_BIAS = "policy.high.position-bias"  # adds a bias linear in positions to a Softmax's logits (ALiBi)
    RAW_SMALL_PRODUCT = "policy.high.raw-small-product"  # a Tensor Core op with K < 16 reading raw coordinates
    RAW_OFFSET_PRODUCT = "policy.high.raw-offset-product"  # a first product whose folded bias says its input is offset
    LOOP_ACCUMULATOR = "policy.high.loop-accumulator"  # a Loop/Scan state its body adds into itself
    UNKNOWN_OP = "policy.unknown-op"
    USER_BLOCK_OP = "user.block-op"
    USER_BLOCK_NODE = "user.block-node"
    USER_ALLOW = "user.allow"  # forced low by --allow-op/--allow-node, against the policy
    USER_CUSTOM_OP = "user.custom-op-precision"  # an op no table knows, in the precision the user declared
    CONSTANT_OVERFLOW = "constant.overflow"
    CONSTANT_UNDERFLOW = "constant.underflow"
    CONSTANT_MASK = "constant.mask-lowest"
    QUANTIZED_REQUANTIZE = "quantized.requantize"  # its result is quantized again
    QUANTIZED_SCALE = "quantized.scale"  # reads a quantizer's scale (dequantization)
    # a Tensor Core op reading DequantizeLinear outputs that its provider fuses with them into an int8 kernel:
    # kept in the DQ's output type, no Cast between (policy/qdq_units.toml)
    QUANTIZED_PRODUCT = "quantized.product"
    THRESHOLD_INPUT = "threshold.input"  # computes what an op comparing it with constant thresholds reads (a tree)
    ROUTING_SCORE = "routing.score"  # computes the scores a TopK/ArgMax whose indices route computation reads
    RANGE_OVERFLOW = "input-range.overflow"  # provably beyond the target for the inputs' known ranges
    CALIBRATION_OVERFLOW = "calibration.overflow"
    CALIBRATION_UNDERFLOW = "calibration.underflow"
    # The same two rules on the ranges the range probe observed on generated inputs (no data given):
    # FP32 for range alone, kept apart from calibration's so the report (and a BF16 fallback) can tell.
    PROBE_OVERFLOW = "probe.overflow"
    PROBE_UNDERFLOW = "probe.underflow"
    TOLERANCE_PINNED = "tolerance.pinned"
    TOLERANCE_KEPT = "tolerance.kept-low"  # kept low by --tolerance, as it measured the node
    FP8_GEMM = "fp8.gemm"  # a Tensor Core op reading FP8 E4M3 inputs: its statistics allow it
    FP8_KEPT = "fp8.kept-fp16"  # a Tensor Core op kept in the fallback (FP16, or BF16): FP8 inputs cost too much
    FP8_NO_QDQ = "fp8.no-qdq"  # a Tensor Core op taking no FP8 inputs (policy table's fp8_reason, or no candidate)
    FP8_QDQ = "fp8.qdq"  # inserted for an FP8 GEMM input: Q/DQ nodes (ONNX), a quantize node (FX)
    PROVIDER_NO_KERNEL = "provider.no-kernel"
    # a free vertex (painting's, placement's choice) in the type its node's provider kernel needs, where the
    # decided one has none (GemmaRotaryEmbedding FP16, not FP32; a KV cache BF16 beside a BF16 attention)
    PROVIDER_KERNEL_TYPES = "provider.kernel-types"
    RUNTIME_TRANSPOSE_MATMUL = "runtime.ort-transpose-matmul"  # a pattern onnxruntime crashes on with a Cast inside
    # a hand-written LayerNorm's scale and bias take the type onnxruntime's norm fusion reads as its input
    RUNTIME_LAYERNORM_FUSION = "runtime.ort-layernorm-fusion"
    PAINT_DENY = "paint.deny-forward"
    PAINT_BETWEEN_LOW = "paint.between-low"
    PAINT_PASS = "paint.pass-spread"
    PAINT_TABLE = "paint.table-lookup"
    MINCUT = "placement.min-cut"
    PAINT_DEFAULT = "paint.default-fp32"
    FIXED = "fixed"
    UNKNOWN_TYPE = "fixed.unknown-type"  # no element type is known: left as it is, and a warning
    PAD_SLICE = "pad.slice"  # a Slice inserted by the opt-in Tensor Core padding
    RANGE_SCALE = "range-scaling.mul"  # a Mul by a power of two inserted around a range-scaled Tensor Core op
    TF32_SPLIT = "tf32.split"  # inserted to write an FP32 product TF32-proof (--fp32-products split)
    # Nodes that no vertex decides: what lowering made, and what has no float data.
    LOWERING_CAST = "lowering.cast"  # a Cast lowering inserted
    CONSTANT = "constant"  # a constant, converted offline (or read as it is) for its users
    CONSTANT_STORED_LOW = "constant.stored-low"  # FX: a parameter or buffer stored in low precision
    NONFLOAT = "nonfloat"  # no float inputs or outputs
    SHAPE_ONLY = "nonfloat.shape-only"  # reads only the shape of its float inputs: any float type, no Cast
    OBSERVER = "observer"  # FX: reads a tensor's metadata only


#: The rules that keep a vertex out of FP16 only because its values do not fit FP16's range: BF16,
#: with FP32's range, holds them (``--range-fallback``, :mod:`amp_compiler.passes.analysis.range_fallback`).
#: Arithmetic rules (``policy.high.*``: sums, norms, Exp/Log) are not here.
RANGE_ONLY_RULES = frozenset({
    Rule.CONSTANT_OVERFLOW,  # a constant beyond FP16's 65504
    Rule.CONSTANT_UNDERFLOW,  # a constant below FP16's smallest subnormal (BF16's is 9.2e-41)
    Rule.RANGE_OVERFLOW,  # provably beyond FP16 for the inputs' stated ranges
    Rule.CALIBRATION_OVERFLOW,  # observed beyond FP16 on calibration data
    Rule.CALIBRATION_UNDERFLOW,  # observed flushing to zero in FP16
    Rule.PROBE_OVERFLOW,  # observed beyond FP16 on the range probe's generated inputs
    Rule.PROBE_UNDERFLOW,  # observed flushing to zero on them
})


@dataclasses.dataclass
class Decision:
    dtype: ir.DataType
    rule: Rule
    reason: str


#: The rules of nodes a conversion inserted, not the input model's: lowering's Casts, range scaling's Muls,
#: the TF32-proof split products' parts.
INSERTED_RULES = frozenset({Rule.LOWERING_CAST, Rule.RANGE_SCALE, Rule.TF32_SPLIT})


#: The range rules that keep a vertex out of FP16 because its values are too large for it: a
#: power-of-two scaling down can bring them in (:mod:`amp_compiler.passes.analysis.range_scaling`), where
#: it would only push flushed values further down.
OVERFLOW_RULES = frozenset({
    Rule.CONSTANT_OVERFLOW, Rule.RANGE_OVERFLOW, Rule.CALIBRATION_OVERFLOW, Rule.PROBE_OVERFLOW,
})


@dataclasses.dataclass(frozen=True)
class Scaling:
    """A range-pinned Tensor Core op run in FP16 on power-of-two scaled operands
    (:mod:`amp_compiler.passes.analysis.range_scaling`): ``op(x * 2^-a, w * 2^-b) = op(x, w) * 2^-(a+b)``
    exactly, but for the values the scaling pushes below FP16's normals. ``shifts``: per input index,
    the k its operand is multiplied by 2^-k with (a constant's offline, an activation's by a Mul in
    FP32 before its Cast; a bias takes ``output``). ``output``: the shift the product carries, undone by
    a Mul by 2^output in FP32 after the Cast back. ``headroom``: how far below FP16's largest finite
    value the scaled magnitudes stay at least (the margin, and the static bounds, included).

    Per channel (a MatMul of an activation ``x`` by a constant ``w``, where a few channels hold the
    large values): ``x``'s channel k (its last axis) is multiplied by 2^-inputs[k] and the product's
    channel n carries 2^-outputs[n]; ``w[k, n]`` is stored times 2^(inputs[k] - outputs[n]), and a Mul
    by 2^outputs after the Cast back restores the product: ``(x D_in^-1)(D_in w D_out^-1) D_out = x w``.
    ``shifts`` and ``output`` are then 0."""

    shifts: dict[int, int]
    output: int
    headroom: float
    inputs: tuple[int, ...] = ()  # per channel of the activation operand's last axis; () not per channel
    outputs: tuple[int, ...] = ()  # per channel of the product's last axis

    @property
    def per_channel(self) -> bool:
        return bool(self.inputs or self.outputs)


@dataclasses.dataclass
class PrecisionPlan:
    """Per vertex: its painting role (with the rule that gave it) and, after painting, its dtype."""

    roles: dict[int, Role] = dataclasses.field(default_factory=dict)
    role_rules: dict[int, tuple[Rule, str]] = dataclasses.field(default_factory=dict)
    decisions: dict[int, Decision] = dataclasses.field(default_factory=dict)
    # Constants whose out-of-range values lowering replaces (value -> (replacement, why)), and notes
    # that explain such rewrites on the vertices that read them.
    constant_rewrites: dict[ir.Value, tuple[float, str]] = dataclasses.field(default_factory=dict)
    notes: dict[int, str] = dataclasses.field(default_factory=dict)
    # HIGH vertices whose provider kernel computes in FP32 inside (rule ``policy.fp32-inside``): the
    # source that says so, for the reasons of the vertices painting decides next to them.
    fp32_inside: dict[int, str] = dataclasses.field(default_factory=dict)
    # Bytes moved by Casts: as painted, and after cast placement (None when placement did not run).
    cast_bytes_painting: int | None = None
    cast_bytes_final: int | None = None
    # Range-pinned Tensor Core vertices run in FP16 on power-of-two scaled operands: their decision
    # stays FP32 (what their neighbours see), lowering's scaling pass runs them low inside.
    scalings: dict[int, Scaling] = dataclasses.field(default_factory=dict)
    # Per op (the frontend's node) that runs in types its provider has no kernel for, as finally decided:
    # why (:mod:`amp_compiler.passes.analysis.final_kernels`). The conversion warns of them.
    no_kernel: dict[object, str] = dataclasses.field(default_factory=dict)

    def set_role(self, vid: int, role: Role, rule: Rule, reason: str) -> None:
        self.roles[vid] = role
        self.role_rules[vid] = (rule, reason)

    def decide(self, vid: int, dtype: ir.DataType, rule: Rule, reason: str) -> None:
        self.decisions[vid] = Decision(dtype, rule, reason)

    def snapshot(self) -> PrecisionPlan:
        """A copy that later ``set_role``/``decide`` calls on this plan leave as it is."""
        return dataclasses.replace(
            self, roles=dict(self.roles), role_rules=dict(self.role_rules), decisions=dict(self.decisions),
            constant_rewrites=dict(self.constant_rewrites), notes=dict(self.notes), fp32_inside=dict(self.fp32_inside),
            scalings=dict(self.scalings), no_kernel=dict(self.no_kernel),
        )
