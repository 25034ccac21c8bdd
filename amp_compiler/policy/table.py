"""Loads the op policy table (``onnx_ops.toml``) into typed records.

The table is data: one entry per (domain, op) with a category, a human reason, and for ops that only
need FP32 arithmetic inside, the providers whose kernels already accumulate in FP32 (with a source);
``tensor_core`` marks matrix-product ops, ``gemm`` says how their operands hold the product's dims
(:class:`GemmLayout`, read by the cost model, Tensor Core padding and the FX path's FLOPs), and
``shape_inputs`` the inputs an op reads only the shape of; ``fp8_inputs``/``fp8_reason`` say which
Tensor Core ops take FP8 inputs through Q/DQ, and why the others do not. An entry's ``[[op.when]]``
cases (:class:`AttributeCase`) decide it differently for some values of one attribute: a scatter with
``reduction = "add"`` sums (a segment sum, HIGH like ReduceSum) where one without only moves values
(PASS). A case may instead name inputs that must be constants (``constant_inputs``): a DequantizeLinear
of a constant integer weight (weight-only quantization) follows its products' type, where one of an
activation is never touched. :meth:`OpPolicy.resolve` picks the case a node's attributes and inputs select.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterator
from importlib import resources

import tomllib

from amp_compiler.policy.schemas import canonical_domain
from amp_compiler.targets import Provider

__all__ = [
    "AttributeCase", "Category", "GemmKind", "GemmLayout", "OpPolicy", "PolicyTable", "Sensitivity", "default_table",
]


class Category(enum.Enum):
    LOW = "LOW"  # Tensor Core ops: compute in FP16/BF16 whenever possible
    HIGH = "HIGH"  # range- or precision-sensitive: compute in FP32
    FOLLOW = "FOLLOW"  # numeric op whose precision follows its neighbours
    PASS = "PASS"  # data movement, precision neutral
    NONFLOAT = "NONFLOAT"  # never touched


class Sensitivity(enum.Enum):
    RANGE = "range"  # values overflow/underflow FP16: FP32 inputs and outputs
    ARITHMETIC = "arithmetic"  # needs FP32 accumulation inside only


class GemmKind(enum.Enum):
    """The matrix product a Tensor Core op computes, and so what its operands hold."""

    # A [..., M, K] times B [..., K, N] (ATen linear's weight: [N, K]); ONNX ``transpose`` attributes, when
    # set, swap the last two axes of A or B.
    MATMUL = "matmul"
    CONV = "conv"  # data [N, C_in, spatial...], weight [C_out, C_in/group, kernel...] (ONNX attribute ``group``)
    CONV_TRANSPOSE = "conv_transpose"  # data [N, C_in, spatial...], weight [C_in, C_out/group, kernel...]
    EINSUM = "einsum"  # a contraction its ``equation`` spells out, over every operand
    RECURRENT = "recurrent"  # ONNX LSTM/GRU/RNN: X [seq, batch, input], W, R [dirs, gates * hidden, hidden]


#: How many operands each kind names (an einsum's may name the one argument holding its operand list).
_OPERAND_COUNTS = {
    GemmKind.MATMUL: (2,), GemmKind.CONV: (2,), GemmKind.CONV_TRANSPOSE: (2,), GemmKind.EINSUM: (0, 1),
    GemmKind.RECURRENT: (3,),
}


@dataclasses.dataclass(frozen=True)
class GemmLayout:
    """Where a Tensor Core op's product keeps its dims: the FLOPs (``2 * M * N * K`` and the like), the
    dims Tensor Core kernels tile (K and N, or the channels per group) and the weight axis padding
    extends are read from it."""

    kind: GemmKind
    # The operands, in the order the kind lists them (A and B; data and weight; X, W and R): input
    # indices for ONNX ops, schema argument names for ATen ops.
    operands: tuple[int | str, ...]
    source: str  # the op's definition this layout is read from
    transpose: tuple[str, str] | None = None  # attributes that transpose A and B when set (ONNX Gemm)
    bias: int | str | None = None  # the input added to the product (Gemm's C, a convolution's bias)
    # A matmul's argument holding the axis of A that the product sums (linalg_vecdot's ``dim``): K is A's size
    # there, where it is not the last (A [..., K]) nor, transposed, the one before.
    k_axis: str | None = None

    @classmethod
    def from_toml(cls, raw: dict, op: str) -> GemmLayout:
        kind = GemmKind(raw["kind"])
        operands = tuple(raw.get("operands", ()))
        if len(operands) not in _OPERAND_COUNTS[kind]:
            counts = " or ".join(str(n) for n in _OPERAND_COUNTS[kind])
            raise ValueError(f"{op}: a {kind.value} layout names {counts} operands, not {list(operands)}")
        transpose = raw.get("transpose")
        if transpose is not None and (kind is not GemmKind.MATMUL or len(transpose) != 2):
            raise ValueError(f"{op}: transpose names the attributes of a matmul's two operands")
        source = raw.get("source", "")
        if not source.strip():
            raise ValueError(f"{op}: a gemm layout says where it is defined (source)")
        k_axis = raw.get("k_axis")
        if k_axis is not None and (kind is not GemmKind.MATMUL or not isinstance(k_axis, str)):
            raise ValueError(f"{op}: k_axis names the argument holding a matmul's summed axis")
        return cls(kind, operands, source, tuple(transpose) if transpose else None, raw.get("bias"), k_axis)

    def weight_axes(self, rank: int, transposed: bool = False) -> tuple[int, int]:
        """The reduction axis and the output axis of the second operand of a matmul or a convolution of
        that ``rank``: B's K and N (swapped when ``transposed``), a weight's C_in and C_out axes (axis 0
        holds all of its channels, axis 1 one group's)."""
        if self.kind is GemmKind.MATMUL:
            return (rank - 1, rank - 2) if transposed else (rank - 2, rank - 1)
        if self.kind is GemmKind.CONV:
            return 1, 0
        if self.kind is GemmKind.CONV_TRANSPOSE:
            return 0, 1
        raise ValueError(f"a {self.kind.value} has no weight axes")


@dataclasses.dataclass(frozen=True)
class OpPolicy:
    op: str
    domain: str
    category: Category
    reason: str
    sensitivity: Sensitivity | None = None
    fp32_inside: dict[str, str] = dataclasses.field(default_factory=dict)
    dtype_attr: str | None = None
    refs: str = ""
    tensor_core: bool = False  # its work is matrix products that run on Tensor Cores in FP16/BF16
    gemm: GemmLayout | None = None  # the layout of that product (Tensor Core ops whose costs are read from it)
    # Inputs the op reads only the shape of (Shape, Size): any float type will do, so they take the
    # type their producer gives them and never get a Cast of their own.
    shape_inputs: frozenset[int] = frozenset()
    # Linear in its signal input, or a magnitude/power of it (Conv, MatMul, Add, Mul, Sqrt, data
    # movement): the noise FP16 storage adds to a signal passes through it (LOW ops: with constant weights).
    signal: bool = False
    # Reads its input's whole dynamic range (Log): the signal path from a graph input into it stays FP32.
    dynamic_range: bool = False
    # Periodic in its input (Sin, Cos, Tan): why the absolute error of its argument is the error of its
    # result. The linear path from raw positions or coordinates into it stays FP32 (passes/analysis/phase.py);
    # empty: not periodic.
    periodic: str = ""
    # Counts (Range): its output is positions, indices or time steps, raw values a periodic op's argument
    # may be computed from (passes/analysis/phase.py).
    positions: bool = False
    # Reads the absolute differences of its logits (Softmax, LogSoftmax: shift-invariant per row, not
    # scale-invariant): why a large additive bias rounded in storage moves its result. The linear path from
    # positions (integer-derived, a count) into it stays FP32 (passes/analysis/position_bias.py); empty: no.
    logit_differences: str = ""
    # The inputs of a ``logit_differences`` op that it adds to its logits, where not every input is logits
    # (scaled_dot_product_attention's attn_mask, a bias added to q @ k^T inside): the position-bias walk starts
    # from those alone, and the op itself is not pinned (a Tensor Core op: the bias it reads is cast at its
    # input, after being computed in FP32). Empty: every input is logits (Softmax), and the op reads them FP32.
    logit_inputs: tuple[int, ...] = ()
    # Quantizes its float input: "static" (a fixed scale: QuantizeLinear) or "dynamic" (a scale from the
    # tensor's range at run time: DynamicQuantizeLinear); what it reads stays FP32 (passes/quantized.py).
    quantizes: str | None = None
    # Compares its float input with constants (tree splits, Binarizer's threshold, float category keys):
    # why FP16 rounding of what it reads changes its results. What computes that input stays FP32
    # (passes/analysis/thresholds.py); empty: no thresholds.
    thresholds: str = ""
    # Its thresholds are an operand, not attributes (Less, Greater...; not Equal): it reads thresholds only where one
    # of its float inputs is a constant holding more than one distinct value (a vector of cut points: a compiled
    # tree's splits, bucket edges); against a scalar or all-equal constant (x > 0, p > 0.5) it is a gate, and
    # what it compares is left alone (passes/analysis/thresholds.py).
    thresholds_operand: bool = False
    # Returns the indices of its largest or smallest values (TopK, ArgMax, ArgMin): why FP16 rounding of what it
    # reads picks other indices. When they reach an ``index_inputs`` input in the graph, what computes its input
    # stays FP32 (passes/analysis/routing.py); empty: no selection.
    selects: str = ""
    # Inputs whose integer values pick which elements the op reads or writes (Gather, OneHot, Scatter*), or build
    # a mask (Equal): a selection's indices reaching one route computation.
    index_inputs: tuple[int, ...] = ()
    # Carries a selection's scores from its input elementwise or along the choices (Softmax, Sigmoid, Add, Div,
    # Cast, reshapes): the chain of them into a routing selection stays FP32 (passes/analysis/routing.py).
    scores: bool = False
    # Carries a state from step to step (LSTM, GRU, RNN): FP32 for BF16 (passes/classify.py).
    recurrent: bool = False
    # Its results are probabilities that can be tiny and still matter (Sigmoid, Softmax): FP16 holds
    # them only as subnormals, so feeding an FP32 graph output it runs FP32 when that costs no more.
    tiny_outputs: bool = False
    # Inputs at which a zero gives inf or NaN (a Div's divisor, Log, Reciprocal; Pow's base, for a
    # negative exponent): a value FP16 flushes to zero there becomes inf (passes/analysis/calibration.py).
    zero_singular: tuple[int, ...] = ()
    # Elementwise zero in, zero out (Mul, Sqrt, Abs, Relu, data movement): a value FP16 flushed to zero
    # stays zero through it, on its way to an input that is singular at zero.
    keeps_zeros: bool = False
    # FP8 (--target fp8), for Tensor Core ops: the data inputs that take FP8 E4M3 through Q/DQ
    # (MatMul, Gemm, Conv), or why the op does not (every other Tensor Core op).
    fp8_inputs: tuple[int, ...] = ()
    fp8_reason: str = ""
    # Inputs that multiply every value the op dequantizes (DequantizeLinear's scale): a constant there is judged
    # value by value, as a factor (passes/analysis/constants.py), not as a tensor whose tiny values may flush.
    scale_inputs: tuple[int, ...] = ()
    # Cases that decide the op differently for some values of one attribute (``[[op.when]]``), first
    # match wins; a node whose attribute is absent (its schema default) or matches none takes this entry.
    when: tuple[AttributeCase, ...] = ()

    def resolve(self, attribute: Callable[[str], object],
                constant: Callable[[int], bool] | None = None) -> OpPolicy:
        """The policy for a node whose attribute values ``attribute(name)`` gives (None: absent) and whose
        input ``i`` is a constant where ``constant(i)`` (None: none is): the first :class:`AttributeCase` it
        matches (:meth:`case_index`), else this entry."""
        index = self.case_index(attribute, constant)
        return self if index is None else self.when[index].policy

    def case_index(self, attribute: Callable[[str], object],
                   constant: Callable[[int], bool] | None = None) -> int | None:
        """Which of :attr:`when` a node selects (None: the entry itself); nodes alike in it are decided alike."""
        for i, case in enumerate(self.when):
            if case.matches_node(attribute, constant):
                return i
        return None

    def accumulates_fp32_on(self, provider: Provider) -> bool:
        """True when ``provider``'s kernel takes low-precision I/O but computes in FP32 inside."""
        return self.sensitivity is Sensitivity.ARITHMETIC and provider.value in self.fp32_inside


@dataclasses.dataclass(frozen=True)
class AttributeCase:
    """One ``[[op.when]]`` of an entry: for nodes whose ``attribute`` is one of ``values`` (or, with no
    attribute, whose ``constant_inputs`` are all constants: initializers or Constant nodes), the op is decided
    by ``policy`` (the entry with the case's category, reason, sensitivity and scale inputs)."""

    attribute: str | None
    values: frozenset[str]
    policy: OpPolicy
    constant_inputs: tuple[int, ...] = ()

    def matches(self, value: object) -> bool:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        return value is not None and str(value) in self.values

    def matches_node(self, attribute: Callable[[str], object], constant: Callable[[int], bool] | None) -> bool:
        """Whether a node (its attribute values, and which inputs are constants) selects this case."""
        if self.attribute is not None:
            return self.matches(attribute(self.attribute))
        return constant is not None and all(constant(i) for i in self.constant_inputs)


_CASE_FIELDS = frozenset({
    "attribute", "values", "constant_inputs", "category", "reason", "sensitivity", "refs", "signal", "scale_inputs",
})


class PolicyTable:
    """Lookup of :class:`OpPolicy` by (domain, op type)."""

    def __init__(self, entries: list[OpPolicy]):
        self._entries: dict[tuple[str, str], OpPolicy] = {}
        for e in entries:
            key = (canonical_domain(e.domain), e.op)
            if key in self._entries:
                raise ValueError(f"duplicate policy entry {key}")
            self._entries[key] = e

    def get(self, domain: str, op: str) -> OpPolicy | None:
        return self._entries.get((canonical_domain(domain), op))

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[OpPolicy]:
        return iter(self._entries.values())

    def op_names(self) -> set[str]:
        return {op for _, op in self._entries}

    def is_tensor_core(self, domain: str, op_type: str) -> bool:
        """True for ops whose work is matrix products that run on Tensor Cores (``tensor_core`` entries)."""
        entry = self.get(domain, op_type)
        return entry is not None and entry.tensor_core

    def gemm_layout(self, domain: str, op_type: str) -> GemmLayout | None:
        """The layout of a Tensor Core op's matrix product (``gemm`` entries), None for other ops."""
        entry = self.get(domain, op_type)
        return entry.gemm if entry is not None else None

    @classmethod
    def from_toml(cls, text: str) -> PolicyTable:
        data = tomllib.loads(text)
        entries = []
        for raw in data.get("op", []):
            entry = cls._entry(raw)
            cases = []
            for case in raw.get("when", ()):
                extra = set(case) - _CASE_FIELDS
                by_attribute = "attribute" in case and bool(case.get("values")) and "constant_inputs" not in case
                by_constants = "attribute" not in case and "values" not in case and bool(case.get("constant_inputs"))
                if extra or not (by_attribute or by_constants) or not str(case.get("reason", "")).strip():
                    raise ValueError(
                        f"{raw['op']}: a [[op.when]] names an attribute and its values, or constant inputs, "
                        "and a reason"
                        + (f" (unknown fields {sorted(extra)})" if extra else "")
                    )
                merged = {k: v for k, v in raw.items() if k != "when"}
                merged.pop("sensitivity", None)
                merged.update({k: v for k, v in case.items() if k not in ("attribute", "values", "constant_inputs")})
                cases.append(AttributeCase(
                    case.get("attribute"), frozenset(map(str, case.get("values", ()))), cls._entry(merged),
                    tuple(case.get("constant_inputs", ())),
                ))
            entries.append(dataclasses.replace(entry, when=tuple(cases)) if cases else entry)
        return cls(entries)

    @staticmethod
    def _entry(raw: dict) -> OpPolicy:
        sens = raw.get("sensitivity")
        return OpPolicy(
            op=raw["op"],
            domain=raw.get("domain", "ai.onnx"),
            category=Category(raw["category"]),
            reason=raw["reason"],
            sensitivity=Sensitivity(sens) if sens else None,
            fp32_inside=dict(raw.get("fp32_inside", {})),
            dtype_attr=raw.get("dtype_attr"),
            refs=raw.get("refs", ""),
            tensor_core=bool(raw.get("tensor_core", False)),
            gemm=GemmLayout.from_toml(raw["gemm"], raw["op"]) if "gemm" in raw else None,
            shape_inputs=frozenset(raw.get("shape_inputs", ())),
            signal=bool(raw.get("signal", False)),
            dynamic_range=bool(raw.get("dynamic_range", False)),
            periodic=raw.get("periodic", ""),
            positions=bool(raw.get("positions", False)),
            logit_differences=raw.get("logit_differences", ""),
            logit_inputs=tuple(raw.get("logit_inputs", ())),
            quantizes=raw.get("quantizes"),
            thresholds=raw.get("thresholds", ""),
            thresholds_operand=bool(raw.get("thresholds_operand", False)),
            selects=raw.get("selects", ""),
            index_inputs=tuple(raw.get("index_inputs", ())),
            scores=bool(raw.get("scores", False)),
            recurrent=bool(raw.get("recurrent", False)),
            tiny_outputs=bool(raw.get("tiny_outputs", False)),
            zero_singular=tuple(raw.get("zero_singular", ())),
            keeps_zeros=bool(raw.get("keeps_zeros", False)),
            fp8_inputs=tuple(raw.get("fp8_inputs", ())),
            fp8_reason=raw.get("fp8_reason", ""),
            scale_inputs=tuple(raw.get("scale_inputs", ())),
        )


@functools.cache
def default_table() -> PolicyTable:
    """The table shipped with the package (read once; it is immutable)."""
    text = resources.files("amp_compiler.policy").joinpath("onnx_ops.toml").read_text("utf-8")
    return PolicyTable.from_toml(text)
