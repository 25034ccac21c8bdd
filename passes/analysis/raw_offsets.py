"""Raw offset products: keep FP32 a first matrix product whose weights and bias say that it reads raw-unit
features centred far from zero, which rounding them to the target would blur past what the model resolves.

A model fed raw units (a temperature of 293 K +- 3, an altitude of 1500 m +- 20) with its standardisation
``(x - mean) / std`` folded into the first layer (``W / std`` and ``b - W.mean / std``: exporters, optimisers
and sklearn -> ONNX pipelines write it so) computes ``W (x - mean)`` with a bias that cancels the offset.
Rounding ``x`` to the target first loses what lies below the target's spacing at the offset: BF16 stores 293
to within 1 (spacing 2) and 1500 to within 4, against a spread of 3 and 20. The range probe draws
N(0, 1) for such an input and cannot see it; :class:`~amp_compiler.passes.analysis.raw_products.
RawSmallProductPass` keeps this pattern FP32 only below one MMA tile (K < 16), a cost cut-off that says
nothing of precision. Measured under exact emulation on held-out data (sweep Y): a 16-feature sensor MLP
(Gemm -> Relu -> Gemm -> Relu -> Gemm, the standardisation folded into fc1) 17.8% of the output's range off
and 24.7% of its labels flipped in BF16 with fc1 low (1.81% and 1.6% in FP16), 0.23% and 0.3% with fc1 FP32
(as at 15 features, where raw-small-product fires); a Conv1d sensor CNN (6 raw channels, kernel 5, K = 30)
2.49% in BF16, 0.79% in FP16.

The graph says so. A folded bias is ``b_n = b0_n - sum_k W_kn mean_k`` with ``b0`` the original bias (of the
order of the pre-activations), so the offsets are the least-squares solution ``m`` of ``W^T m = -b`` over the
product's outputs (:func:`offset_estimate`; a Conv's per-channel weight is its kernel's sum). The fit is
evidence only where a bias not made so could not fit as well: a bias unrelated to the weights (any
normalised-input model's, taken as isotropic) leaves a share ``r`` of its norm in the residual with ``r^2 ~
Beta((N - K) / 2, K / 2)`` (mean ``1 - K/N``), so a close fit means little where N is near K (32 features
into 36 outputs: 0.33 by chance; 64 into 65: 0.12) and nothing where N <= K (any bias fits; the
least-squares offsets of an ill-conditioned fit are then large for any bias). The product is pinned only
where the residual is within :data:`BIAS_FIT` and a random bias would fit as closely with probability
(:func:`fit_chance`, an upper bound) under :data:`FIT_CHANCE`: the repro's folded bias leaves 0.1 of 72
(16 into 64: chance 1e-142), random ones at 32 into 33 or 36 and 64 into 65 0.11 to 0.24 (chance 0.44 to
0.94). Elsewhere the fit says nothing, and the conversion warns where the product stays low only if the bias itself says
the input is not standardised (:func:`raw_offset_warnings`): its outputs' biases are, at the median, past
:data:`BIAS_SPREAD` times the spread unit-variance features would give them (``|W_n|``), so on
standardised input the units would never switch; a folded standardisation's bias is its mean in standard
deviations (170 to 280 in the repros), a normalised model's of order one (0.13 to 1.5 in sweep W's normtab).

Each feature ``k`` then rounds by up to half the target's spacing at ``|m_k|``, uniformly across samples,
which puts noise of RMS ``sqrt(sum_k W_kn^2 spacing(m_k)^2 / 12)`` (a Conv: over its taps, each reading
another sample) into pre-activation ``n``. A layer trained on standardised features (what folding
one implies) has pre-activations of spread of order one, so that noise is read against 1: past
:data:`PRE_ACTIVATION_NOISE` (1%) the product is pinned FP32. Measured: the sensor MLP 0.26 (BF16) and 0.032
(FP16), the Conv1d 0.12 and 0.015; every first product on a float input in the catalog (image stems,
Whisper's mel Conv, tabular MLPs: normalised inputs) at most 0.0016 in BF16, none pinned. What FP32 costs is
one first layer over the raw features (sensor rows, a few channels): its FLOPs and its FP32 output's bytes.

Only a product that reads the graph input as it is (through ops that move values: Cast, Reshape, Flatten,
Identity, (Un)Squeeze; ATen's copies and views) and whose weight and bias are constants the precision graph
holds qualifies: ONNX Gemm (``transA`` unset), MatMul with a 2-D weight and an Add of a constant [N] bias
after it, Conv with ``group = 1``; ATen ``linear`` and a convolution with one group (FX: torch.export keeps
``nn.Linear`` and ``nn.Conv*d`` so). An FX ``addmm`` (a decomposed Linear, its weight transposed by another
op) is not read.

Guarantees (checked by ``ensures``): every free vertex so found, unless the user forced it low
(``user.allow``), is DENY with rule ``policy.high.raw-offset-product`` and a reason naming the input, the
feature whose rounding weighs most, its estimated offset, the spacing the target gives it and the noise
that puts into the pre-activations; nothing else changes. It runs after raw-small-product (whose K < 16 pins
say it more simply) and before the range rules.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Container

import ml_dtypes
import numpy as np
import onnx_ir as ir

from amp_compiler.core.graph import PrecisionGraph, Vertex, dataflow
from amp_compiler.core.plan import PrecisionPlan, Role, Rule
from amp_compiler.onnx.graph.input_scale import SAME_VALUES
from amp_compiler.onnx.ir.constants import constant_array
from amp_compiler.onnx.ir.walk import is_constant
from amp_compiler.passes.analysis.base import AnalysisPass, ensure_only_pinned, paths_into, require_roles
from amp_compiler.passes.analysis.classify import PINNABLE, ensure_pinned, pinnable
from amp_compiler.passes.analysis.phase import constant_derived, is_raw
from amp_compiler.targets import Target

__all__ = ["BIAS_FIT", "BIAS_SPREAD", "FIT_CHANCE", "PRE_ACTIVATION_NOISE", "OffsetFinding", "RawOffsetProductPass",
           "bias_spread", "fit_chance", "offset_estimate", "offset_findings", "raw_offset_products",
           "raw_offset_warnings"]

#: The RMS rounding noise, in units of a pre-activation's spread (taken as one: module doc), past which a
#: first product is kept FP32. Measured: 0.015 to 0.26 on the raw-unit repros (0.79% to 17.8% of range
#: held-out), at most 0.0016 on the catalog's first products.
PRE_ACTIVATION_NOISE = 0.01
#: The share of the bias's norm the offset fit may leave unexplained and still count as evidence: a folded
#: standardisation leaves the original bias (0.1 of 72 in the repro), a bias unrelated to the weights most of
#: its norm (a random one ``sqrt(1 - K / N)``: 0.87 at 16 features and 64 outputs).
BIAS_FIT = 0.25
#: The largest chance that a bias unrelated to the weights fits the offsets as closely (:func:`fit_chance`)
#: for the fit to count as evidence. A folded standardisation's: 1e-142 (the 16-feature repro), 1e-72 (the
#: Conv1d), 1e-143 (sweep W yearint); random biases of standardised-input MLPs
#: (sweep W, normtab): 0.44 to 0.94 at 32 into 33 or 36 and 64 into 65, 1 where N <= K.
FIT_CHANCE = 1e-6
#: The median ratio of a bias to the spread unit-variance features give its pre-activation (``|b_n| / |W_n|``)
#: past which, the fit being no evidence, the bias itself says the input is not standardised (module doc):
#: 170 to 280 for folded standardisations (the repros, the bottleneck test), 0.13 to 1.5 in sweep W's
#: normalised MLPs.
BIAS_SPREAD = 10.0
# Ops whose output holds their input's values, features kept: ONNX's (input_scale.SAME_VALUES) and ATen's.
_SAME_VALUES = SAME_VALUES | {"_to_copy", "view", "reshape", "flatten", "unsqueeze", "squeeze", "clone", "contiguous",
                              "alias"}
# ATen products with a constant weight and bias read here: per op, the position of its ``groups`` argument
# (None: no groups).
_ATEN_GROUPS: dict[str, int | None] = {"linear": None, "conv1d": 6, "conv2d": 6, "conv3d": 6, "convolution": 8}
_PRODUCTS = frozenset({"Gemm", "MatMul", "Conv", *_ATEN_GROUPS})


@dataclasses.dataclass(frozen=True)
class OffsetFinding:
    """What the weights of a first product say of its raw input (module doc)."""

    source: Vertex  # the float graph input
    feature: int  # the feature (a Gemm's column of the input, a Conv's channel) whose rounding weighs most
    offset: float  # that feature's estimated offset (the mean the folded bias cancels)
    spacing: float  # the target's spacing at that offset
    noise: float  # RMS rounding noise of the worst pre-activation (in its units)
    features: int  # K: the features the fit solved for
    outputs: int  # N: the product's outputs (the equations)
    fit: float  # the residual's share of the bias's norm
    chance: float  # an upper bound on the chance that a bias unrelated to the weights fits as closely
    spread: float  # the median of |b_n| / |W_n|: the bias against what unit-variance features spread

    @property
    def determined(self) -> bool:
        """Whether the fit is evidence: a bias unrelated to the weights would fit as closely with a chance
        under :data:`FIT_CHANCE` (never where N <= K: any bias fits, module doc)."""
        return self.chance < FIT_CHANCE


def _array(value: ir.Value | None) -> np.ndarray | None:
    """A constant float value's array (float64), finite; None otherwise."""
    if value is None or value.is_graph_input() or (value.const_value is None and not is_constant(value)):
        return None  # (an FX parameter holds its tensor, in no graph)
    array = constant_array(value)
    if array is None or not np.issubdtype(array.dtype, np.floating):
        return None
    array = np.asarray(array, np.float64)
    return array if np.all(np.isfinite(array)) else None


def _matmul_bias(node: ir.Node, outputs: int) -> np.ndarray | None:
    """The constant [N] bias the only reader of a MatMul's output adds to it."""
    uses = list(node.outputs[0].uses()) if node.outputs else []
    if len(uses) != 1 or uses[0][0].op_type != "Add":
        return None
    add, index = uses[0]
    bias = _array(add.inputs[1 - index]) if len(add.inputs) == 2 else None
    if bias is None or bias.ndim == 0 or bias.size != outputs or bias.shape[-1] != outputs:
        return None  # (a scalar is no bias per output)
    return bias.reshape(-1)


def product_weights(node: ir.Node) -> tuple[np.ndarray, np.ndarray] | None:
    """A first product's weight as ``[outputs, features, taps]`` and its bias ``[outputs]`` (module doc: Gemm,
    MatMul + Add, Conv with one group), constants both; None otherwise."""
    if node.op_type == "Gemm" and len(node.inputs) == 3 and not node.attributes.get_int("transA", 0):
        weight = _array(node.inputs[1])
        bias = _array(node.inputs[2])
        if weight is None or weight.ndim != 2 or bias is None:
            return None
        weight = weight if node.attributes.get_int("transB", 0) else weight.T  # [N, K]
        if bias.size != weight.shape[0]:
            return None
        return weight[:, :, None], bias.reshape(-1)
    if node.op_type == "MatMul" and len(node.inputs) == 2:
        weight = _array(node.inputs[1])
        if weight is None or weight.ndim != 2:
            return None
        bias = _matmul_bias(node, weight.shape[1])
        return (weight.T[:, :, None], bias) if bias is not None else None
    if node.op_type == "Conv" and len(node.inputs) == 3 and node.attributes.get_int("group", 1) == 1:
        weight = _array(node.inputs[1])
        bias = _array(node.inputs[2])
        if weight is None or weight.ndim < 3 or bias is None or bias.size != weight.shape[0]:
            return None
        return weight.reshape(weight.shape[0], weight.shape[1], -1), bias.reshape(-1)
    return None


def aten_product_weights(vertex: Vertex) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`product_weights` of an FX vertex: ``linear(input, weight, bias)`` and a convolution
    (``conv1d``/``conv2d``/``conv3d``, ``convolution`` not transposed) with one group, whose weight and bias are
    parameters the vertex reads (its ``constants``, named by the ``get_attr`` target or placeholder)."""
    call = getattr(vertex.node, "fx", None)
    op = getattr(vertex.node, "op_type", None)
    if call is None or op not in _ATEN_GROUPS or len(call.args) < 3:
        return None
    at = _ATEN_GROUPS[op]
    if at is not None and (_argument(call, at, "groups", 1) != 1 or (
            op == "convolution" and _argument(call, 6, "transposed", False))):
        return None
    named = {value.name: value for value in vertex.constants}

    def read(arg: object) -> np.ndarray | None:
        names = [str(getattr(arg, "target", "")), str(getattr(arg, "name", ""))]
        return next((_array(named[n]) for n in names if n in named), None)

    weight, bias = read(call.args[1]), read(call.args[2])
    if weight is None or bias is None or weight.ndim < 2 or bias.size != weight.shape[0]:
        return None
    return weight.reshape(weight.shape[0], weight.shape[1], -1), bias.reshape(-1)


def _argument(call: object, position: int, name: str, default: object) -> object:
    """An FX call's argument by position or keyword (``default`` where it leaves it out)."""
    args, kwargs = getattr(call, "args", ()), getattr(call, "kwargs", {})
    return args[position] if len(args) > position else kwargs.get(name, default)


def spacing(values: np.ndarray, target: Target) -> np.ndarray:
    """The target's spacing between representable numbers at each of ``values`` (normal numbers: the
    power of two at or below ``|v|`` times its machine epsilon; 0 at 0)."""
    eps = float(ml_dtypes.finfo(target.numpy_dtype).eps)
    magnitude = np.abs(values)
    exponent = np.floor(np.log2(np.where(magnitude > 0, magnitude, 1.0)))
    return np.where(magnitude > 0, np.exp2(exponent) * eps, 0.0)


def offset_estimate(weight: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, float] | None:
    """The per-feature offsets ``m`` a folded standardisation's bias cancels (least squares of
    ``sum_k W_nk m_k = -b_n``, a Conv's ``W`` summed over its taps; where the outputs do not outnumber the
    features, the least-norm solution, which any bias fits) and the residual's share of ``|b|``; None where
    the bias is zero."""
    norm = float(np.linalg.norm(bias))
    if norm == 0.0:
        return None
    per_feature = weight.sum(axis=2)  # [N, K]
    offsets, *_ = np.linalg.lstsq(per_feature, -bias, rcond=None)
    return offsets, float(np.linalg.norm(per_feature @ offsets + bias)) / norm


def fit_chance(fit: float, features: int, outputs: int) -> float:
    """An upper bound on the chance that an isotropic random bias over ``outputs`` leaves no more than ``fit``
    of its norm unexplained by ``features`` offsets: ``P(Beta((N-K)/2, K/2) <= fit^2)``, bounded by
    ``x^a (1 - x)^min(b - 1, 0) / (a B(a, b))``; 1 where N <= K (any bias fits)."""
    if outputs <= features or fit >= 1.0:
        return 1.0
    if fit <= 0.0:
        return 0.0
    a, b, x = (outputs - features) / 2, features / 2, fit * fit
    log = (a * math.log(x) + min(b - 1, 0.0) * math.log1p(-x) - math.log(a)
           - math.lgamma(a) - math.lgamma(b) + math.lgamma(a + b))
    return math.exp(min(log, 0.0))


def bias_spread(weight: np.ndarray, bias: np.ndarray) -> float:
    """The median over outputs of ``|b_n| / |W_n|``: the bias against the spread unit-variance features (each
    tap another sample) give the pre-activation; inf where a row of the weight is zero under a bias."""
    rows = np.sqrt((weight ** 2).sum(axis=(1, 2)))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(rows > 0, np.abs(bias) / np.where(rows > 0, rows, 1.0), np.where(bias != 0, np.inf, 0.0))
    return float(np.median(ratio))


def offset_noise(weight: np.ndarray, offsets: np.ndarray, target: Target) -> tuple[np.ndarray, np.ndarray]:
    """Per output, the RMS noise rounding features at ``offsets`` to ``target`` puts into the pre-activation
    (uniform rounding: ``spacing^2 / 12`` per tap), and per output and feature its share of the variance."""
    per_feature = (weight ** 2).sum(axis=2) * spacing(offsets, target)[None, :] ** 2 / 12.0  # [N, K]
    return np.sqrt(per_feature.sum(axis=1)), per_feature


def offset_findings(graph: PrecisionGraph) -> dict[int, OffsetFinding]:
    """Per free product vertex reading a float graph input as it is (module doc) whose weights and bias put it
    at offsets whose rounding adds more than :data:`PRE_ACTIVATION_NOISE` to its pre-activations: what they
    say, the fit's evidence or not (:attr:`OffsetFinding.determined`)."""
    digraph = dataflow(graph)
    derived = constant_derived(graph, digraph)
    found: dict[int, OffsetFinding] = {}
    for vertex in graph.vertices:
        node = vertex.node
        if not vertex.free or node is None or node.op_type not in _PRODUCTS:
            continue
        path = paths_into(graph, vertex, lambda v: v.node is None and is_raw(v, digraph, derived),
                          lambda v: v.node is not None and v.node.op_type in _SAME_VALUES, digraph)
        sources = [vid for vid in path if graph.vertices[vid].node is None]
        # the weights are read only for a product on a graph input (an LLM's are many and large)
        read = None if not sources else (
            product_weights(node) if isinstance(node, ir.Node) else aten_product_weights(vertex))
        if read is None:
            continue
        weight, bias = read
        estimate = offset_estimate(weight, bias)
        if estimate is None or estimate[1] > BIAS_FIT:
            continue
        offsets, fit = estimate
        noise, shares = offset_noise(weight, offsets, graph.target)
        worst = int(np.argmax(noise))
        if not math.isfinite(float(noise[worst])) or noise[worst] <= PRE_ACTIVATION_NOISE:
            continue
        feature = int(np.argmax(shares[worst]))
        found[vertex.id] = OffsetFinding(
            graph.vertices[min(sources)], feature, float(offsets[feature]),
            float(spacing(offsets[feature:feature + 1], graph.target)[0]), float(noise[worst]),
            weight.shape[1], weight.shape[0], fit, fit_chance(fit, weight.shape[1], weight.shape[0]),
            bias_spread(weight, bias))
    return found


def raw_offset_products(graph: PrecisionGraph) -> dict[int, OffsetFinding]:
    """The :func:`offset_findings` whose fit is evidence (:attr:`OffsetFinding.determined`): the pass pins
    them."""
    return {vid: f for vid, f in offset_findings(graph).items() if f.determined}


def raw_offset_warnings(graph: PrecisionGraph, plan: PrecisionPlan, inputs: Container[str]) -> list[str]:
    """One sentence per :func:`offset_findings` product reading one of ``inputs`` (those no data of the user's
    was seen for: calibration's measured error says more than the weights) whose fit is no evidence but whose
    bias is past :data:`BIAS_SPREAD` times its pre-activations' spread on unit-variance features (module doc),
    and which the plan keeps in the target's type: the input and feature, the offset its bias would cancel,
    and what says more."""
    found = []
    for vid, f in sorted(offset_findings(graph).items()):
        value = f.source.slots[0].value if f.source.slots else None
        if (f.determined or f.spread < BIAS_SPREAD or value is None or value.name not in inputs
                or plan.decisions[vid].dtype != graph.target.dtype):
            continue
        found.append(
            f"{graph.vertices[vid].describe()} reads {f.source.describe()} in {graph.target.value.upper()}, and its "
            f"bias would cancel an offset near "
            f"{f.offset:.4g} in feature {f.feature} (a standardisation folded into it), where the target's spacing "
            f"is {f.spacing:.3g}: RMS noise up to {f.noise:.3g} in its pre-activations; {f.outputs} outputs over "
            f"{f.features} features cannot confirm it, but the bias is {f.spread:.3g} times the spread standardised "
            "features would give (the units would never switch on them). Give calibration data of real inputs "
            "(--calibration-data, or samples=/calibration=: the error is then measured on them, and --tolerance "
            "keeps FP32 what that needs), or standardise the input before the model")
    return found


@dataclasses.dataclass
class RawOffsetProductPass(AnalysisPass):
    def requires(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        require_roles(self, graph, plan)

    def ensures(self, graph: PrecisionGraph, plan: PrecisionPlan, before: PrecisionPlan) -> None:
        found = raw_offset_products(graph)
        ensure_only_pinned(self, graph, plan, before, PINNABLE, Role.DENY, frozenset({Rule.RAW_OFFSET_PRODUCT}), found)
        ensure_pinned(self, graph, plan, found, "is a first product whose weights say it reads offset raw features")

    def call(self, graph: PrecisionGraph, plan: PrecisionPlan) -> None:
        name = graph.target.value.upper()
        for vid, f in sorted(raw_offset_products(graph).items()):
            if not pinnable(plan, vid):
                continue
            plan.set_role(
                vid, Role.DENY, Rule.RAW_OFFSET_PRODUCT,
                f"FP32: its bias cancels offsets of the raw features of {f.source.describe()} (a standardisation "
                f"folded into its weights: the offsets fit {f.outputs} outputs' bias to within {f.fit:.1%}); "
                f"feature {f.feature} is centred near {f.offset:.4g}, where {name}'s spacing is {f.spacing:.3g}, "
                f"and rounding the input there puts RMS noise {f.noise:.3g} into a pre-activation (of spread about "
                f"1; past {PRE_ACTIVATION_NOISE:g}). Measured (sweep Y): a 16-feature sensor MLP 17.8% of range off "
                "and 24.7% labels flipped in BF16 with it low, 0.23% FP32; it is one first layer over the raw "
                "features",
            )
