"""Interval rules per ONNX op: a sound bound of every output from bounds of the inputs, and the values
some input provably reaches.

A :class:`Bound` holds, per element (numpy arrays broadcastable to the tensor, right-aligned as ONNX
broadcasts), a sound interval ``[lo, hi]`` that every input within the stated ranges keeps, and two
attained values: for each element some input makes it at least ``ahi``, and some input makes it at
most ``alo``. ``box`` says the elements vary independently (a graph input, its slices, padding and
reshapes): a filter with constant weights over a box attains its bounds exactly (``x = s * sign(w)``).

Rules, each sound: filters (Conv, MatMul and Gemm with constant weights) bound output channel ``m`` by
``sum |w| * |x|``-style sums of positive and negative weights and, off a box, attain at least the
worst case of all inputs but one plus that one at its attained value; monotone elementwise ops map the
ends; squares and absolute values take the larger end; sums add attained values to the other
operand's sound bound; reductions add the rest at their worst; data movement keeps the extremes (a
slice keeps the least attained value, which every element reaches). Every other op gives no bound.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx_ir as ir

__all__ = ["Bound", "apply", "exact"]

INF = math.inf


@dataclasses.dataclass(frozen=True)
class Bound:
    lo: np.ndarray
    hi: np.ndarray
    alo: np.ndarray
    ahi: np.ndarray
    box: bool = False

    @property
    def reached(self) -> float:
        """A magnitude some input within the ranges provably makes the tensor reach (0: none known)."""
        return max(0.0, float(np.max(self.ahi)), -float(np.min(self.alo)))

    @property
    def magnitude(self) -> float:
        """The largest magnitude any input within the ranges can give (sound)."""
        return max(abs(float(np.min(self.lo))), abs(float(np.max(self.hi))))


def exact(lo, hi, box: bool = False) -> Bound:
    """A bound every element attains at both ends."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    return Bound(lo, hi, lo, hi, box)


def loose(lo, hi) -> Bound:
    """A sound bound with nothing known to be attained."""
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    return Bound(lo, hi, hi, lo)


def _clean(b: Bound) -> Bound:
    lo = np.where(np.isnan(b.lo), -INF, b.lo)
    hi = np.where(np.isnan(b.hi), INF, b.hi)
    return Bound(lo, hi, np.where(np.isnan(b.alo), hi, b.alo), np.where(np.isnan(b.ahi), lo, b.ahi), b.box)


# An op rule: (node, bounds of its inputs (None: not known), constant values of its inputs) -> bounds of its outputs.
Rule = Callable[[ir.Node, Sequence["Bound | None"], Sequence["np.ndarray | None"]], "list[Bound] | None"]
RULES: dict[str, Rule] = {}


def rule(*ops: str):
    """Register the decorated function as the rule of ``ops``."""

    def register(fn: Rule) -> Rule:
        for op in ops:
            RULES[op] = fn
        return fn
    return register


def apply(node: ir.Node, ins: Sequence[Bound | None], consts: Sequence[np.ndarray | None]) -> list[Bound] | None:
    fn = RULES.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    if fn is None:
        return None
    with np.errstate(all="ignore"):
        out = fn(node, ins, consts)
    return None if out is None else [_clean(b) for b in out]


def _attr(node: ir.Node, name: str, default):
    attr = node.attributes.get(name)
    return default if attr is None else attr.value


def _operands(ins, consts) -> list[Bound | None]:
    """The bounds of a node's inputs, constants included (exact)."""
    return [b if b is not None else (exact(c, c) if c is not None else None) for b, c in zip(ins, consts, strict=True)]


# ---------------------------------------------------------------------------------------- elementwise
_INCREASING: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Relu": lambda x: np.maximum(x, 0.0), "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "Tanh": np.tanh,
    "Exp": np.exp, "Log": lambda x: np.log(np.maximum(x, 0.0)), "Sqrt": lambda x: np.sqrt(np.maximum(x, 0.0)),
    "Floor": np.floor, "Ceil": np.ceil, "Round": np.round,
    "Softplus": lambda x: np.logaddexp(0.0, x), "Softsign": lambda x: x / (1.0 + np.abs(x)),
}


@rule(*_INCREASING)
def _increasing(node, ins, consts):
    b = ins[0]
    if b is None:
        return None
    f = _INCREASING[node.op_type]
    return [Bound(f(b.lo), f(b.hi), f(b.alo), f(b.ahi), b.box)]


@rule("Neg")
def _neg(node, ins, consts):
    b = ins[0]
    return None if b is None else [Bound(-b.hi, -b.lo, -b.ahi, -b.alo, b.box)]


def _square(b: Bound, power: float = 2.0) -> Bound:
    """|x| ** power: the larger end; 0 when the interval holds it."""
    mag = np.maximum(np.abs(b.lo), np.abs(b.hi)) ** power
    low = np.where((b.lo <= 0) & (b.hi >= 0), 0.0, np.minimum(np.abs(b.lo), np.abs(b.hi)) ** power)
    reach = np.maximum(np.where(b.ahi > 0, b.ahi, 0.0), np.where(b.alo < 0, -b.alo, 0.0)) ** power
    return Bound(low, mag, mag, np.maximum(reach, low))


@rule("Abs")
def _abs(node, ins, consts):
    return None if ins[0] is None else [_square(ins[0], 1.0)]


@rule("Pow")
def _pow(node, ins, consts):
    b, p = ins[0], consts[1]
    if b is None or p is None or np.size(p) != 1:
        return None
    p = float(np.asarray(p).ravel()[0])
    if p == int(p) and int(p) % 2 == 0:
        return [_square(b, p)]
    if p == int(p) and p > 0:
        return [Bound(b.lo**p, b.hi**p, b.alo**p, b.ahi**p, b.box)]
    if p > 0:
        f = lambda x: np.maximum(x, 0.0) ** p  # noqa: E731
        return [Bound(f(b.lo), f(b.hi), f(b.alo), f(b.ahi), b.box)]
    return None


@rule("Clip", "Max", "Min")
def _clamp(node, ins, consts):
    """Clamps by constants (Clip's bounds, Max/Min with a constant): increasing in the signal."""
    signal = [i for i, b in enumerate(ins) if b is not None]
    missing = [i for i, c in enumerate(consts) if i not in signal and node.inputs[i] is not None and c is None]
    if len(signal) != 1 or missing:
        return None
    b = ins[signal[0]]
    if node.op_type == "Clip":
        low = float(np.asarray(consts[1]).ravel()[0]) if len(consts) > 1 and consts[1] is not None else -INF
        high = float(np.asarray(consts[2]).ravel()[0]) if len(consts) > 2 and consts[2] is not None else INF
        f = lambda x: np.clip(x, low, high)  # noqa: E731
    else:
        others = [np.asarray(c, np.float64) for i, c in enumerate(consts) if i != signal[0] and c is not None]
        pick = np.maximum if node.op_type == "Max" else np.minimum
        f = lambda x: functools.reduce(pick, others, x)  # noqa: E731 - broadcasts like the op
    return [Bound(f(b.lo), f(b.hi), f(b.alo), f(b.ahi))]


@rule("Add", "Sub")
def _add(node, ins, consts):
    a, b = _operands(ins, consts)
    if a is None or b is None:
        return None
    if node.op_type == "Sub":
        b = Bound(-b.hi, -b.lo, -b.ahi, -b.alo)
    box = (ins[0] is None or ins[1] is None) and bool(a.box or b.box)
    return [Bound(
        a.lo + b.lo, a.hi + b.hi,
        np.minimum(a.alo + b.hi, b.alo + a.hi), np.maximum(a.ahi + b.lo, b.ahi + a.lo), box,
    )]


def _scale(b: Bound, c: np.ndarray) -> Bound:
    c = np.asarray(c, np.float64)
    lo, hi = np.minimum(b.lo * c, b.hi * c), np.maximum(b.lo * c, b.hi * c)
    ahi = np.where(c >= 0, b.ahi * c, b.alo * c)
    alo = np.where(c >= 0, b.alo * c, b.ahi * c)
    return Bound(lo, hi, alo, ahi, b.box)


@rule("Mul", "Div")
def _mul(node, ins, consts):
    x, y = node.inputs[0], node.inputs[1]
    if node.op_type == "Mul" and x is y and ins[0] is not None:
        return [_square(ins[0])]
    if ins[0] is not None and consts[1] is not None:
        c = np.asarray(consts[1], np.float64)
        return [_scale(ins[0], 1.0 / c if node.op_type == "Div" else c)]
    if node.op_type == "Mul" and ins[1] is not None and consts[0] is not None:
        return [_scale(ins[1], consts[0])]
    a, b = _operands(ins, consts)
    if a is None or b is None or node.op_type == "Div":
        return None
    products = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    return [loose(np.minimum.reduce(products), np.maximum.reduce(products))]


# ---------------------------------------------------------------------------------------- filters
def along(a: np.ndarray, axis: int, rank: int, size: int, reduce) -> np.ndarray:
    """The values of a right-aligned bound array ``a`` (of a rank-``rank`` tensor) along ``axis``, the
    others reduced by ``reduce`` (np.min or np.max): a vector of ``size``."""
    a = np.asarray(a)
    ax = axis % rank - (rank - a.ndim)
    if a.ndim == 0 or ax < 0:
        return np.full(size, float(reduce(a)))
    v = reduce(np.moveaxis(a, ax, 0).reshape(a.shape[ax], -1), axis=1)
    return np.broadcast_to(v, (size,)) if v.size == 1 else v


def _filter(lo, hi, alo, ahi, box: bool, w: np.ndarray) -> tuple[np.ndarray, ...]:
    """Output bounds (lo, hi, alo, ahi) per output row of ``w`` (rows x inputs x taps) over inputs
    whose per-input vectors are the sound ``lo``/``hi`` and the attained ``alo``/``ahi``. Over a box
    every input takes its attained ends independently; otherwise one input is at its attained value
    and the others at their worst."""
    pos, neg = np.maximum(w, 0.0), np.minimum(w, 0.0)
    l3, h3, al3, ah3 = (v[None, :, None] for v in (lo, hi, alo, ahi))
    y_lo = (pos * l3 + neg * h3).sum(axis=(1, 2))
    y_hi = (pos * h3 + neg * l3).sum(axis=(1, 2))
    if box:
        return y_lo, y_hi, (pos * al3 + neg * ah3).sum(axis=(1, 2)), (pos * ah3 + neg * al3).sum(axis=(1, 2))
    gain_hi = pos * ah3 + neg * al3 - np.minimum(w * l3, w * h3)
    gain_lo = pos * al3 + neg * ah3 - np.maximum(w * l3, w * h3)
    return y_lo, y_hi, y_hi + gain_lo.min(axis=(1, 2)), y_lo + gain_hi.max(axis=(1, 2))


def _vectors(x: Bound, axis: int, rank: int, size: int, pad: bool = False) -> tuple[np.ndarray, ...]:
    lo, hi = along(x.lo, axis, rank, size, np.min), along(x.hi, axis, rank, size, np.max)
    alo, ahi = along(x.alo, axis, rank, size, np.min), along(x.ahi, axis, rank, size, np.max)
    if pad:  # zeros of the padding are inputs too (attained values are kept: interior outputs attain them)
        lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    return lo, hi, alo, ahi


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


@rule("Conv")
def _conv(node, ins, consts):
    x, w = ins[0], consts[1]
    rank = _rank(node.inputs[0])
    if x is None or w is None or rank is None or w.ndim != rank:
        return None
    groups = int(_attr(node, "group", 1))
    m, cg = w.shape[0], w.shape[1]
    pads = _attr(node, "pads", None)
    padded = bool(pads is not None and any(pads)) or _attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID")
    lo, hi, alo, ahi = _vectors(x, 1, rank, cg * groups, padded)
    taps = np.asarray(w, np.float64).reshape(m, cg, -1)
    parts = []
    for g in range(groups):
        rows = slice(g * m // groups, (g + 1) * m // groups)
        cols = slice(g * cg, (g + 1) * cg)
        parts.append(_filter(lo[cols], hi[cols], alo[cols], ahi[cols], x.box, taps[rows]))
    out = [np.concatenate([p[i] for p in parts]) for i in range(4)]
    if len(consts) > 2 and consts[2] is not None:
        out = [o + np.asarray(consts[2], np.float64) for o in out]
    shape = (m,) + (1,) * (rank - 2)
    return [Bound(*(o.reshape(shape) for o in out))]


def _matmul_const_right(x: Bound, rank: int, w: np.ndarray, alpha: float = 1.0) -> Bound:
    k, n = w.shape
    lo, hi, alo, ahi = _vectors(x, -1, rank, k)
    taps = (alpha * np.asarray(w, np.float64)).T[:, :, None]  # (n, k, 1)
    return Bound(*(o.reshape(n) for o in _filter(lo, hi, alo, ahi, x.box, taps)))


@rule("MatMul")
def _matmul(node, ins, consts):
    rank = _rank(node.inputs[0]) if ins[0] is not None else _rank(node.inputs[1])
    if rank is None or rank < 2:
        return None
    if ins[0] is not None and consts[1] is not None and np.ndim(consts[1]) == 2:
        return [_matmul_const_right(ins[0], rank, consts[1])]
    if ins[1] is not None and consts[0] is not None and np.ndim(consts[0]) == 2:  # W @ x: rows of W over axis -2
        x, w = ins[1], np.asarray(consts[0], np.float64)
        n, k = w.shape
        lo, hi, alo, ahi = _vectors(x, -2, rank, k)
        return [Bound(*(o.reshape(n, 1) for o in _filter(lo, hi, alo, ahi, x.box, w[:, :, None])))]
    return None


@rule("Gemm")
def _gemm(node, ins, consts):
    if ins[0] is None or consts[1] is None or _attr(node, "transA", 0):
        return None
    w = np.asarray(consts[1], np.float64)
    w = w.T if _attr(node, "transB", 0) else w
    b = _matmul_const_right(ins[0], 2, w, float(_attr(node, "alpha", 1.0)))
    if len(consts) > 2 and node.inputs[2] is not None:
        if consts[2] is None:
            return None
        b = _add(node, [b, None], [None, float(_attr(node, "beta", 1.0)) * np.asarray(consts[2], np.float64)])[0]
    return [b]


@rule("BatchNormalization")
def _batch_norm(node, ins, consts):
    x, rank = ins[0], _rank(node.inputs[0])
    if x is None or rank is None or any(c is None for c in consts[1:5]):
        return None
    scale, bias, mean, var = (np.asarray(c, np.float64) for c in consts[1:5])
    shape = (-1,) + (1,) * (rank - 2)
    a = (scale / np.sqrt(var + float(_attr(node, "epsilon", 1e-5)))).reshape(shape)
    y = _scale(x, a)
    shift = (bias - mean * a.ravel()).reshape(shape)
    return [Bound(y.lo + shift, y.hi + shift, y.alo + shift, y.ahi + shift, x.box)]


# ---------------------------------------------------------------------------------------- reductions
def _axes(node: ir.Node, consts, rank: int) -> list[int] | None:
    axes = consts[1] if len(consts) > 1 and consts[1] is not None else _attr(node, "axes", None)
    if axes is None:
        return None if _attr(node, "noop_with_empty_axes", 0) else list(range(rank))
    return sorted(int(a) % rank for a in np.asarray(axes).ravel())


@rule("ReduceSum", "ReduceMean")
def _reduce_sum(node, ins, consts):
    x, value = ins[0], node.inputs[0]
    rank = _rank(value)
    if x is None or rank is None:
        return None
    axes = _axes(node, consts, rank)
    if axes is None:
        return [x]
    dims = list(value.shape.dims)
    lo, hi, spread_hi, spread_lo = (np.broadcast_to(a, (1,) * (rank - a.ndim) + a.shape) for a in
                                    (x.lo, x.hi, x.ahi - x.lo, x.alo - x.hi))
    count = 1.0
    for ax in axes:
        n = dims[ax] if isinstance(dims[ax], int) else None
        size = lo.shape[ax]
        reps = (n if n is not None else INF) if size == 1 else 1
        count *= n if n is not None else INF
        lo, hi = lo.sum(axis=ax, keepdims=True) * reps, hi.sum(axis=ax, keepdims=True) * reps
        spread_hi, spread_lo = spread_hi.max(axis=ax, keepdims=True), spread_lo.min(axis=ax, keepdims=True)
    ahi, alo = (hi, lo) if x.box else (lo + spread_hi, hi + spread_lo)
    out = [lo, hi, alo, ahi]
    if node.op_type == "ReduceMean":
        out = [o / count for o in out]
    if not _attr(node, "keepdims", 1):
        out = [np.squeeze(o, axis=tuple(axes)) for o in out]
    return [Bound(*out)]


@rule("ReduceMax", "ReduceMin", "MaxPool", "GlobalMaxPool")
def _reduce_extreme(node, ins, consts):
    x = ins[0]
    if x is None:
        return None
    top = node.op_type in ("ReduceMax", "MaxPool", "GlobalMaxPool")
    scalar = [np.asarray(float(f(a))) for f, a in ((np.min, x.lo), (np.max, x.hi))]
    return [Bound(scalar[0], scalar[1], np.asarray(float(np.min(x.alo)) if not top else float(np.max(x.hi))),
                  np.asarray(float(np.max(x.ahi)) if top else float(np.min(x.lo))))]


# ---------------------------------------------------------------------------------------- data movement
_KEEPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand", "Tile",
                    "Pad", "Cast", "Concat", "DepthToSpace", "SpaceToDepth"})
_SUBSETS = frozenset({"Slice", "Gather", "Split"})
_BOX = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Pad", "Cast", "Concat",
                  "Slice", "Split"})


@rule(*(_KEEPS | _SUBSETS))
def _movement(node, ins, consts):
    """Values rearranged: the extremes stay (a subset keeps the attained value every element reaches)."""
    if node.op_type == "Cast" and ir.DataType(int(_attr(node, "to", 1))) not in (
        ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE
    ):
        return None
    data = [b for b in (ins if node.op_type == "Concat" else ins[:1]) if b is not None]
    if not data or (node.op_type == "Concat" and len(data) != sum(v is not None for v in node.inputs)):
        return None
    lo, hi = min(float(np.min(b.lo)) for b in data), max(float(np.max(b.hi)) for b in data)
    if node.op_type == "Pad" and len(consts) > 2 and consts[2] is not None:
        pad = float(np.asarray(consts[2]).ravel()[0])
        lo, hi = min(lo, pad), max(hi, pad)
    elif node.op_type == "Pad":
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if node.op_type in _SUBSETS:
        alo, ahi = max(float(np.max(b.alo)) for b in data), min(float(np.min(b.ahi)) for b in data)
    else:
        alo, ahi = min(float(np.min(b.alo)) for b in data), max(float(np.max(b.ahi)) for b in data)
    box = node.op_type in _BOX and all(b.box for b in data)
    out = Bound(np.asarray(lo), np.asarray(hi), np.asarray(alo), np.asarray(ahi), box)
    return [out] * max(1, len(node.outputs))
