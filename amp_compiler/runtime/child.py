"""The child process that runs a model in onnxruntime for :mod:`amp_compiler.runtime.runner`, and their protocol.

The child limits its own address space (``RLIMIT_AS``) before it imports numpy or onnxruntime,
asks the kernel to kill it when its parent dies, then answers requests on stdin until stdin closes.
Every message, both ways, is one JSON header line followed by the raw bytes of the arrays the
header lists (dtype, shape, byte count; strings travel in the header): nothing is pickled, so a
child that a hostile model took over cannot make its parent run code.

Requests and answers (``ok`` false: ``kind`` is ``memory``, ``unsupported`` or ``error``, with ``message``):

    {"op": "load", "bytes": N, "provider": E, "basic": B, "threads": T, "prepack": K, "data_folder": F,
     "disabled_optimizers": [...]}      + N bytes of ModelProto (its external data in F; optimizers not run)
                                        -> {"ok", "session", "inputs", "input_types", "outputs", "providers"}
    {"op": "load", "path": P, "provider": E}  -> the same (P: a model file, its data beside it)
    {"op": "run", "session": S, "names": [...], "arrays": [...]} + bytes -> {"ok", "arrays": [...]} + bytes
    {"op": "close", "session": S}                          -> {"ok": true}
    {"op": "fold", "sessions": [S...], "fold": K, "names": [...], "arrays": [...]} + bytes -> {"ok": true}
    {"op": "statistics", "fold": K}                        -> {"ok", "statistics": {name: [STAT_FIELDS...]}}
    {"op": "compare", "reference": S, "converted": S2, "fold": K, "pairs": [[R, C]...], "outputs": [[R, C]...],
     "reference_feeds": [...], "converted_feeds": [...], "half": [...], "names": [...], "arrays": [...]} + bytes
                                                           -> {"ok", "arrays": [...]} + bytes

``fold`` runs a chain of sessions (each takes its inputs from the feeds and the earlier sessions'
outputs, :func:`run_chain`), folds every float output into the running statistics ``K``
(:func:`fold_array`) and drops each tensor once no later session needs it: nothing goes back but
``ok``. ``statistics`` answers ``K``'s statistics and forgets them. This is how calibration observes
ranges at the cost of running the model: only statistics cross the pipe. ``compare`` runs an FP32
model and a converted one, each with every tensor exposed, and folds each pair of tensors into the
running error sums ``K`` (:func:`compare_runs`, :data:`ERROR_FIELDS`; ``statistics`` answers them
too): only the sums and the graph outputs asked for cross the pipe (how ``--tolerance`` measures).

The child's first line is ``{"ready": true}`` once onnxruntime is imported. Session options are
the same in the child and in-process (:func:`session_options`): onnxruntime's own log silenced
(its errors reach the caller as exceptions), default graph optimisations, the CPU provider unless
a load names another of :data:`PROVIDERS` (``providers`` in the answer says which ones started).

This file must import nothing from amp_compiler (nor numpy at the top): the child runs it as a script.
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, BinaryIO

__all__ = [
    "ERROR_FIELDS", "PROVIDERS", "RAW_KINDS", "STAT_FIELDS", "array_header", "compare_runs", "error_kind", "error_sums",
    "first_line", "fold_array", "run_chain", "run_options", "session_facts", "session_options",
]

#: The execution providers a load may ask for.
PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider")

#: Kinds of numpy arrays that travel as raw bytes; object (string) arrays travel in the header.
RAW_KINDS = frozenset("biufc")
#: onnxruntime's words for an allocation that failed (the arena under RLIMIT_AS, or the system).
MEMORY_WORDS = ("Failed to allocate memory", "bad_alloc", "std::bad_alloc", "Cannot allocate memory")

#: The running statistics of one tensor (:func:`fold_array`), in this order: its smallest and largest
#: finite value, its largest magnitude (inf included, NaN ignored), its non-zero values (NaN excluded),
#: those of them below half FP16's smallest subnormal (2^-25: flushed to zero), below FP16's smallest
#: normal (2^-14), all its values, the sum of its finite values' squares (its energy), and the sum of
#: the squared errors FP16 storage gives its values below 2^-14 (flushed or subnormal: the error FP16's
#: exponent range adds to its rounding). ``sqrt(lost / energy)`` is what flushing moves the tensor by,
#: relative to its own L2 norm.
STAT_FIELDS = ("min", "max", "absmax", "nonzero", "flushed", "subnormal", "count", "energy", "lost")
_FLUSHED, _SUBNORMAL = 2.0**-25, 2.0**-14

#: The running error sums of a tensor against its FP32 reference (:func:`error_sums`), in this order:
#: the sums of squared errors, of squared finite reference values, of squared converted and of the
#: products where both are finite, the largest absolute error, the reference's smallest and largest
#: finite value, the values not finite where the reference is, those other than the reference's where
#: it is not finite (a NaN matches nothing), all its values. The fields of
#: :class:`amp_compiler.core.tensor_error.ErrorStats`, which computes them the same way.
ERROR_FIELDS = ("diff2", "ref2", "got2", "dot", "max_abs", "ref_min", "ref_max", "nonfinite", "unmatched", "count")
_CHUNK = 1 << 15  # values per pass of error_sums: its float64 temporaries (768 kB) stay in the cache


def session_facts(session: Any) -> dict[str, list[str]]:
    """A session's input names and types (``tensor(float16)``), output names and started providers."""
    return {
        "inputs": [i.name for i in session.get_inputs()],
        "input_types": [i.type for i in session.get_inputs()],
        "outputs": [o.name for o in session.get_outputs()],
        "providers": list(session.get_providers()),
    }


def session_options(
    ort: Any, *, threads: int = 0, basic: bool = False, data_folder: str | None = None, prepack: bool = True,
    chained: bool = False,
) -> Any:
    """onnxruntime session options for every session amp-compiler makes: its log silenced (level 4,
    fatal only: errors come back as exceptions, not coloured lines on stderr), default optimisations,
    or with ``basic`` only onnxruntime's basic ones (constant folding, redundant node removal). Models
    with every intermediate tensor exposed run with ``basic``: onnxruntime 1.32's extended fusions
    change results when intermediates are graph outputs (a per-channel DequantizeLinear -> MatMul
    whose DQ output is exposed computes one column wrong), and the FP32 reference must be the model's
    semantics. ``prepack``: False skips the kernels' weight prepacking (done once every graph
    transformation ran, a copy of each MatMul weight in the kernel's own layout; half of GPT-2's
    load time on the CPU provider). ``chained``: a session run as one of many in a chain
    (:func:`run_chain`): no memory arena (each session's arena would keep its own peak: freed tensors
    go back at once) and no spinning thread pool (the idle pools of the other sessions would spin
    against the one running, and against the making of the next: 10-200 ms a session on 2 cores)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    if basic:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if chained:
        opts.enable_cpu_mem_arena = False
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if data_folder is not None:  # a model given as bytes reads its external data from there
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", data_folder)
    return opts


def run_options(ort: Any) -> Any:
    """Run options with onnxruntime's log silenced, as :func:`session_options`."""
    opts = ort.RunOptions()
    opts.log_severity_level = 4
    return opts


def array_header(arrays: list[Any]) -> list[dict]:
    """The header entries describing ``arrays`` (numpy arrays), in order."""
    out = []
    for a in arrays:
        if a.dtype.kind in RAW_KINDS:
            out.append({"dtype": a.dtype.str, "shape": list(a.shape), "nbytes": int(a.nbytes)})
        else:  # strings (onnxruntime gives object arrays of str)
            out.append({"strings": [str(s) for s in a.ravel().tolist()], "shape": list(a.shape)})
    return out


def fold_array(np: Any, stats: dict[str, list], name: str, a: Any) -> None:
    """Fold the float array ``a`` into ``stats[name]`` (:data:`STAT_FIELDS`; created on first use). Exact:
    min/max/absmax are values of ``a`` and the thresholds are powers of two, so folding in ``a``'s
    own type (float16 in float32) gives what folding in float64 gives; the two sums of squares are
    float64 sums of float32 dot products of chunks (relative error below 1e-6 a chunk). Temporaries:
    one array's size and a mask of a quarter of it (a float32 array's)."""
    _merge(stats, name, _array_stats(np, a))


def _array_stats(np: Any, a: Any) -> list:
    """One array's :data:`STAT_FIELDS` (see :func:`fold_array`)."""
    if a.size == 0:  # seen, no values
        return [float("inf"), float("-inf"), 0.0, 0, 0, 0, 0, 0.0, 0.0]
    if a.dtype.itemsize < 4:
        a = a.astype(np.float32)
    a = a.ravel()
    lo, hi = a.min(), a.max()
    if np.isfinite(lo) and np.isfinite(hi):  # no NaN (it would propagate) and no inf
        absmax = max(-float(lo), float(hi))
        # |x| < t as the bits of |x| (sign cleared) below t's: positive floats order as their bits
        uint = np.dtype(f"u{a.dtype.itemsize}")
        mag = a.view(uint) & uint.type(np.iinfo(uint).max >> 1)
        nonzero = int(np.count_nonzero(mag))
        zeros = a.size - nonzero
        # 0 < |x| < t as |x|'s bits minus one below t's minus one: a zero wraps around to the largest
        mag -= uint.type(1)
        below = mag < np.array(_SUBNORMAL, a.dtype).view(uint) - uint.type(1)
        subnormal = int(np.count_nonzero(below))
        # the flushed are among the subnormal: counted there (most tensors have few)
        small, flushed = a[:0], 0
        if subnormal:
            small = a[below]
            flushed = int(np.count_nonzero(mag[below] < np.array(_FLUSHED, a.dtype).view(uint) - uint.type(1)))
        del mag, below
        energy = _sum_squares(np, a)
    else:
        finite = a[np.isfinite(a)]
        lo, hi = (finite.min(), finite.max()) if finite.size else (np.inf, -np.inf)
        del finite
        mag = np.abs(a[~np.isnan(a)])
        absmax = float(mag.max()) if mag.size else 0.0
        nonzero = int(np.count_nonzero(mag))
        zeros = mag.size - nonzero
        flushed = int(np.count_nonzero(mag < _FLUSHED)) - zeros
        subnormal = int(np.count_nonzero(mag < _SUBNORMAL)) - zeros
        small = mag[mag < _SUBNORMAL]
        energy = _sum_squares(np, mag[np.isfinite(mag)])
        del mag
    lost = _storage_error(np, small) if small.size else 0.0
    return [float(lo), float(hi), absmax, nonzero, flushed, subnormal, int(a.size), energy, lost]


def _storage_error(np: Any, small: Any) -> float:
    """The sum of the squared errors FP16 storage gives ``small`` (values below 2^-14): FP16 holds them
    on the grid of multiples of 2^-24, rounding to nearest even, as ``rint`` does on ``small * 2^24``
    (exact: a power of two; numpy's own float16 cast takes 0.5 us a subnormal)."""
    scaled = small * small.dtype.type(2.0**24)
    scaled -= np.rint(scaled)
    return _sum_squares(np, scaled) * 2.0**-48


#: Values per float32 dot product in :func:`_sum_squares`.
_CHUNK = 1 << 16


def _sum_squares(np: Any, a: Any) -> float:
    """The sum of the squares of the flat float array ``a``: float64 sums of dot products of chunks (no
    copy of ``a``; float64 arrays are dotted in float64). A square beyond float32's range is inf."""
    total = 0.0
    with np.errstate(over="ignore"):
        for start in range(0, a.size, _CHUNK):
            chunk = a[start:start + _CHUNK]
            total += float(np.dot(chunk, chunk))
    return total


def _merge(stats: dict[str, list], name: str, new: list) -> None:
    old = stats.get(name)
    if old is None:
        stats[name] = new
    elif new[6]:
        stats[name] = [min(old[0], new[0]), max(old[1], new[1]), max(old[2], new[2]), old[3] + new[3],
                       old[4] + new[4], old[5] + new[5], old[6] + new[6], old[7] + new[7], old[8] + new[8]]


def run_chain(np: Any, sessions: list[Any], feeds: dict[str, Any], options: Any, stats: dict[str, list]) -> None:
    """Run onnxruntime ``sessions`` in order, each fed from ``feeds`` and the earlier ones' outputs;
    fold every float output into ``stats`` (:func:`fold_array`) and drop each value once no later
    session takes it, so that one session's outputs and the values between sessions are all it holds."""
    wanted = [{i.name for i in s.get_inputs()} for s in sessions]
    later: set[str] = set()
    needed_after = []
    for names in reversed(wanted):
        needed_after.append(set(later))
        later |= names
    needed_after.reverse()
    values = dict(feeds)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:  # numpy's passes release the GIL
        for session, names, keep in zip(sessions, wanted, needed_after, strict=True):
            outputs = dict(zip((o.name for o in session.get_outputs()),
                               session.run(None, {n: values[n] for n in names if n in values}, options), strict=True))
            floats = [n for n, v in outputs.items() if np.asarray(v).dtype.kind == "f"]
            arrays = [np.asarray(outputs[n]) for n in floats]
            for name, new in zip(floats, pool.map(partial(_array_stats, np), arrays), strict=True):
                _merge(stats, name, new)
            arrays.clear()
            values.update((n, v) for n, v in outputs.items() if n in keep)
            outputs.clear()  # nothing of this session's is held but what later sessions take
            for name in [n for n in values if n not in keep]:
                del values[name]


def error_sums(np: Any, reference: Any, got: Any) -> list | None:
    """One (reference, converted) pair's :data:`ERROR_FIELDS` (None when their shapes differ), in float64
    as ``ErrorStats.add`` computes them, a chunk at a time (equal up to the order of the sums). The
    chunks stay in the CPU's cache across their passes; the sums are einsum's, not a BLAS dot (whose
    threads, on a loaded machine, made each of them 8x slower)."""
    if reference.shape != got.shape:
        return None
    r_all, g_all = reference.ravel(), got.ravel()
    out = [0.0, 0.0, 0.0, 0.0, 0.0, float("inf"), float("-inf"), 0, 0, int(r_all.size)]
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, r_all.size, _CHUNK):
            r_own = r_all[lo:lo + _CHUNK]
            r, g = r_own.astype(np.float64), g_all[lo:lo + _CHUNK].astype(np.float64)
            d = g - r
            ref2, diff2 = float(np.einsum("i,i->", r, r)), float(np.einsum("i,i->", d, d))
            if ref2 < float("inf") and diff2 < float("inf"):  # all finite (float32 squares cannot overflow)
                part = [diff2, ref2, float(np.einsum("i,i->", g, g)), float(np.einsum("i,i->", r, g)),
                        max(float(d.max()), -float(d.min())), float(r_own.min()), float(r_own.max()), 0, 0]
            else:
                finite = np.isfinite(r)
                d = np.where(finite, d, np.where(r == g, 0.0, np.inf))
                both = finite & np.isfinite(g)
                fin = r[finite]
                part = [float(np.sum(d * d)), float(np.sum(np.where(finite, r * r, 0.0))),
                        float(np.sum(np.where(both, g * g, 0.0))), float(np.sum(np.where(both, r * g, 0.0))),
                        float(np.max(np.abs(d))), float(fin.min()) if fin.size else float("inf"),
                        float(fin.max()) if fin.size else float("-inf"),
                        int(np.count_nonzero(finite & ~np.isfinite(g))), int(np.count_nonzero(~finite & (r != g)))]
            out = _add_sums(out, [*part, 0])
    return out


def _add_sums(old: list, new: list) -> list:
    """Two :data:`ERROR_FIELDS` lists as one."""
    return [old[0] + new[0], old[1] + new[1], old[2] + new[2], old[3] + new[3], max(old[4], new[4]),
            min(old[5], new[5]), max(old[6], new[6]), old[7] + new[7], old[8] + new[8], old[9] + new[9]]


def compare_runs(
    np: Any, reference: Any, converted: Any, feeds: tuple[dict, dict], pairs: list, outputs: list, options: Any,
    sums: dict[str, list],
) -> list[Any]:
    """Run the ``reference`` and the ``converted`` sessions (their ``feeds``), fold each float pair
    ``(reference name, converted name)`` of ``pairs`` into ``sums`` (by the reference's name:
    :func:`error_sums`, added over runs), and return the pairs ``outputs`` (their reference's
    values, then the converted ones'). Each converted tensor is dropped once folded."""
    ref = dict(zip((o.name for o in reference.get_outputs()), reference.run(None, feeds[0], options), strict=True))
    got = dict(zip((o.name for o in converted.get_outputs()), converted.run(None, feeds[1], options), strict=True))
    kept = [ref.get(r) for r, _ in outputs] + [got.get(c) for _, c in outputs]
    for r_name, c_name in pairs:
        r, g = np.asarray(ref.get(r_name)), np.asarray(got.pop(c_name, None))
        if r.dtype.kind != "f" or g.dtype.kind != "f":
            continue
        new = error_sums(np, r, g)  # None: shapes differ, nothing added (but the tensor was seen)
        old = sums.get(r_name, [0.0, 0.0, 0.0, 0.0, 0.0, float("inf"), float("-inf"), 0, 0, 0])
        sums[r_name] = _add_sums(old, new) if new is not None else old
    return [np.asarray(a) if a is not None else np.zeros(0, np.float32) for a in kept]


def write_message(stream: BinaryIO, header: dict, arrays: list[Any] = ()) -> None:  # type: ignore[assignment]
    """One message: ``header`` (with ``arrays`` described under "arrays") as a JSON line, then the bytes."""
    if arrays:
        header = {**header, "arrays": array_header(list(arrays))}
    stream.write(json.dumps(header).encode() + b"\n")
    for a in arrays:
        if a.dtype.kind in RAW_KINDS and a.nbytes:
            stream.write(memoryview(a if a.flags.c_contiguous else a.copy()).cast("B"))
    stream.flush()


def error_kind(exc: BaseException) -> str:
    """``memory`` for an allocation failure, ``unsupported`` for an op the provider has no kernel
    for (onnxruntime's NOT_IMPLEMENTED: raised once every graph optimizer ran), else ``error``."""
    if isinstance(exc, MemoryError):
        return "memory"
    text = str(exc)
    if any(w in text for w in MEMORY_WORDS):
        return "memory"
    return "unsupported" if type(exc).__name__ == "NotImplemented" or "NOT_IMPLEMENTED" in text else "error"


def first_line(exc: BaseException, limit: int = 400) -> str:
    """The first non-empty line of an exception's text (its type's name when it has none)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return type(exc).__name__


def _read_exact(stream: BinaryIO, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = stream.readinto(view[got:])  # type: ignore[attr-defined]
        if not k:
            raise EOFError("the parent closed the pipe")
        got += k
    return buf


def _read_arrays(np: Any, stream: BinaryIO, entries: list[dict]) -> list[Any]:
    out = []
    for e in entries:
        if "strings" in e:
            out.append(np.array(e["strings"], dtype=object).reshape(e["shape"]))
        else:
            out.append(np.frombuffer(_read_exact(stream, e["nbytes"]), dtype=np.dtype(e["dtype"])).reshape(e["shape"]))
    return out


def _limit_memory(limit: int) -> None:
    import resource

    if limit > 0:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _die_with_parent() -> None:
    """Linux: be killed when the parent dies (a parent killed by SIGKILL closes no pipe in time
    for a long onnxruntime call to notice)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(limit: int) -> None:
    _limit_memory(limit)
    _die_with_parent()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    import numpy as np
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # load-time warnings too
    write_message(stdout, {"ready": True, "onnxruntime": ort.__version__})
    sessions: dict[int, Any] = {}
    folds: dict[int, dict[str, list]] = {}  # running statistics (fold_array), per fold request's key
    next_id = 0
    while True:
        line = stdin.readline()
        if not line:
            return
        request = json.loads(line)
        op = request["op"]
        try:
            if op == "load":
                source = request["path"] if "path" in request else bytes(_read_exact(stdin, request["bytes"]))
                provider = request.get("provider", PROVIDERS[0])
                if provider not in PROVIDERS:
                    raise ValueError(f"unknown execution provider {provider!r}")
                options = session_options(
                    ort, basic=bool(request.get("basic", False)), threads=int(request.get("threads", 0)),
                    data_folder=request.get("data_folder"), prepack=bool(request.get("prepack", True)),
                    chained=bool(request.get("chained", False)),
                )
                disabled = [str(name) for name in request.get("disabled_optimizers", [])]
                session = ort.InferenceSession(source, options, providers=[provider],
                                               disabled_optimizers=disabled or None)
                del source
                next_id += 1
                sessions[next_id] = session
                write_message(stdout, {"ok": True, "session": next_id, **session_facts(session)})
            elif op == "run":
                arrays = _read_arrays(np, stdin, request.get("arrays", []))
                feeds = dict(zip(request["names"], arrays, strict=True))
                outputs = sessions[request["session"]].run(None, feeds, run_options(ort))
                del feeds, arrays
                write_message(stdout, {"ok": True}, [np.asarray(o) for o in outputs])
                del outputs
            elif op == "close":
                sessions.pop(request["session"], None)
                write_message(stdout, {"ok": True})
            elif op == "fold":
                arrays = _read_arrays(np, stdin, request.get("arrays", []))
                feeds = dict(zip(request["names"], arrays, strict=True))
                del arrays
                chain = [sessions[int(s)] for s in request["sessions"]]
                run_chain(np, chain, feeds, run_options(ort), folds.setdefault(int(request["fold"]), {}))
                del feeds
                write_message(stdout, {"ok": True})
            elif op == "compare":
                arrays = _read_arrays(np, stdin, request.get("arrays", []))
                both = dict(zip(request["names"], arrays, strict=True))
                del arrays
                half = set(request.get("half", []))  # the converted model's FP16 inputs (I/O types not kept)
                pair = ({n: both[n] for n in request["reference_feeds"]},
                        {n: both[n].astype(np.float16) if n in half else both[n] for n in request["converted_feeds"]})
                del both
                kept = compare_runs(np, sessions[int(request["reference"])], sessions[int(request["converted"])], pair,
                                    request["pairs"], request["outputs"], run_options(ort),
                                    folds.setdefault(int(request["fold"]), {}))
                del pair
                write_message(stdout, {"ok": True}, kept)
                del kept
            elif op == "statistics":
                write_message(stdout, {"ok": True, "statistics": folds.pop(int(request["fold"]), {})})
            else:
                write_message(stdout, {"ok": False, "kind": "error", "message": f"unknown request {op!r}"})
        except EOFError:
            return
        except Exception as exc:  # onnxruntime refused the model or failed running it; MemoryError too
            write_message(stdout, {"ok": False, "kind": error_kind(exc), "message": first_line(exc)})


if __name__ == "__main__":
    _serve(int(sys.argv[-1]))  # python -c BOOT this_file MEMORY
