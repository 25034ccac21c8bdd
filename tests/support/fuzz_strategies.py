"""Random valid ONNX graphs for fuzzing the converter, and the checks each one must pass.

:func:`fuzz_cases` is a hypothesis strategy. It builds a graph op by op from a pool of typed tensors
whose static shapes, value intervals and error bounds it tracks: about seventy op types from every
policy category (LOW, HIGH, FOLLOW, PASS, NONFLOAT), numpy broadcasting, If and Loop subgraphs that
read outer-scope tensors, initializers shared between consumers that need different precisions,
Constant nodes, int and bool side paths (shapes, indices, masks, conditions), and graph outputs that
other nodes also consume.

The tolerance rule: first-order forward error analysis. Every float tensor carries a bound ``E`` on
the absolute difference between its value in a low-precision model and in the FP32 model, in units
of the target's unit roundoff ``u`` (2^-11 for FP16, 2^-8 for BF16). Each op propagates its inputs'
bounds through its Lipschitz constant on the tensor's value interval and adds one rounding of its
output (``|value| <= B`` gives ``u * B``); reductions and products add their accumulation. A float
output passes when ``|low - fp32| <= SAFETY * u * E + 1e-6`` everywhere. Ops are only applied where
the analysis is sound: values stay within [-1000, 1000] (far from FP16's 65504), Log/Sqrt/Div/
Reciprocal only on inputs bounded away from zero by much more than their error, Exp only below 3,
LayerNormalization with epsilon 0.25, and no discontinuous op (Floor, Sign, ArgMax...) on a float
value that the conversion may round. Integer and boolean tensors derive only from integer/boolean
inputs, shapes and constants, so they must come out identical.

Loops: the carried value's error is tracked as an affine function ``a * z + b`` of the error ``z``
it enters an iteration with, so the bound after M iterations is exact for the analysis.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import onnx.shape_inference
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

U = {"fp16": 2.0**-11, "bf16": 2.0**-8}
U_MAX = max(U.values())
SAFETY = 4.0
ABS_FLOOR = 1e-6
B_MAX = 1000.0  # largest |value| any float tensor may take
INT_MAX = 200  # integer tensors stay small (exact in FP16 and BF16 when cast to float)

F, I, BOOL = "f", "i", "b"  # noqa: E741 (I: the integer kind, beside F and BOOL)
_ONNX_TYPE = {F: TensorProto.FLOAT, I: TensorProto.INT64, BOOL: TensorProto.BOOL}
_NP_TYPE = {F: np.float32, I: np.int64, BOOL: np.bool_}
# opset -> the IR version to write (the lowest that allows it; onnxruntime 1.31 reads up to IR 13)
OPSETS = {13: 7, 17: 8, 18: 8, 20: 9, 21: 10}
# Converter bugs the fuzzer found, each with an xfail reproduction in tests/e2e/test_fuzz.py. While a bug
# is open the strategy avoids its pattern so that CI stays green; delete the entry once it is fixed.
AVOID = {
    # an attention mask's -1e9 becomes -32768: a fully masked row is uniform only if x + -32768 is
    # rounded to FP16 before the Softmax; onnxruntime's CPU provider runs that Add in FP32 (Casts
    # inserted, then the Cast pair removed) and gives softmax(x) instead
    "fully-masked-row",
}
# Found and fixed (40d8abf), now generated again: with keep_io_types=False, graph inputs that are
# also graph outputs were renamed and inputs that are also initializers were retyped alone; sequence
# values did not carry their elements' type.


# ------------------------------------------------------------------------------------ error bounds


@dataclasses.dataclass(frozen=True)
class Err:
    """An error bound ``a * z + b`` (units of u), ``z`` being the error of the enclosing Loop's
    carried value at the start of an iteration (``a == 0`` outside loop bodies)."""

    a: float = 0.0
    b: float = 0.0

    def __add__(self, other: Err | float) -> Err:
        if isinstance(other, Err):
            return Err(self.a + other.a, self.b + other.b)
        return Err(self.a, self.b + other)

    __radd__ = __add__

    def __mul__(self, k: float) -> Err:
        return Err(self.a * k, self.b * k)

    __rmul__ = __mul__

    def max(self, other: Err) -> Err:
        return Err(max(self.a, other.a), max(self.b, other.b))

    def at(self, z: float) -> float:
        return self.a * z + self.b


def _emax(errs) -> Err:
    out = Err()
    for e in errs:
        out = out.max(e)
    return out


@dataclasses.dataclass
class T:
    """A tensor of the graph being built."""

    name: str
    kind: str  # F, I or BOOL
    shape: tuple[int, ...]
    lo: float = 0.0
    hi: float = 0.0
    err: Err = Err()
    graph_input: bool = False

    @property
    def B(self) -> float:
        return max(abs(self.lo), abs(self.hi))

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None


def _mono(f: Callable[[float], float], lo: float, hi: float) -> tuple[float, float]:
    return f(lo), f(hi)


def _prod_interval(a: T, b: T) -> tuple[float, float]:
    c = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
    return min(c), max(c)


# ----------------------------------------------------------------------------------------- builder


@dataclasses.dataclass
class InputSpec:
    name: str
    kind: str
    shape: tuple[int, ...]
    lo: float
    hi: float


@dataclasses.dataclass
class FuzzCase:
    model: onnx.ModelProto
    inputs: list[InputSpec]
    bounds: dict[str, float]  # float graph output -> error bound in units of u
    target: str
    seed: int
    ops: list[str]
    provider: str = "cuda"
    keep_io_types: bool = True
    block_ops: tuple[str, ...] = ()
    block_nodes: tuple[str, ...] = ()

    def feeds(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        out = {}
        for spec in self.inputs:
            if spec.kind == F:
                out[spec.name] = rng.uniform(spec.lo, spec.hi, spec.shape).astype(np.float32)
            elif spec.kind == I:
                out[spec.name] = rng.integers(int(spec.lo), int(spec.hi) + 1, spec.shape).astype(np.int64)
            else:
                out[spec.name] = rng.integers(0, 2, spec.shape).astype(bool)
        return out

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        return (
            f"FuzzCase(target={self.target}, provider={self.provider}, keep_io_types={self.keep_io_types}, "
            f"block_ops={self.block_ops}, block_nodes={self.block_nodes}, seed={self.seed}, ops={self.ops})\n"
            f"{onnx.printer.to_text(self.model)}"
        )

    def options(self) -> dict:
        return {
            "target": self.target, "provider": self.provider, "keep_io_types": self.keep_io_types,
            "block_ops": list(self.block_ops), "block_nodes": list(self.block_nodes),
        }


class Root:
    """State shared by the main graph and its subgraphs."""

    def __init__(self, draw, opset: int):
        self.draw = draw
        self.opset = opset
        self.counter = 0
        self.initializers: list[onnx.TensorProto] = []
        self.shared: dict[tuple, T] = {}
        self.ops: list[str] = []

    collide = False  # name new tensors after existing ones plus the suffixes the converter uses
    _SUFFIXES = ("_fp16", "_bf16", "_fp32", "_fp16/Cast", "/Cast", "__bf16emu1")

    def fresh(self, prefix: str = "t") -> str:
        self.counter += 1
        if not hasattr(self, "names"):
            self.names: list[str] = []
        name = f"{prefix}{self.counter}"
        if self.collide and prefix in ("t", "n") and self.names and self.draw(st.integers(0, 2)) == 0:
            candidate = self.draw(st.sampled_from(self.names)) + self.draw(st.sampled_from(self._SUFFIXES))
            if candidate not in self.names:
                name = candidate
        self.names.append(name)
        return name


class G:
    """One graph under construction (the main graph, an If branch or a Loop body)."""

    def __init__(self, root: Root, outer: list[T], *, in_loop: bool, depth: int):
        self.root = root
        self.draw = root.draw
        self.pool: list[T] = list(outer)
        self.own: list[T] = []
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.in_loop = in_loop
        self.depth = depth

    # ---- helpers
    @property
    def opset(self) -> int:
        return self.root.opset

    def add(self, t: T) -> T:
        self.pool.append(t)
        self.own.append(t)
        return t

    def node(self, op: str, inputs, outputs: list[T], **attrs) -> None:
        named = self.draw(st.booleans())
        self.nodes.append(
            helper.make_node(
                op, [i if isinstance(i, str) else i.name for i in inputs], [o.name for o in outputs],
                name=self.root.fresh("n") if named else None, **attrs,
            )
        )
        for o in outputs:
            self.add(o)

    def hide(self, t: T) -> None:
        """An intermediate no other op may read and that is no graph output candidate."""
        self.pool.remove(t)
        self.own.remove(t)

    def out(self, kind: str, shape, lo: float, hi: float, err: Err = Err()) -> T:
        return T(self.root.fresh(), kind, tuple(int(d) for d in shape), float(lo), float(hi), err)

    def pick(self, kind: str, pred: Callable[[T], bool] = lambda t: True) -> T | None:
        cands = [t for t in reversed(self.pool) if t.kind == kind and t.B <= B_MAX and math.isfinite(t.err.b)
                 and pred(t)]
        if not cands:
            return None
        return self.draw(st.sampled_from(cands))

    def const(self, array: np.ndarray, *, share: tuple | None = None, lo=None, hi=None) -> T:
        """An initializer (in the main graph or here) or a Constant node; optionally shared by key."""
        if share is not None and share in self.root.shared:
            return self.root.shared[share]
        array = np.asarray(array)
        kind = F if array.dtype.kind == "f" else (BOOL if array.dtype == np.bool_ else I)
        array = array.astype(_NP_TYPE[kind])
        lo = float(array.min()) if lo is None and array.size else (lo if lo is not None else 0.0)
        hi = float(array.max()) if hi is None and array.size else (hi if hi is not None else 0.0)
        t = T(self.root.fresh("c"), kind, array.shape, lo, hi, Err(0.0, max(abs(lo), abs(hi))) if kind == F else Err())
        where = self.draw(st.sampled_from(["main", "main", "main", "local", "constant"]))
        tensor = numpy_helper.from_array(array, t.name)
        if where == "constant" or (where == "local" and self.depth == 0):
            self.nodes.append(helper.make_node("Constant", [], [t.name], value=tensor))
        elif where == "local":
            self.inits.append(tensor)
        else:
            self.root.initializers.append(tensor)
        self.pool.append(t)
        if share is not None and where == "main":  # a main-graph initializer is visible everywhere
            self.root.shared[share] = t
        return t

    def weights(self, shape, bound: float) -> T:
        seed = self.draw(st.integers(0, 2**16))
        share = ("w", tuple(shape), bound) if self.draw(st.booleans()) else None
        if share is not None and share in self.root.shared:
            return self.root.shared[share]
        arr = np.random.default_rng(seed).uniform(-bound, bound, shape).astype(np.float32)
        return self.const(arr, share=share, lo=-bound, hi=bound)

    def scalar(self, value: float, kind: str = F) -> T:
        arr = np.array(value, dtype=_NP_TYPE[kind])
        return self.const(arr, share=("s", kind, float(value)))

    def ints(self, values, shape=None) -> T:
        arr = np.array(values, dtype=np.int64)
        if shape is not None:
            arr = arr.reshape(shape)
        return self.const(arr, share=("i", tuple(arr.shape), tuple(arr.ravel().tolist())))

    def axes_arg(self, op: str, axes: list[int], since: int) -> tuple[list, dict]:
        """Axes as an input (opset >= since) or an attribute."""
        if self.opset >= since:
            return [self.ints(axes)], {}
        return [], {"axes": axes}


# -------------------------------------------------------------------------------------------- ops
# Each op reads tensors from g.pool and adds nodes and tensors; it returns False when it does not
# apply to what the pool holds. Error rules: docstring at the top.


def _unary(op: str, f: Callable[[float], float], lipschitz, *, rounding: float = 1.0, pred=None, attrs=None,
           interval=None, min_opset: int = 1):
    def build(g: G) -> bool:
        if g.opset < min_opset:
            return False
        x = g.pick(F, pred or (lambda t: True))
        if x is None:
            return False
        lo, hi = interval(x) if interval else _mono(f, x.lo, x.hi)
        L = lipschitz(x) if callable(lipschitz) else lipschitz
        y = g.out(F, x.shape, lo, hi)
        y.err = x.err * L + rounding * max(abs(lo), abs(hi))
        if y.B > B_MAX:
            return False
        g.node(op, [x], [y], **(attrs or {}))
        return True

    build.__name__ = op
    return build


def _sigmoid(v):
    return 1 / (1 + math.exp(-v))


def _gelu(v):
    return 0.5 * v * (1 + math.erf(v / math.sqrt(2)))


def _margin_ok(t: T, lo_needed: float) -> bool:
    """t's values stay >= lo_needed (> 0) under its low-precision error, with room to spare."""
    return t.err.a == 0 and t.lo >= lo_needed and U_MAX * t.err.b * SAFETY < 0.25 * t.lo


UNARY = [
    _unary("Relu", lambda v: max(v, 0.0), 1.0, rounding=0.0),
    _unary("Abs", abs, 1.0, rounding=0.0,
           interval=lambda x: (0.0 if x.lo <= 0 <= x.hi else min(abs(x.lo), abs(x.hi)), x.B)),
    _unary("Neg", lambda v: -v, 1.0, rounding=0.0, interval=lambda x: (-x.hi, -x.lo)),
    _unary("Identity", lambda v: v, 1.0, rounding=0.0),
    _unary("Sigmoid", _sigmoid, 0.25, rounding=2.0),
    _unary("Tanh", math.tanh, 1.0, rounding=2.0),
    _unary("Erf", math.erf, 1.13, rounding=2.0),
    _unary("Softsign", lambda v: v / (1 + abs(v)), 1.0, rounding=2.0),
    _unary("HardSigmoid", lambda v: min(max(0.2 * v + 0.5, 0.0), 1.0), 0.2, rounding=2.0),
    _unary("LeakyRelu", lambda v: v if v > 0 else 0.1 * v, 1.0, attrs={"alpha": 0.1}),
    _unary("Elu", lambda v: v if v > 0 else math.expm1(v), 1.0, rounding=2.0),
    _unary("Selu", lambda v: 1.0507 * (v if v > 0 else 1.6733 * math.expm1(v)), 1.76, rounding=2.0),
    _unary("Celu", lambda v: v if v > 0 else math.expm1(v), 1.0, rounding=2.0, min_opset=12),
    _unary("Atan", math.atan, 1.0, rounding=2.0),
    _unary("Sin", math.sin, 1.0, rounding=2.0, interval=lambda x: (-1.0, 1.0), pred=lambda t: t.B <= 50),
    _unary("Cos", math.cos, 1.0, rounding=2.0, interval=lambda x: (-1.0, 1.0), pred=lambda t: t.B <= 50),
    _unary("Softplus", lambda v: math.log1p(math.exp(v)), 1.0, rounding=2.0, pred=lambda t: t.hi <= 5),
    _unary("Exp", math.exp, lambda x: math.exp(x.hi), rounding=2.0, pred=lambda t: t.hi <= 3),
    _unary("Log", math.log, lambda x: 1 / x.lo, rounding=2.0, pred=lambda t: _margin_ok(t, 0.5)),
    _unary("Sqrt", math.sqrt, lambda x: 0.5 / math.sqrt(x.lo), rounding=2.0, pred=lambda t: _margin_ok(t, 0.25)),
    _unary("Reciprocal", lambda v: 1 / v, lambda x: 1 / x.lo**2, rounding=2.0,
           pred=lambda t: _margin_ok(t, 0.5), interval=lambda x: (1 / x.hi, 1 / x.lo)),
    _unary("Gelu", _gelu, 1.13, rounding=2.0, min_opset=20,
           interval=lambda x: (-0.17 if x.lo < 0 else _gelu(x.lo), max(_gelu(x.hi), 0.0))),
    _unary("Mish", lambda v: v * math.tanh(math.log1p(math.exp(v))), 1.2, rounding=2.0, min_opset=18,
           pred=lambda t: t.hi <= 20, interval=lambda x: (-0.31 if x.lo < 0 else 0.0, max(x.hi, 0.0))),
    _unary("HardSwish", lambda v: v * min(max(v + 3, 0), 6) / 6, lambda x: (2 * x.B + 3) / 6, rounding=2.0,
           min_opset=14, interval=lambda x: (-0.375 if x.lo < 0 else 0.0, max(x.hi, 0.0))),
]


def _clip(g: G) -> bool:
    x = g.pick(F)
    if x is None:
        return False
    a = g.draw(st.sampled_from([-1.0, -0.5, 0.0]))
    b = g.draw(st.sampled_from([0.5, 1.0, 2.0]))
    lo, hi = min(max(x.lo, a), b), max(min(x.hi, b), a)
    y = g.out(F, x.shape, lo, hi, x.err)
    if g.draw(st.booleans()):
        g.node("Clip", [x, g.scalar(a), g.scalar(b)], [y])
    else:
        g.node("Clip", [x, "", g.scalar(b)], [y])
        y.lo, y.hi = min(x.lo, b), min(x.hi, b)
    return True


def _partner(g: G, x: T, kind: str = F) -> T:
    """A second operand broadcastable with x: x itself, one from the pool, or a new constant of a
    compatible shape."""
    if g.draw(st.integers(0, 7)) == 0:
        return x
    if g.draw(st.booleans()):
        other = g.pick(kind, lambda t: t is not x and _broadcast(t.shape, x.shape) is not None
                       and len(_broadcast(t.shape, x.shape)) <= 4 and math.prod(_broadcast(t.shape, x.shape)) <= 256)
        if other is not None:
            return other
    rank = g.draw(st.integers(0, len(x.shape)))
    shape = list(x.shape[len(x.shape) - rank:])
    shape = [1 if g.draw(st.booleans()) else d for d in shape]
    if kind == F:
        lo = g.draw(st.sampled_from([-1.0, 0.5]))
        seed = g.draw(st.integers(0, 2**16))
        arr = np.random.default_rng(seed).uniform(lo, lo + 1.0, shape).astype(np.float32)
        return g.const(arr, lo=lo, hi=lo + 1.0)
    arr = np.random.default_rng(g.draw(st.integers(0, 99))).integers(0, 4, shape)
    return g.const(arr.astype(np.int64), lo=0, hi=3)


def _binary(op: str):
    def build(g: G) -> bool:
        x = g.pick(F)
        if x is None:
            return False
        y = _partner(g, x)
        if g.draw(st.booleans()):
            x, y = y, x
        shape = _broadcast(x.shape, y.shape)
        if op == "Add":
            lo, hi, err = x.lo + y.lo, x.hi + y.hi, x.err + y.err
        elif op == "Sub":
            lo, hi, err = x.lo - y.hi, x.hi - y.lo, x.err + y.err
        elif op == "Mul":
            (lo, hi), err = _prod_interval(x, y), x.err * y.B + y.err * x.B
        else:  # Div: only by values bounded away from zero
            if not _margin_ok(y, 0.5):
                return False
            q = [x.lo / y.lo, x.lo / y.hi, x.hi / y.lo, x.hi / y.hi]
            lo, hi, err = min(q), max(q), x.err * (1 / y.lo) + y.err * (x.B / y.lo**2)
        out = g.out(F, shape, lo, hi)
        out.err = err + out.B
        if out.B > B_MAX:
            return False
        g.node(op, [x, y], [out])
        return True

    build.__name__ = op
    return build


def _variadic(op: str):
    def build(g: G) -> bool:
        x = g.pick(F)
        if x is None:
            return False
        args = [x] + [_partner(g, x) for _ in range(g.draw(st.integers(0, 2)))]
        shape = _broadcast(*(a.shape for a in args))
        if shape is None:
            return False
        if op == "Max":
            lo, hi, err = max(a.lo for a in args), max(a.hi for a in args), _emax(a.err for a in args)
        elif op == "Min":
            lo, hi, err = min(a.lo for a in args), min(a.hi for a in args), _emax(a.err for a in args)
        elif op == "Sum":
            lo, hi = sum(a.lo for a in args), sum(a.hi for a in args)
            err = sum((a.err for a in args), Err()) + len(args) * max(a.B for a in args)
        else:  # Mean
            lo, hi = sum(a.lo for a in args) / len(args), sum(a.hi for a in args) / len(args)
            err = sum((a.err for a in args), Err()) * (1 / len(args)) + len(args) * max(a.B for a in args)
        out = g.out(F, shape, lo, hi, err)
        if out.B > B_MAX:
            return False
        g.node(op, args, [out])
        return True

    build.__name__ = op
    return build


def _pow(g: G) -> bool:
    x = g.pick(F, lambda t: t.B <= 8)
    if x is None:
        return False
    p = g.draw(st.sampled_from([2.0, 3.0]))
    if p == 2.0:
        lo = 0.0 if x.lo <= 0 <= x.hi else min(abs(x.lo), abs(x.hi)) ** 2
        hi = x.B**2
    else:
        lo, hi = x.lo**3, x.hi**3
    y = g.out(F, x.shape, lo, hi)
    y.err = x.err * (p * x.B ** (p - 1)) + 2 * y.B
    g.node("Pow", [x, g.scalar(p)], [y])
    return True


def _prelu(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None:
        return False
    shape = [1] * (len(x.shape) - 1) + [x.shape[-1]] if g.draw(st.booleans()) else [1]
    slope = g.const(np.random.default_rng(g.draw(st.integers(0, 99))).uniform(0, 0.5, shape).astype(np.float32),
                    lo=0.0, hi=0.5)
    y = g.out(F, x.shape, min(x.lo * 0.5, x.lo, 0.0), max(x.hi, 0.0))
    y.err = x.err + slope.err * x.B + y.B
    g.node("PRelu", [x, slope], [y])
    return True


def _where(g: G) -> bool:
    x = g.pick(F)
    c = g.pick(BOOL, lambda t: _broadcast(t.shape, x.shape) is not None) if x is not None else None
    if x is None or c is None:
        return False
    y = _partner(g, x)
    shape = _broadcast(c.shape, x.shape, y.shape)
    if shape is None:
        return False
    out = g.out(F, shape, min(x.lo, y.lo), max(x.hi, y.hi), x.err.max(y.err))
    g.node("Where", [c, x, y], [out])
    return True


def _reduce_axes(g: G, x: T) -> tuple[list[int], int, tuple[int, ...]] | None:
    if not x.shape:
        return None
    r = len(x.shape)
    axes = sorted(set(g.draw(st.lists(st.integers(0, r - 1), min_size=1, max_size=r))))
    keep = g.draw(st.booleans())
    n = math.prod(x.shape[a] for a in axes)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape)) if keep else tuple(
        d for i, d in enumerate(x.shape) if i not in axes
    )
    axes = [a - r if g.draw(st.booleans()) else a for a in axes]
    return axes, int(keep), shape, n


def _reduce(op: str):
    since = 13 if op == "ReduceSum" else 18

    def build(g: G) -> bool:
        x = g.pick(F, lambda t: len(t.shape) >= 1)
        if x is None:
            return False
        axes, keep, shape, n = _reduce_axes(g, x)
        B = x.B
        if op == "ReduceSum":
            lo, hi, err = n * x.lo, n * x.hi, x.err * n + n * B
        elif op == "ReduceMean":
            lo, hi, err = x.lo, x.hi, x.err + 2 * B
        elif op in ("ReduceMax", "ReduceMin"):
            lo, hi, err = x.lo, x.hi, x.err
        elif op == "ReduceSumSquare":
            lo, hi, err = 0.0, n * B * B, x.err * (2 * n * B) + 2 * n * B * B
        elif op == "ReduceL2":
            lo, hi, err = 0.0, math.sqrt(n) * B, x.err * math.sqrt(n) + 2 * math.sqrt(n) * B
        else:  # ReduceLogSumExp
            if x.hi > 5:
                return False
            lo, hi, err = x.lo, x.hi + math.log(n), x.err + 2 * (B + math.log(n))
        out = g.out(F, shape, lo, hi)
        out.err = err + out.B
        if out.B > B_MAX:
            return False
        extra, attrs = g.axes_arg(op, axes, since)
        g.node(op, [x, *extra], [out], keepdims=keep, **attrs)
        return True

    build.__name__ = op
    return build


def _softmax(op: str):
    def build(g: G) -> bool:
        x = g.pick(F, lambda t: len(t.shape) >= 1 and t.hi - t.lo <= 40)
        if x is None:
            return False
        axis = g.draw(st.integers(-len(x.shape), len(x.shape) - 1))
        n = x.shape[axis]
        if op == "Softmax":
            y = g.out(F, x.shape, 0.0, 1.0, x.err * 2 + 2)
        else:
            lo = x.lo - x.hi - math.log(n)
            y = g.out(F, x.shape, lo, 0.0, x.err * 2 + 2 * abs(lo))
        g.node(op, [x], [y], axis=axis)
        return True

    build.__name__ = op
    return build


def _float_and_axis(g: G):
    """A float tensor of rank 1 or more and one of its axes (None when the graph has no such tensor)."""
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None:
        return None
    return x, g.draw(st.integers(0, len(x.shape) - 1))


def _cumsum(g: G) -> bool:
    picked = _float_and_axis(g)
    if picked is None:
        return False
    x, axis = picked
    n = x.shape[axis]
    y = g.out(F, x.shape, n * min(x.lo, 0.0), n * max(x.hi, 0.0))
    y.err = x.err * n + n * x.B + y.B
    if y.B > B_MAX:
        return False
    g.node("CumSum", [x, g.ints(axis, shape=())], [y], reverse=int(g.draw(st.booleans())))
    return True


def _layernorm(g: G) -> bool:
    if g.opset < 17:
        return False
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None:
        return False
    axis = g.draw(st.integers(-len(x.shape), -1))
    norm_shape = x.shape[axis:]
    n = math.prod(norm_shape)
    eps = 0.25  # keeps 1/sqrt(var + eps) <= 2: the analysis needs a bounded condition number
    scale = g.weights(norm_shape, 1.0)
    args = [x, scale]
    bias_b = 0.0
    if g.draw(st.booleans()):
        bias = g.weights(norm_shape, 0.5)
        args.append(bias)
        bias_b = 0.5
    core = min(math.sqrt(n), 2 * x.B / math.sqrt(eps))
    bound = core + bias_b
    lipschitz = (2 / math.sqrt(eps)) * (1 + 2 * x.B / math.sqrt(eps))
    y = g.out(F, x.shape, -bound, bound)
    y.err = x.err * lipschitz + scale.err * core + 4 * bound
    g.node("LayerNormalization", args, [y], axis=axis, epsilon=eps)
    return True


def _batchnorm(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 2)
    if x is None:
        return False
    c = x.shape[1]
    rng = np.random.default_rng(g.draw(st.integers(0, 2**16)))
    scale = g.const(rng.uniform(0.5, 1.5, c).astype(np.float32), lo=0.5, hi=1.5)
    bias = g.const(rng.uniform(-0.5, 0.5, c).astype(np.float32), lo=-0.5, hi=0.5)
    mean = g.const(rng.uniform(-0.5, 0.5, c).astype(np.float32), lo=-0.5, hi=0.5)
    var = g.const(rng.uniform(0.5, 2.0, c).astype(np.float32), lo=0.5, hi=2.0)
    inv = 1 / math.sqrt(0.5)
    bound = 1.5 * (x.B + 0.5) * inv + 0.5
    y = g.out(F, x.shape, -bound, bound)
    y.err = ((x.err + mean.err) * (1.5 * inv) + scale.err * ((x.B + 0.5) * inv)
             + var.err * (1.5 * (x.B + 0.5) * 1.42) + bias.err + 3 * bound)
    g.node("BatchNormalization", [x, scale, bias, mean, var], [y], epsilon=1e-5)
    return True


# ---- LOW: Tensor Core ops


def _matmul(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None:
        return False
    k = x.shape[-1]
    w = None
    if len(x.shape) >= 2 and g.draw(st.booleans()):
        w = g.pick(F, lambda t: t is not x and len(t.shape) >= 2 and t.shape[-2] == k
                   and _broadcast(t.shape[:-2], x.shape[:-2]) is not None)
    if w is None:
        n = g.draw(st.integers(1, 4))
        w = g.weights((k, n), 1.0 / k)
    batch = _broadcast(x.shape[:-2], w.shape[:-2])
    shape = list(batch) + ([x.shape[-2]] if len(x.shape) >= 2 else []) + [w.shape[-1]]
    bound = k * x.B * w.B
    y = g.out(F, shape, -bound, bound)
    y.err = (x.err * w.B + w.err * x.B) * k + k * x.B * w.B + y.B
    if y.B > B_MAX or len(shape) > 4:
        return False
    g.node("MatMul", [x, w], [y])
    return True


def _gemm(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) == 2)
    if x is None:
        return False
    m, k = x.shape
    n = g.draw(st.integers(1, 4))
    trans_b = int(g.draw(st.booleans()))
    w = g.weights((n, k) if trans_b else (k, n), 1.0 / k)
    alpha = g.draw(st.sampled_from([1.0, 0.5]))
    args = [x, w]
    attrs = {"transB": trans_b, "alpha": alpha}
    c_b, c_err = 0.0, Err()
    if g.draw(st.booleans()):
        c = g.weights(g.draw(st.sampled_from([(n,), (1, n), (m, n)])), 0.5)
        args.append(c)
        attrs["beta"] = g.draw(st.sampled_from([1.0, 0.5]))
        c_b, c_err = attrs["beta"] * c.B, c.err * attrs["beta"]
    bound = alpha * k * x.B * w.B + c_b
    y = g.out(F, (m, n), -bound, bound)
    y.err = (x.err * w.B + w.err * x.B) * (alpha * k) + alpha * k * x.B * w.B + c_err + 2 * bound
    g.node("Gemm", args, [y], **attrs)
    return True


def _conv(op: str):
    def build(g: G) -> bool:
        x = g.pick(F, lambda t: len(t.shape) in (3, 4) and all(d >= 2 for d in t.shape[2:]) and t.size <= 128)
        if x is None:
            return False
        spatial = x.shape[2:]
        c = x.shape[1]
        kernel = [g.draw(st.integers(1, min(3, d))) for d in spatial]
        m = g.draw(st.integers(1, 3))
        k = c * math.prod(kernel)
        if op == "Conv":
            stride = g.draw(st.sampled_from([1, 2]))
            pad = g.draw(st.sampled_from([0, 1]))
            w = g.weights((m, c, *kernel), 1.0 / k)
            out_spatial = [(d + 2 * pad - kk) // stride + 1 for d, kk in zip(spatial, kernel)]
            attrs = {"strides": [stride] * len(spatial), "pads": [pad] * (2 * len(spatial)),
                     "kernel_shape": kernel}
        else:
            w = g.weights((c, m, *kernel), 1.0 / k)
            out_spatial = [d + kk - 1 for d, kk in zip(spatial, kernel)]
            attrs = {"kernel_shape": kernel}
        args = [x, w]
        bias_b, bias_err = 0.0, Err()
        if g.draw(st.booleans()):
            b = g.weights((m,), 0.5)
            args.append(b)
            bias_b, bias_err = b.B, b.err
        bound = k * x.B * w.B + bias_b
        y = g.out(F, (x.shape[0], m, *out_spatial), -bound, bound)
        y.err = (x.err * w.B + w.err * x.B) * k + k * x.B * w.B + bias_err + 2 * bound
        g.node(op, args, [y], **attrs)
        return True

    build.__name__ = op
    return build


def _einsum(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) in (2, 3))
    if x is None:
        return False
    if len(x.shape) == 2:
        eq = g.draw(st.sampled_from(["ij,jk->ik", "ij,ij->i", "ij,kj->ik"]))
        i, j = x.shape
        kdim = g.draw(st.integers(1, 4))
        wshape = {"ij,jk->ik": (j, kdim), "ij,ij->i": (i, j), "ij,kj->ik": (kdim, j)}[eq]
        out = {"ij,jk->ik": (i, kdim), "ij,ij->i": (i,), "ij,kj->ik": (i, kdim)}[eq]
        k = j
    else:
        eq = "bij,bjk->bik"
        b, i, j = x.shape
        kdim = g.draw(st.integers(1, 4))
        wshape, out, k = (b, j, kdim), (b, i, kdim), j
    w = g.weights(wshape, 1.0 / k)
    bound = k * x.B * w.B
    y = g.out(F, out, -bound, bound)
    y.err = (x.err * w.B + w.err * x.B) * k + k * x.B * w.B + y.B
    g.node("Einsum", [x, w], [y], equation=eq)
    return True


# ---- PASS: data movement


def _reshape(g: G) -> bool:
    x = g.pick(F, lambda t: t.size >= 1)
    if x is None:
        return False
    n = x.size
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    a = g.draw(st.sampled_from(divisors))
    shape = g.draw(st.sampled_from([[n], [a, n // a], [1, a, n // a], [n // a, a, 1]]))
    spec = list(shape)
    if g.draw(st.booleans()):
        spec[g.draw(st.integers(0, len(spec) - 1))] = -1
    y = g.out(F, shape, x.lo, x.hi, x.err)
    g.node("Reshape", [x, g.ints(spec)], [y])
    return True


def _transpose(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 2)
    if x is None:
        return False
    perm = g.draw(st.permutations(list(range(len(x.shape)))))
    y = g.out(F, [x.shape[p] for p in perm], x.lo, x.hi, x.err)
    g.node("Transpose", [x], [y], perm=list(perm))
    return True


def _concat(g: G) -> bool:
    picked = _float_and_axis(g)
    if picked is None:
        return False
    x, axis = picked
    same = lambda t: len(t.shape) == len(x.shape) and all(  # noqa: E731
        a == b for i, (a, b) in enumerate(zip(t.shape, x.shape)) if i != axis
    )
    other = g.pick(F, same) or x
    parts = [x, other] if g.draw(st.booleans()) else [other, x]
    shape = list(x.shape)
    shape[axis] = x.shape[axis] + other.shape[axis]
    y = g.out(F, shape, min(x.lo, other.lo), max(x.hi, other.hi), x.err.max(other.err))
    if y.size > 512:
        return False
    g.node("Concat", parts, [y], axis=axis - len(shape) if g.draw(st.booleans()) else axis)
    return True


def _slice(g: G) -> bool:
    picked = _float_and_axis(g)
    if picked is None:
        return False
    x, axis = picked
    d = x.shape[axis]
    step = g.draw(st.sampled_from([1, 1, 2, -1]))
    if step > 0:
        start = g.draw(st.integers(0, d - 1))
        end = g.draw(st.integers(start + 1, d))
        length = len(range(start, end, step))
    else:
        start = g.draw(st.integers(0, d - 1))
        end = g.draw(st.integers(-d - 1, start - 1)) if start > 0 else -d - 1
        length = len(range(d)[slice(start, end if end >= -d else None, step)])
    if length < 1:
        return False
    shape = list(x.shape)
    shape[axis] = length
    y = g.out(F, shape, x.lo, x.hi, x.err)
    g.node("Slice", [x, g.ints([start]), g.ints([end]), g.ints([axis]), g.ints([step])], [y])
    return True


def _gather(g: G) -> bool:
    picked = _float_and_axis(g)
    if picked is None:
        return False
    x, axis = picked
    n = x.shape[axis]
    idx = g.pick(I, lambda t: t.lo >= -n and t.hi <= n - 1 and len(t.shape) + len(x.shape) <= 5)
    if idx is None or g.draw(st.booleans()):
        shape = g.draw(st.sampled_from([(), (2,), (1, 2)]))
        vals = np.random.default_rng(g.draw(st.integers(0, 99))).integers(-n, n, shape)
        idx = g.const(vals.astype(np.int64), lo=-n, hi=n - 1)
    shape = list(x.shape[:axis]) + list(idx.shape) + list(x.shape[axis + 1:])
    y = g.out(F, shape, x.lo, x.hi, x.err)
    g.node("Gather", [x, idx], [y], axis=axis)
    return True


def _gather_elements(g: G) -> bool:
    picked = _float_and_axis(g)
    if picked is None:
        return False
    x, axis = picked
    shape = list(x.shape)
    shape[axis] = g.draw(st.integers(1, 3))
    vals = np.random.default_rng(g.draw(st.integers(0, 99))).integers(0, x.shape[axis], shape)
    idx = g.const(vals.astype(np.int64), lo=0, hi=x.shape[axis] - 1)
    y = g.out(F, shape, x.lo, x.hi, x.err)
    g.node("GatherElements", [x, idx], [y], axis=axis)
    return True


def _pad(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 1 and t.size <= 128)
    if x is None:
        return False
    r = len(x.shape)
    mode = g.draw(st.sampled_from(["constant", "constant", "edge", "reflect"]))
    pads = [g.draw(st.integers(0, 1)) for _ in range(2 * r)]
    if mode == "reflect" and any(p >= d for p, d in zip(pads[:r] + pads[r:], x.shape * 2)):
        return False
    shape = [d + pads[i] + pads[i + r] for i, d in enumerate(x.shape)]
    args = [x, g.ints(pads)]
    lo, hi = x.lo, x.hi
    err = x.err
    if mode == "constant":
        value = g.draw(st.sampled_from([0.0, 0.5]))
        if g.draw(st.booleans()) or value:
            c = g.scalar(value)
            args.append(c)
            err = err.max(c.err)
        lo, hi = min(lo, value), max(hi, value)
    y = g.out(F, shape, lo, hi, err)
    g.node("Pad", args, [y], mode=mode)
    return True


def _unsqueeze(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) <= 3)
    if x is None:
        return False
    axis = g.draw(st.integers(0, len(x.shape)))
    shape = list(x.shape)
    shape.insert(axis, 1)
    y = g.out(F, shape, x.lo, x.hi, x.err)
    extra, attrs = g.axes_arg("Unsqueeze", [axis], 13)
    g.node("Unsqueeze", [x, *extra], [y], **attrs)
    return True


def _squeeze(g: G) -> bool:
    x = g.pick(F, lambda t: 1 in t.shape)
    if x is None:
        return False
    axes = [i for i, d in enumerate(x.shape) if d == 1]
    if g.draw(st.booleans()):
        axes = axes[:1]
    y = g.out(F, [d for i, d in enumerate(x.shape) if i not in axes], x.lo, x.hi, x.err)
    extra, attrs = g.axes_arg("Squeeze", axes, 13)
    g.node("Squeeze", [x, *extra], [y], **attrs)
    return True


def _flatten(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None:
        return False
    axis = g.draw(st.integers(0, len(x.shape)))
    y = g.out(F, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])), x.lo, x.hi, x.err)
    g.node("Flatten", [x], [y], axis=axis)
    return True


def _expand(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) <= 3 and t.size <= 32)
    if x is None:
        return False
    target = [g.draw(st.integers(1, 3))] + [d if d != 1 else g.draw(st.integers(1, 3)) for d in x.shape]
    y = g.out(F, _broadcast(tuple(target), x.shape), x.lo, x.hi, x.err)
    g.node("Expand", [x, g.ints(target)], [y])
    return True


def _tile(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 1 and t.size <= 32)
    if x is None:
        return False
    reps = [g.draw(st.integers(1, 2)) for _ in x.shape]
    y = g.out(F, [d * r for d, r in zip(x.shape, reps)], x.lo, x.hi, x.err)
    g.node("Tile", [x, g.ints(reps)], [y])
    return True


def _split(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 1 and max(t.shape) >= 2)
    if x is None:
        return False
    axis = g.draw(st.sampled_from([i for i, d in enumerate(x.shape) if d >= 2]))
    d = x.shape[axis]
    first = g.draw(st.integers(1, d - 1))
    sizes = [first, d - first]
    outs = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        outs.append(g.out(F, shape, x.lo, x.hi, x.err))
    if g.opset >= 13:
        g.node("Split", [x, g.ints(sizes)], outs, axis=axis)
    else:
        g.node("Split", [x], outs, axis=axis, split=sizes)
    return True


def _pool(op: str):
    def build(g: G) -> bool:
        x = g.pick(F, lambda t: len(t.shape) == 4 and min(t.shape[2:]) >= 2)
        if x is None:
            return False
        if op == "GlobalAveragePool":
            y = g.out(F, (*x.shape[:2], 1, 1), x.lo, x.hi, x.err + 3 * x.B)
            g.node(op, [x], [y])
            return True
        k = g.draw(st.integers(1, 2))
        s = g.draw(st.integers(1, 2))
        shape = (*x.shape[:2], *[(d - k) // s + 1 for d in x.shape[2:]])
        err = x.err if op == "MaxPool" else x.err + 3 * x.B
        y = g.out(F, shape, x.lo, x.hi, err)
        g.node(op, [x], [y], kernel_shape=[k, k], strides=[s, s])
        return True

    build.__name__ = op
    return build


def _trilu(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 2)
    if x is None or g.opset < 14:
        return False
    y = g.out(F, x.shape, min(x.lo, 0.0), max(x.hi, 0.0), x.err)
    g.node("Trilu", [x], [y], upper=int(g.draw(st.booleans())))
    return True


def _cast_float(g: G) -> bool:
    x = g.pick(F)
    if x is None:
        return False
    y = g.out(F, x.shape, x.lo, x.hi, x.err)
    if g.opset < 15 or g.draw(st.booleans()):
        g.node("Cast", [x], [y], to=TensorProto.FLOAT)
    else:
        like = g.pick(F) or x
        g.node("CastLike", [x, like], [y])
    return True


def _dropout(g: G) -> bool:
    x = g.pick(F)
    if x is None:
        return False
    y = g.out(F, x.shape, x.lo, x.hi, x.err)
    g.node("Dropout", [x], [y])
    return True


def _constant_of_shape(g: G) -> bool:
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None:
        return False
    s = g.out(I, (len(x.shape),), min(x.shape), max(x.shape))
    g.node("Shape", [x], [s])
    value = g.draw(st.sampled_from([0.0, 1.0, 0.25]))
    y = g.out(F, x.shape, value, value, Err(0.0, value))
    g.node("ConstantOfShape", [s], [y], value=numpy_helper.from_array(np.array([value], np.float32)))
    return True


# ---- NONFLOAT: integer and boolean side paths (values never depend on rounded floats)


def _shape_of(g: G) -> bool:
    x = g.pick(F) or g.pick(I)
    if x is None or not x.shape:
        return False
    if g.draw(st.booleans()):
        y = g.out(I, (len(x.shape),), min(x.shape), max(x.shape))
        g.node("Shape", [x], [y])
    else:
        y = g.out(I, (), x.size, x.size)
        g.node("Size", [x], [y])
    return True


def _int_arith(g: G) -> bool:
    x = g.pick(I)
    if x is None:
        return False
    y = _partner(g, x, I)
    op = g.draw(st.sampled_from(["Add", "Sub", "Mul", "Max", "Min"]))
    shape = _broadcast(x.shape, y.shape)
    if op == "Add":
        lo, hi = x.lo + y.lo, x.hi + y.hi
    elif op == "Sub":
        lo, hi = x.lo - y.hi, x.hi - y.lo
    elif op == "Mul":
        lo, hi = _prod_interval(x, y)
    elif op == "Max":
        lo, hi = max(x.lo, y.lo), max(x.hi, y.hi)
    else:
        lo, hi = min(x.lo, y.lo), min(x.hi, y.hi)
    if max(abs(lo), abs(hi)) > INT_MAX:
        return False
    out = g.out(I, shape, lo, hi)
    g.node(op, [x, y], [out])
    return True


def _compare(g: G) -> bool:
    x = g.pick(I)
    if x is None:
        return False
    y = _partner(g, x, I)
    op = g.draw(st.sampled_from(["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"]))
    if g.opset < 12 and op.endswith("OrEqual"):
        op = "Less"
    out = g.out(BOOL, _broadcast(x.shape, y.shape), 0, 1)
    g.node(op, [x, y], [out])
    return True


def _logic(g: G) -> bool:
    x = g.pick(BOOL)
    if x is None:
        return False
    op = g.draw(st.sampled_from(["Not", "And", "Or", "Xor"]))
    if op == "Not":
        out = g.out(BOOL, x.shape, 0, 1)
        g.node(op, [x], [out])
        return True
    y = g.pick(BOOL, lambda t: _broadcast(t.shape, x.shape) is not None)
    out = g.out(BOOL, _broadcast(x.shape, y.shape), 0, 1)
    g.node(op, [x, y], [out])
    return True


def _argmax_int(g: G) -> bool:
    x = g.pick(I, lambda t: len(t.shape) >= 1)
    if x is None:
        return False
    axis = g.draw(st.integers(0, len(x.shape) - 1))
    keep = int(g.draw(st.booleans()))
    shape = [1 if i == axis else d for i, d in enumerate(x.shape)] if keep else [
        d for i, d in enumerate(x.shape) if i != axis
    ]
    out = g.out(I, shape, 0, x.shape[axis] - 1)
    g.node(g.draw(st.sampled_from(["ArgMax", "ArgMin"])), [x], [out], axis=axis, keepdims=keep)
    return True


def _where_int(g: G) -> bool:
    c = g.pick(BOOL)
    x = g.pick(I, lambda t: _broadcast(t.shape, c.shape) is not None) if c is not None else None
    if x is None:
        return False
    y = _partner(g, x, I)
    shape = _broadcast(c.shape, x.shape, y.shape)
    if shape is None:
        return False
    out = g.out(I, shape, min(x.lo, y.lo), max(x.hi, y.hi))
    g.node("Where", [c, x, y], [out])
    return True


def _to_float(g: G) -> bool:
    """int/bool -> float: exact (|values| <= 200 are representable in FP16 and BF16)."""
    x = g.pick(I) or g.pick(BOOL)
    if x is None:
        return False
    y = g.out(F, x.shape, x.lo, x.hi, Err())
    g.node("Cast", [x], [y], to=TensorProto.FLOAT)
    return True


def _bool_to_int(g: G) -> bool:
    x = g.pick(BOOL)
    if x is None:
        return False
    y = g.out(I, x.shape, 0, 1)
    g.node("Cast", [x], [y], to=TensorProto.INT64)
    return True


# ---- constants beyond the low-precision range, mixed-precision islands, fixed-type inputs


_U_FP16 = 2.0**-11  # absolute error terms are expressed in units of FP16's u (BF16's is larger)


def _range_detour(g: G) -> bool:
    """(x + c) - c with c beyond FP16's range: the converter must keep both nodes in FP32."""
    x = g.pick(F, lambda t: t.B <= 100)
    if x is None:
        return False
    c = g.draw(st.sampled_from([1e5, -1e6, 7e4, 3.0e38]))
    big = g.scalar(c)
    mid = g.out(F, x.shape, x.lo + c, x.hi + c)
    g.node("Add", [x, big], [mid])
    mid.err = Err(math.inf, math.inf)  # not a value any other op may build on
    ulp = float(np.spacing(np.float32(abs(c) + 100)))
    y = g.out(F, x.shape, x.lo, x.hi, x.err + 2 * ulp / _U_FP16 + x.B)
    g.hide(mid)
    g.node("Sub", [mid, big], [y])
    if abs(c) > 1e30:
        y.lo, y.hi = -math.inf, math.inf  # (x + 3e38) - 3e38 is 0 or inf in FP32: no use downstream
        g.hide(y)
    return True


def _masked_softmax(g: G) -> bool:
    """Softmax(x + mask) with an additive attention mask of -1e9 or float32's lowest."""
    x = g.pick(F, lambda t: len(t.shape) >= 1 and t.B <= 4)
    if x is None:
        return False
    n = x.shape[-1]
    rows = g.draw(st.sampled_from([(1,), (x.shape[-2], 1) if len(x.shape) >= 2 else (1,)]))
    fill = g.draw(st.sampled_from([-1e9, float(np.finfo(np.float32).min), -1e4]))
    mask_shape = tuple(r for r in rows[:-1]) + (n,)
    keep = np.random.default_rng(g.draw(st.integers(0, 99))).integers(0, 2, mask_shape).astype(bool)
    if "fully-masked-row" in AVOID:
        keep[..., 0] = True
    mask = g.const(np.where(keep, 0.0, fill).astype(np.float32), lo=fill, hi=0.0)
    scores = g.out(F, _broadcast(x.shape, mask_shape), fill, x.hi)
    g.node("Add", [x, mask], [scores])
    scores.err = Err(math.inf, math.inf)
    g.hide(scores)
    # -1e4 is representable: x + -1e4 then rounds with 1e4's spacing, a precision loss, not a bug
    err = x.err * 2 + 2 if fill < -1e5 else Err(0.0, 2 * 1e4 + 2)
    y = g.out(F, scores.shape, 0.0, 1.0, err)
    g.node("Softmax", [scores], [y], axis=-1)
    return True


def _extreme_clip(g: G) -> bool:
    """Clip with bounds FP16 cannot hold (1e-9 flushes to 0, 1e9 overflows)."""
    x = g.pick(F)
    if x is None:
        return False
    low = g.draw(st.sampled_from([-1e9, 1e-9, -3.0e38]))
    lo = max(x.lo, low)
    hi = max(x.hi, low)
    y = g.out(F, x.shape, lo, hi, x.err)
    g.node("Clip", [x, g.scalar(low), g.scalar(1e9)], [y])
    return True


def _log_of_clip(g: G) -> bool:
    """Log(Clip(x, 1e-9)): the classic -inf if the bound flushes to zero. Only finiteness is checked."""
    x = g.pick(F, lambda t: t.lo >= -1 and t.hi <= 1 and t.err.a == 0)
    if x is None:
        return False
    clipped = g.out(F, x.shape, 1e-9, max(x.hi, 1e-9), x.err)
    g.node("Clip", [x, g.scalar(1e-9), g.scalar(1e9)], [clipped])
    g.hide(clipped)
    y = g.out(F, x.shape, math.log(1e-9), max(math.log(max(x.hi, 1e-9)), math.log(1e-9)), Err(0.0, 1e12))
    g.node("Log", [clipped], [y])
    return True


def _batchnorm_extreme(g: G) -> bool:
    """BatchNormalization with running variances of 1e7..1e9 (real trained models have them)."""
    x = g.pick(F, lambda t: len(t.shape) >= 2)
    if x is None:
        return False
    c = x.shape[1]
    rng = np.random.default_rng(g.draw(st.integers(0, 2**16)))
    var_np = rng.uniform(1e7, 1e9, c).astype(np.float32)
    gain = rng.uniform(0.5, 1.5, c)
    scale = g.const((gain * np.sqrt(var_np)).astype(np.float32))
    bias = g.const(rng.uniform(-0.5, 0.5, c).astype(np.float32), lo=-0.5, hi=0.5)
    mean = g.const(rng.uniform(-0.5, 0.5, c).astype(np.float32), lo=-0.5, hi=0.5)
    var = g.const(var_np)
    bound = 1.5 * (x.B + 0.5) + 0.5
    y = g.out(F, x.shape, -bound, bound)
    y.err = (x.err + mean.err) * 1.5 + 1.5 * (x.B + 0.5) * 2 + bias.err + 3 * bound
    g.node("BatchNormalization", [x, scale, bias, mean, var], [y], epsilon=1e-5)
    return True


def _island(g: G) -> bool:
    """A part the model already computes in FP16 (or FP64): Cast in, a few ops, Cast back."""
    x = g.pick(F, lambda t: t.B <= 100)
    if x is None:
        return False
    to = g.draw(st.sampled_from([TensorProto.FLOAT16, TensorProto.DOUBLE]))
    inside = g.out(F, x.shape, x.lo, x.hi, x.err + x.B)
    g.node("Cast", [x], [inside], to=to)
    g.hide(inside)
    cur = inside
    for op in g.draw(st.lists(st.sampled_from(["Relu", "Neg", "Tanh", "Add"]), min_size=1, max_size=3)):
        nxt = g.out(F, cur.shape, cur.lo, cur.hi, cur.err + 2 * cur.B)
        if op == "Add":
            nxt.lo, nxt.hi, nxt.err = 2 * cur.lo, 2 * cur.hi, cur.err * 2 + 4 * cur.B
            g.node("Add", [cur, cur], [nxt])
        else:
            if op == "Relu":
                nxt.lo, nxt.hi = max(cur.lo, 0.0), max(cur.hi, 0.0)
            elif op == "Neg":
                nxt.lo, nxt.hi = -cur.hi, -cur.lo
            else:
                nxt.lo, nxt.hi = math.tanh(cur.lo), math.tanh(cur.hi)
            g.node(op, [cur], [nxt])
        g.hide(nxt)
        cur = nxt
    y = g.out(F, cur.shape, cur.lo, cur.hi, cur.err + cur.B)
    g.node("Cast", [cur], [y], to=TensorProto.FLOAT)
    return True


def _resize(g: G) -> bool:
    """Resize: its ``scales`` input is float32 whatever the data's type (a fixed-type input)."""
    x = g.pick(F, lambda t: len(t.shape) == 4 and t.size <= 64)
    if x is None:
        return False
    mode = g.draw(st.sampled_from(["nearest", "linear"]))
    factors = [1.0, 1.0, float(g.draw(st.sampled_from([1, 2]))), float(g.draw(st.sampled_from([1, 2])))]
    scales = g.const(np.array(factors, np.float32), share=("scales", tuple(factors)))
    shape = [int(d * f) for d, f in zip(x.shape, factors)]
    err = x.err if mode == "nearest" else x.err + 2 * x.B
    y = g.out(F, shape, x.lo, x.hi, err)
    g.node("Resize", [x, "", scales], [y], mode=mode)
    return True


def _topk(g: G) -> bool:
    """TopK values (continuous in the input); its indices are not (ties), so they are not used."""
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None:
        return False
    axis = g.draw(st.integers(-len(x.shape), len(x.shape) - 1))
    k = g.draw(st.integers(1, x.shape[axis]))
    shape = list(x.shape)
    shape[axis] = k
    values = g.out(F, shape, x.lo, x.hi, x.err)
    indices = g.out(I, shape, 0, x.shape[axis] - 1)
    g.node("TopK", [x, g.ints([k])], [values, indices], axis=axis, largest=int(g.draw(st.booleans())))
    g.hide(indices)
    return True


def _sequence(g: G) -> bool:
    """SequenceConstruct then SequenceAt / ConcatFromSequence: sequence elements share one type."""
    x = g.pick(F, lambda t: len(t.shape) >= 1)
    if x is None or "sequence" in AVOID:
        return False
    parts = [x] + [g.pick(F, lambda t: t.shape == x.shape) or x for _ in range(g.draw(st.integers(1, 2)))]
    seq = g.out(F, x.shape, min(p.lo for p in parts), max(p.hi for p in parts), _emax(p.err for p in parts))
    g.node("SequenceConstruct", parts, [seq])
    g.hide(seq)
    if g.draw(st.booleans()):
        k = g.draw(st.integers(-len(parts), len(parts) - 1))
        p = parts[k]
        y = g.out(F, x.shape, p.lo, p.hi, p.err)
        g.node("SequenceAt", [seq, g.ints(k, shape=())], [y])
    else:
        axis = g.draw(st.integers(0, len(x.shape)))
        shape = list(x.shape)
        shape.insert(axis, len(parts))
        y = g.out(F, shape, seq.lo, seq.hi, seq.err)
        g.node("ConcatFromSequence", [seq], [y], axis=axis, new_axis=1)
    return True


# ---- control flow


def _condition(g: G) -> T | None:
    """A one-element bool tensor whose value does not depend on rounded floats."""
    flag = g.pick(BOOL, lambda t: t.size == 1)
    if flag is not None and len(flag.shape) <= 1 and g.draw(st.booleans()):
        return flag
    src = g.pick(I) or g.pick(F)
    if src is None:
        return None
    size = g.out(I, (), src.size, src.size)
    g.node("Size", [src], [size])
    if g.pick(I, lambda t: t.size >= 1) is not None and g.draw(st.booleans()):
        x = g.pick(I, lambda t: t.size >= 1)
        total = g.out(I, (), x.lo * x.size, x.hi * x.size)
        extra, attrs = g.axes_arg("ReduceSum", list(range(len(x.shape))), 13) if x.shape else ([], {})
        g.node("ReduceSum", [x, *extra], [total], keepdims=0, **attrs)
        size = total
    c = g.out(BOOL, (), 0, 1)
    g.node(g.draw(st.sampled_from(["Greater", "Less", "Equal"])), [size, g.ints(g.draw(st.integers(0, 6)), shape=())], [c])
    return c


def _subgraph(g: G, name: str, inputs: list[T], *, in_loop: bool, budget: int) -> G:
    sub = G(g.root, g.pool + inputs, in_loop=in_loop, depth=g.depth + 1)
    for t in inputs:
        sub.own.append(t)
    build_ops(sub, budget)
    return sub


def _finish(sub: G, name: str, inputs: list[T], outputs: list[T]) -> onnx.GraphProto:
    return helper.make_graph(
        sub.nodes, name, [helper.make_tensor_value_info(t.name, _ONNX_TYPE[t.kind], t.shape) for t in inputs],
        [helper.make_tensor_value_info(t.name, _ONNX_TYPE[t.kind], t.shape) for t in outputs], sub.inits,
    )


def _branch_output(sub: G, like: T) -> T:
    """A tensor of the branch with like's kind and shape, produced by a node of the branch."""
    cands = [t for t in sub.own if t.kind == like.kind and t.shape == like.shape]
    src = sub.draw(st.sampled_from(cands[::-1])) if cands and sub.draw(st.booleans()) else like
    out = sub.out(like.kind, like.shape, src.lo, src.hi, src.err)
    sub.node("Identity", [src], [out])
    return out


def _if(g: G) -> bool:
    if g.depth >= 2:
        return False
    c = _condition(g)
    x = g.pick(F)
    if c is None or x is None:
        return False
    outs_like = [x]
    extra = g.pick(I)
    if extra is not None and g.draw(st.booleans()):
        outs_like.append(extra)
    branches, results = [], []
    for name in ("then", "else"):
        sub = _subgraph(g, name, [], in_loop=g.in_loop, budget=g.draw(st.integers(0, 3)))
        outs = [_branch_output(sub, like) for like in outs_like]
        branches.append(_finish(sub, g.root.fresh(name), [], outs))
        results.append(outs)
    ys = []
    for k, like in enumerate(outs_like):
        a, b = results[0][k], results[1][k]
        ys.append(g.out(like.kind, like.shape, min(a.lo, b.lo), max(a.hi, b.hi), a.err.max(b.err)))
    g.node("If", [c], ys, then_branch=branches[0], else_branch=branches[1])
    return True


def _loop(g: G) -> bool:
    if g.in_loop or g.depth >= 2:
        return False
    v = g.pick(F, lambda t: t.err.a == 0)
    if v is None:
        return False
    m = g.draw(st.integers(1, 3))
    C = max(v.B, 1.0)
    it = T(g.root.fresh("iter"), I, (), 0, m - 1)
    cond_in = T(g.root.fresh("cond"), BOOL, (), 0, 1)
    v_in = T(g.root.fresh("v"), F, v.shape, -C, C, Err(1.0, 0.0))
    sub = _subgraph(g, "body", [it, cond_in, v_in], in_loop=True, budget=g.draw(st.integers(1, 4)))
    cands = [t for t in sub.own if t.kind == F and t.shape == v.shape and t is not v_in]
    src = sub.draw(st.sampled_from(cands[::-1])) if cands else v_in
    v_out = sub.out(F, v.shape, min(max(src.lo, -C), C), max(min(src.hi, C), -C), src.err)
    sub.node("Clip", [src, sub.scalar(-C), sub.scalar(C)], [v_out])
    cond_out = sub.out(BOOL, (), 0, 1)
    sub.node("Identity", [cond_in], [cond_out])
    outs = [cond_out, v_out]
    scan = None
    floats = [t for t in sub.own if t.kind == F and t.size <= 64]
    if floats and g.draw(st.booleans()):
        src = sub.draw(st.sampled_from(floats[::-1]))
        scan = sub.out(F, src.shape, src.lo, src.hi, src.err)
        sub.node("Identity", [src], [scan])
        outs.append(scan)
    body = _finish(sub, g.root.fresh("body"), [it, cond_in, v_in], outs)
    # errors: the carried value enters iteration k with error z_k
    zs = [v.err.b]
    for _ in range(m):
        zs.append(v_out.err.at(zs[-1]))
    final = g.out(F, v.shape, v_out.lo, v_out.hi, Err(0.0, zs[-1]))
    ys = [final]
    if scan is not None:
        ys.append(g.out(F, (m, *scan.shape), scan.lo, scan.hi, Err(0.0, max(scan.err.at(z) for z in zs[:m]))))
    trip = g.ints(m, shape=())
    cond = g.const(np.array(True)) if g.draw(st.booleans()) else None
    g.node("Loop", [trip, cond.name if cond else "", v], ys, body=body)
    return True


CATEGORIES: dict[str, list[Callable[[G], bool]]] = {
    "LOW": [_matmul, _gemm, _conv("Conv"), _conv("ConvTranspose"), _einsum],
    "HIGH": [
        *[u for u in UNARY if u.__name__ in ("Exp", "Log", "Reciprocal", "Softplus", "Sin", "Cos")],
        _pow, _softmax("Softmax"), _softmax("LogSoftmax"), _cumsum, _layernorm,
        *[_reduce(op) for op in ("ReduceSum", "ReduceMean", "ReduceSumSquare", "ReduceL2", "ReduceLogSumExp")],
    ],
    "FOLLOW": [
        *[_binary(op) for op in ("Add", "Mul", "Sub", "Div")],
        *[u for u in UNARY if u.__name__ in ("Sigmoid", "Tanh", "Erf", "Softsign", "HardSigmoid", "LeakyRelu", "Elu",
                                              "Selu", "Celu", "Atan", "Sqrt", "Gelu", "Mish", "HardSwish")],
        _prelu, _batchnorm, _variadic("Sum"), _variadic("Mean"), _pool("AveragePool"), _pool("GlobalAveragePool"),
    ],
    "PASS": [
        *[u for u in UNARY if u.__name__ in ("Relu", "Abs", "Neg", "Identity")],
        _clip, _where, _variadic("Max"), _variadic("Min"), _reduce("ReduceMax"), _reduce("ReduceMin"),
        _reshape, _transpose, _concat, _slice, _gather, _gather_elements, _pad, _unsqueeze, _squeeze, _flatten,
        _expand, _tile, _split, _pool("MaxPool"), _trilu, _cast_float, _dropout, _constant_of_shape,
    ],
    "NONFLOAT": [_shape_of, _int_arith, _compare, _logic, _argmax_int, _where_int, _to_float, _bool_to_int],
    "CONTROL": [_if, _loop, _sequence],
    "EDGE": [_range_detour, _masked_softmax, _extreme_clip, _log_of_clip, _batchnorm_extreme, _island, _resize,
             _topk],
}
OPS = [op for ops in CATEGORIES.values() for op in ops]


def build_ops(g: G, budget: int) -> None:
    for _ in range(budget):
        for _attempt in range(4):
            category = g.draw(st.sampled_from(list(CATEGORIES)))
            op = g.draw(st.sampled_from(CATEGORIES[category]))
            if op(g):
                g.root.ops.append(op.__name__.lstrip("_"))
                break


# ------------------------------------------------------------------------------------- strategy


def _input_shape(draw, image: bool) -> tuple[int, ...]:
    if image:
        return (draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(2, 5)), draw(st.integers(2, 5)))
    return tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))


@st.composite
def fuzz_cases(draw, max_ops: int = 14, targets=("fp16", "fp16", "fp16", "bf16")) -> FuzzCase:
    opset = draw(st.sampled_from(sorted(OPSETS)))
    root = Root(draw, opset)
    root.collide = draw(st.integers(0, 3)) == 0
    g = G(root, [], in_loop=False, depth=0)
    specs = []
    for k in range(draw(st.integers(1, 3))):
        shape = _input_shape(draw, image=draw(st.integers(0, 3)) == 0)
        lo, hi = draw(st.sampled_from([(-1.0, 1.0), (-2.0, 2.0), (0.5, 1.5), (0.0, 1.0)]))
        specs.append(InputSpec(f"x{k}", F, shape, lo, hi))
    if draw(st.booleans()):
        specs.append(InputSpec("ids", I, _input_shape(draw, False), 0, draw(st.integers(0, 3))))
    if draw(st.booleans()):
        specs.append(InputSpec("flag", BOOL, draw(st.sampled_from([(), (1,), (2, 3)])), 0, 1))
    for s in specs:
        t = g.add(T(s.name, s.kind, s.shape, s.lo, s.hi, Err(0.0, max(abs(s.lo), abs(s.hi))) if s.kind == F else Err()))
        t.graph_input = True
    build_ops(g, draw(st.integers(1, max_ops)))
    produced = [t for t in g.own if not t.graph_input]
    last_float = next((t for t in reversed(produced) if t.kind == F), None)
    outputs = [last_float] if last_float is not None else []
    extra = draw(st.lists(st.sampled_from(g.own), max_size=3)) if g.own else []
    for t in extra:
        if t not in outputs:
            outputs.append(t)
    if not outputs:
        outputs = [g.own[0]]
    graph = helper.make_graph(
        g.nodes, "fuzz",
        [helper.make_tensor_value_info(s.name, _ONNX_TYPE[s.kind], s.shape) for s in specs],
        [helper.make_tensor_value_info(t.name, _ONNX_TYPE[t.kind], t.shape) for t in outputs],
        root.initializers,
    )
    target = draw(st.sampled_from(list(targets)))
    # a BF16 target is refused for the CPU provider (it has no BF16 MatMul or Conv)
    provider = draw(st.sampled_from(["cuda", "cuda", "tensorrt"] + (["cpu"] if target != "bf16" else [])))
    keep_io_types = draw(st.sampled_from([True, True, True, False]))
    init_inputs = keep_io_types or "io-initializer-input-low" not in AVOID
    if init_inputs and draw(st.integers(0, 4)) == 0:  # initializers also graph inputs (overridable defaults)
        used = {i for n in g.nodes for i in n.input}
        for t in root.initializers:
            if t.name in used and t.data_type == TensorProto.FLOAT and draw(st.booleans()):
                graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="fuzz")
    model.ir_version = OPSETS[opset]
    if draw(st.integers(0, 2)) == 0:  # describe some intermediate tensors, as exporters often do
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        for g_in, g_out in zip(_all_graphs(inferred.graph), _all_graphs(model.graph)):
            chosen = [v for v in g_in.value_info if draw(st.booleans())]
            g_out.value_info.extend(chosen)
    block_ops, block_nodes = (), ()
    if draw(st.integers(0, 3)) == 0:  # user overrides
        present = sorted({n.op_type for g_ in _all_graphs(model.graph) for n in g_.node})
        block_ops = tuple(draw(st.lists(st.sampled_from(present), max_size=2, unique=True))) if present else ()
        named = sorted({n.name for g_ in _all_graphs(model.graph) for n in g_.node if n.name})
        if named and draw(st.booleans()):
            block_nodes = (f"^{re.escape(draw(st.sampled_from(named)))}$",)
    bounds = {t.name: t.err.b for t in outputs if t.kind == F}
    assert all(t.err.a == 0 for t in outputs if t.kind == F)
    if not keep_io_types and "io-input-as-output-low" in AVOID:
        inputs = {s.name for s in specs}
        kept = [o for o in model.graph.output if o.name not in inputs]
        if kept and len(kept) < len(model.graph.output):
            del model.graph.output[:]
            model.graph.output.extend(kept)
            bounds = {k: v for k, v in bounds.items() if k not in inputs}
        elif not kept:
            keep_io_types = True
    return FuzzCase(
        model, specs, bounds, target, draw(st.integers(0, 2**31 - 1)), root.ops, provider, keep_io_types,
        block_ops, block_nodes,
    )


def _all_graphs(graph: onnx.GraphProto):
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_graphs(attr.g)
            for sub in attr.graphs:
                yield from _all_graphs(sub)


# ---------------------------------------------------------------------------------------- checks


def _run(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray], *, optimize: bool, disabled: Sequence[str] = ()
) -> list[np.ndarray]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # the optimizer fallback above is expected, not worth a log line
    if not optimize:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"],
                                   disabled_optimizers=list(disabled) or None)
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: v for k, v in feeds.items() if k in names})


class GeneratorBug(AssertionError):
    """The generated FP32 model itself is invalid: a bug in this file, not in the converter."""


def check_case(case: FuzzCase, stats: list | None = None) -> str:
    """Convert ``case`` and check everything; returns "converted" or "refused" (a clear user error).

    ``stats``, if given, receives (worst error, tolerance, largest |FP32 value|) per float output:
    how tight the tolerance is."""
    from amp_compiler import convert
    from amp_compiler.errors import AmpUserError
    from amp_compiler.onnx.measure.checks import validate

    optimize = True
    try:
        validate(case.model)
        feeds = case.feeds()
        try:
            reference = _run(case.model, feeds, optimize=True)
        except Exception:
            # onnxruntime's graph optimizer rejects some valid models (e.g. an If on a constant
            # condition whose inlined branch holds a dead Loop reading an outer tensor, which a
            # dead Shape also reads): compare both models unoptimized then
            reference = _run(case.model, feeds, optimize=False)
            optimize = False
    except Exception as exc:  # pragma: no cover - generator problems
        raise GeneratorBug(f"generated model is invalid: {type(exc).__name__}: {exc}") from exc
    try:
        result = convert(case.model, probe=False, **case.options())
    except AmpUserError as exc:
        text = str(exc)
        assert text and "\n" not in text, f"unclear refusal: {text!r}"
        return "refused"
    converted = result.model
    validate(converted)
    runnable = converted
    if case.target == "bf16":
        from amp_compiler.onnx.measure.emulate import emulate_bf16

        runnable = emulate_bf16(converted)
    low_feeds = dict(feeds)
    for v in runnable.graph.input:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT16:
            low_feeds[v.name] = feeds[v.name].astype(np.float16)
    # a CUDA/TensorRT output on the CPU provider: without what only that provider's Casts crash
    got = _run(runnable, low_feeds, optimize=optimize, disabled=result.load_check_skips)
    u = U[case.target]
    for out, ref, val in zip(case.model.graph.output, reference, got):
        assert val.shape == ref.shape, (out.name, val.shape, ref.shape)
        if out.name not in case.bounds:
            assert val.dtype == ref.dtype, (out.name, val.dtype, ref.dtype)
            np.testing.assert_array_equal(val, ref, err_msg=f"non-float output {out.name!r} changed")
            continue
        if case.keep_io_types:
            assert val.dtype == np.float32, (out.name, val.dtype)  # graph outputs keep their type
        else:
            assert val.dtype in (np.float32, np.float16), (out.name, val.dtype)
        tol = SAFETY * u * case.bounds[out.name] + ABS_FLOOR
        err = np.abs(val.astype(np.float64) - ref.astype(np.float64))
        assert np.all(np.isfinite(val)), f"output {out.name!r}: non-finite values"
        worst = float(err.max()) if err.size else 0.0
        assert worst <= tol, f"output {out.name!r}: max error {worst:.3g} > tolerance {tol:.3g}"
        if stats is not None:
            stats.append((worst, tol, float(np.abs(ref).max()) if ref.size else 0.0))
    again = convert(case.model, probe=False, **case.options()).model
    assert again.SerializeToString() == converted.SerializeToString(), "conversion is not deterministic"
    twice = convert(converted, **case.options()).model
    assert twice.SerializeToString() == converted.SerializeToString(), "converting twice changes the model"
    return "converted"
