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
    {"op": "statistics", "fold": K}                        -> {"ok", "statistics": {name: [child_folds.STAT_FIELDS...]}}
    {"op": "compare", "reference": [S...], "converted": [S...], "fold": K, "pairs": [[R, C]...], "outputs": [[R, C]...],
     "reference_feeds": [...], "converted_feeds": [...], "half": [...], "names": [...], "arrays": [...]} + bytes
                                                           -> {"ok", "arrays": [...]} + bytes

``fold`` runs a chain of sessions (each takes its inputs from the feeds and the earlier sessions'
outputs, :func:`run_chain`), folds every float output into the running statistics ``K``
(:func:`child_folds.fold_array`) and drops each tensor once no later session needs it: nothing goes back but
``ok``. ``statistics`` answers ``K``'s statistics and forgets them. This is how calibration observes
ranges at the cost of running the model: only statistics cross the pipe. ``compare`` runs the chains
of an FP32 model and of a converted one, each with every tensor exposed, interleaved, and folds each
pair of tensors into the running error sums ``K`` as soon as both halves are out (:func:`compare_chains`,
:data:`child_folds.ERROR_FIELDS`; ``statistics`` answers them too): only the sums and the graph outputs
asked for cross the pipe (how ``--tolerance`` measures).

The child's first line is ``{"ready": true}`` once onnxruntime is imported. Session options are
the same in the child and in-process (:func:`session_options`): onnxruntime's own log silenced
(its errors reach the caller as exceptions), default graph optimisations, the CPU provider unless
a load names another of :data:`PROVIDERS` (``providers`` in the answer says which ones started).

This file must import nothing from amp_compiler but the statistics it folds into
(:mod:`amp_compiler.runtime.child_folds`, loaded from its path beside this one), nor numpy at the
top: the child runs it as a script.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

__all__ = [
    "PROVIDERS", "RAW_KINDS", "array_header", "chain_outputs", "compare_chains", "compare_inputs", "error_kind",
    "first_line", "run_chain", "run_options", "session_facts", "session_options", "share_arena",
]


def _beside(name: str) -> Any:
    """The module in ``name``.py beside this file, loaded from its path: run as a script, the child has
    no package to import it from (nothing of amp_compiler is on its path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __package__:  # imported as amp_compiler.runtime.child
    from amp_compiler.runtime import child_folds
else:  # run as a script by the runner
    child_folds = _beside("child_folds")

#: The execution providers a load may ask for.
PROVIDERS = ("CPUExecutionProvider", "CUDAExecutionProvider")

#: Kinds of numpy arrays that travel as raw bytes; object (string) arrays travel in the header.
RAW_KINDS = frozenset("biufc")
#: onnxruntime's words for an allocation that failed (the arena under RLIMIT_AS, or the system).
MEMORY_WORDS = ("Failed to allocate memory", "bad_alloc", "std::bad_alloc", "Cannot allocate memory")



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
    chained: bool = False, shared_arena: bool = False,
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
    (:func:`run_chain`): no spinning thread pool (the idle pools of the other sessions would spin
    against the one running, and against the making of the next: 10-200 ms a session on 2 cores), and
    no memory arena of its own (each session's arena would keep its own peak: ppocr-v4-det's 23
    pieces, 1.5 GB against 0.45 GB): with ``shared_arena``, the arena of onnxruntime's environment that
    every chained session shares (:func:`share_arena`: one peak, the largest piece's; ppocr-v4-det's
    chain runs 15-20% faster than with malloc's fresh pages), else none (freed tensors go back at once)."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    if basic:
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    if threads:
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
    if chained:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if shared_arena:
            opts.add_session_config_entry("session.use_env_allocators", "1")
        else:
            opts.enable_cpu_mem_arena = False
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    if data_folder is not None:  # a model given as bytes reads its external data from there
        opts.add_session_config_entry("session.model_external_initializers_file_folder_path", data_folder)
    return opts


def share_arena(ort: Any) -> bool:
    """Register the CPU memory arena that sessions made with ``shared_arena`` share (once per process:
    the child's; growing by what is asked, not by doubling); False where onnxruntime refuses."""
    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    try:
        ort.create_and_register_allocator(info, ort.OrtArenaCfg({"arena_extend_strategy": 1}))  # kSameAsRequested
    except Exception:  # onnxruntime's own exception types; its sessions then have no arena
        return False
    return True


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


def chain_outputs(sessions: list[Any], feeds: dict[str, Any], options: Any) -> Iterator[dict[str, Any]]:
    """Run onnxruntime ``sessions`` in order, each fed from ``feeds`` and the earlier ones' outputs, and
    yield each one's outputs (by name); a value is dropped once no later session takes it, so that the
    values between sessions and the outputs the caller keeps are all that is held."""
    wanted = [{i.name for i in s.get_inputs()} for s in sessions]
    later: set[str] = set()
    needed_after = []
    for names in reversed(wanted):
        needed_after.append(set(later))
        later |= names
    needed_after.reverse()
    values = dict(feeds)
    for session, names, keep in zip(sessions, wanted, needed_after, strict=True):
        outputs = dict(zip((o.name for o in session.get_outputs()),
                           session.run(None, {n: values[n] for n in names if n in values}, options), strict=True))
        values.update((n, v) for n, v in outputs.items() if n in keep)
        for name in [n for n in values if n not in keep]:
            del values[name]
        yield outputs
        outputs.clear()  # nothing of this session's is held but what later sessions take


def run_chain(np: Any, sessions: list[Any], feeds: dict[str, Any], options: Any, stats: dict[str, list]) -> None:
    """Run the chain ``sessions`` (:func:`chain_outputs`) and fold every float output into ``stats``
    (:func:`child_folds.fold_array`), a session's outputs on one other thread while the next session runs:
    two sessions' outputs and the values between sessions are all it holds. One thread folds a whole
    session's outputs, one array after the other: the fold is bound by memory, and more threads (one
    task per array, as many as cores) only contended with onnxruntime's own for it (ppocr-v4-det's
    chain: 1.36 s against 1.44-1.52 s for 4 samples on 2 cores)."""
    with ThreadPoolExecutor(max_workers=1) as pool:  # numpy's passes release the GIL
        pending = None
        for outputs in chain_outputs(sessions, feeds, options):
            arrays = [(n, a) for n, a in ((n, np.asarray(v)) for n, v in outputs.items()) if a.dtype.kind == "f"]
            if pending is not None:
                pending.result()  # stats are the folding thread's alone
            pending = pool.submit(_fold_all, np, stats, arrays)
            del arrays
        if pending is not None:
            pending.result()


def _fold_all(np: Any, stats: dict[str, list], arrays: list[tuple[str, Any]]) -> None:
    """Fold ``arrays`` (name, array) into ``stats`` (:func:`child_folds.fold_array`), dropping each once folded."""
    while arrays:
        name, array = arrays.pop(0)
        child_folds.fold_array(np, stats, name, array)
        del array


def compare_inputs(
    np: Any, arrays: Mapping[str, Any], reference: list[str], converted: list[str], half: list[str],
) -> tuple[dict, dict]:
    """The feeds of :func:`compare_chains`: the ``reference`` chain's and the ``converted`` one's, from
    ``arrays``, those ``half`` names rounded to FP16 (a model converted without keeping its I/O types)."""
    return ({n: np.asarray(arrays[n]) for n in reference},
            {n: np.asarray(arrays[n]).astype(np.float16) if n in half else np.asarray(arrays[n]) for n in converted})


def compare_chains(
    np: Any, reference: list[Any], converted: list[Any], feeds: tuple[dict, dict], pairs: list, outputs: list,
    options: Any, sums: dict[str, list],
) -> list[Any]:
    """Run the chains ``reference`` and ``converted`` (their ``feeds``; :func:`chain_outputs`) interleaved,
    fold each float pair ``(reference name, converted name)`` of ``pairs`` into ``sums`` (by the reference's
    name: :func:`child_folds.error_sums`, added over runs), and return the pairs ``outputs`` (their
    reference's values, then the converted ones'). A converted session runs once the reference sessions
    that give its pairs' other halves have run; a reference tensor is held until its converted half
    comes, a converted one not at all: each chain's values between sessions, one session's outputs and
    the reference halves still waiting are all that is held."""
    partner = {c: r for r, c in pairs}
    made_in = {o.name: k for k, s in enumerate(reference) for o in s.get_outputs()}
    after = [max((made_in.get(partner[o.name], -1) for o in s.get_outputs() if o.name in partner), default=-1)
             for s in converted]
    wanted_r, wanted_c = {r for r, _ in outputs}, {c for _, c in outputs}
    kept_r = {n: v for n, v in feeds[0].items() if n in wanted_r}
    kept_c = {n: v for n, v in feeds[1].items() if n in wanted_c}
    halves = set(partner.values())
    waiting: dict[str, Any] = {}  # reference halves of pairs, until their converted halves come
    steps = chain_outputs(converted, feeds[1], options)
    done = 0
    for k, ref in enumerate(itertools.chain(chain_outputs(reference, feeds[0], options), [{}])):
        kept_r.update((n, v) for n, v in ref.items() if n in wanted_r)
        waiting.update((n, v) for n, v in ref.items() if n in halves)
        ref.clear()
        while done < len(converted) and (after[done] <= k or k == len(reference)):
            for c_name, value in next(steps).items():
                if c_name in wanted_c:
                    kept_c[c_name] = value
                if c_name in partner:
                    _fold_pair(np, sums, partner[c_name], waiting.pop(partner[c_name], None), value)
            done += 1
    return [np.asarray(a) if a is not None else np.zeros(0, np.float32)
            for a in [*(kept_r.get(r) for r, _ in outputs), *(kept_c.get(c) for _, c in outputs)]]


def _fold_pair(np: Any, sums: dict[str, list], name: str, reference: Any, got: Any) -> None:
    """Add the pair's :func:`child_folds.error_sums` to ``sums[name]`` (a pair of shapes that differ is seen
    and adds nothing; a half that is missing or not float, not even seen)."""
    r, g = np.asarray(reference), np.asarray(got)
    if r.dtype.kind != "f" or g.dtype.kind != "f":
        return
    new = child_folds.error_sums(np, r, g)
    old = sums.get(name, [0.0, 0.0, 0.0, 0.0, 0.0, float("inf"), float("-inf"), 0, 0, 0])
    sums[name] = child_folds.add_sums(old, new) if new is not None else old


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


def _read_bytes(stream: BinaryIO, n: int) -> bytes:
    """``n`` bytes as one ``bytes`` object (a model, for onnxruntime), read into it: no copy of a buffer."""
    data = stream.read(n)  # a buffered stream reads until it has n bytes or the pipe closes
    if len(data) != n:
        raise EOFError("the parent closed the pipe")
    return data


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


def _exit(stdout: BinaryIO) -> None:
    """End the child at once: its answers are all written, and nothing it holds needs tearing down (its
    sessions' memory, onnxruntime's arena, the interpreter's modules go with the process; destroying
    them one by one took ppocr-v4-det's calibration child 0.06-0.11 s, against 0.03 s, which the
    parent, waiting for the exit, paid)."""
    stdout.flush()
    os._exit(0)


def _serve(limit: int) -> None:
    _limit_memory(limit)
    _die_with_parent()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    import numpy as np
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # load-time warnings too
    shared = share_arena(ort)
    write_message(stdout, {"ready": True, "onnxruntime": ort.__version__})
    sessions: dict[int, Any] = {}
    folds: dict[int, dict[str, list]] = {}  # running statistics (fold_array), per fold request's key
    next_id = 0
    while True:
        line = stdin.readline()
        if not line:  # the parent closed the pipe: done
            _exit(stdout)
        request = json.loads(line)
        op = request["op"]
        try:
            if op == "load":
                source = request["path"] if "path" in request else _read_bytes(stdin, request["bytes"])
                provider = request.get("provider", PROVIDERS[0])
                if provider not in PROVIDERS:
                    raise ValueError(f"unknown execution provider {provider!r}")
                options = session_options(
                    ort, basic=bool(request.get("basic", False)), threads=int(request.get("threads", 0)),
                    data_folder=request.get("data_folder"), prepack=bool(request.get("prepack", True)),
                    chained=bool(request.get("chained", False)), shared_arena=shared,
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
                pair = compare_inputs(np, both, request["reference_feeds"], request["converted_feeds"],
                                      request.get("half", []))
                del both
                kept = compare_chains(np, [sessions[int(s)] for s in request["reference"]],
                                      [sessions[int(s)] for s in request["converted"]], pair, request["pairs"],
                                      request["outputs"], run_options(ort), folds.setdefault(int(request["fold"]), {}))
                del pair
                write_message(stdout, {"ok": True}, kept)
                del kept
            elif op == "statistics":
                write_message(stdout, {"ok": True, "statistics": folds.pop(int(request["fold"]), {})})
            else:
                write_message(stdout, {"ok": False, "kind": "error", "message": f"unknown request {op!r}"})
        except EOFError:
            _exit(stdout)
        except Exception as exc:  # onnxruntime refused the model or failed running it; MemoryError too
            write_message(stdout, {"ok": False, "kind": error_kind(exc), "message": first_line(exc)})


if __name__ == "__main__":
    _serve(int(sys.argv[-1]))  # python -c BOOT this_file MEMORY
