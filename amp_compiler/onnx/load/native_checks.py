"""onnx's checker and shape inference (both C++) in a child process, while Python works on the model.

Converting a large model spends about a second in each of two C++ calls that hold Python's GIL:
``onnx.checker.check_model`` and ``onnx.shape_inference.infer_shapes``. Neither needs anything but
the serialized model, so for large models :class:`NativeChecks` runs them in a child Python process
(this file, which imports only onnx), on the second core, while the parent does its
own checks and builds the IR. Smaller models call :func:`check` and :func:`infer` in-process.

The child is also a wall: a hostile model that crashed either C++ call would take down only the
child (killed by a signal), and is reported as an invalid model. A child that fails any other way
(it cannot start, exits with an error, answers garbage) says nothing about the model: the work is
then done in-process.

Protocol: the parent writes one JSON header line (the payload lengths) and the payloads (the model to
check, or nothing when there is no check; then the model to infer, or nothing when it is the model
to check) to the child's stdin; the child
writes one JSON line to its stdout: the checker's error (or null) and the inferred types
(:class:`InferredTypes`, or null when inference failed).

This file must import nothing from amp_compiler at its top: the child runs it as a script (the parent's
side, :class:`NativeChecks`, imports the pipes' widening when it starts the child).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import sys
import threading
from collections.abc import Iterator

import onnx
import onnx.checker
import onnx.shape_inference

__all__ = [
    "CHILD_MIN_NODES", "CheckerError", "InferredTypes", "NativeChecks", "check", "infer", "inferred_types",
    "iter_proto_graphs",
]

#: Models with at least this many nodes (main graph) are checked in a child process; below it the
#: child's start (about 0.3 s) costs more than it saves.
CHILD_MIN_NODES = 20_000


@dataclasses.dataclass(frozen=True)
class CheckerError:
    message: str  # the first line of the checker's complaint
    invalid: bool = True  # a validation error (else another refusal: a model over 2 GB, ...)


@dataclasses.dataclass
class GraphTypes:
    name: str
    nodes: int  # how many nodes: with the name, what matches it to the IR's graph
    inputs: list[int]  # per graph input, its entry in InferredTypes.table
    outputs: list[int]
    value_info: dict[str, int]  # per tensor shape inference described, its entry


@dataclasses.dataclass
class InferredTypes:
    """What shape inference found, in the form the conversion applies it: per graph (in
    :func:`iter_proto_graphs` order) the entries of its inputs, outputs and inferred tensors, each
    an index into ``table``, the distinct ValueInfoProtos serialized with their names cleared (a
    100,000-node transformer has a few dozen). ``functions_changed``: inference rewrote a model
    function, and its result must be taken whole."""

    functions_changed: bool
    table: list[bytes]
    graphs: list[GraphTypes]
    # value_info entries that contradict inference: an element type (the model is invalid: one
    # sentence each), or a shape (dropped before inference, as onnxruntime's lenient merge does).
    type_conflicts: list[str] = dataclasses.field(default_factory=list)
    dropped_shapes: list[str] = dataclasses.field(default_factory=list)

    @classmethod
    def of(cls, typed: onnx.ModelProto, original: onnx.ModelProto) -> InferredTypes:
        """Summarize ``typed`` (``original`` after shape inference; no conflicts)."""
        before, after = original.functions, typed.functions
        changed = len(after) != len(before) or any(
            a.SerializeToString() != b.SerializeToString() for a, b in zip(after, before, strict=True)
        )
        index: dict[bytes, int] = {}

        def entry(info: onnx.ValueInfoProto) -> int:
            info.name = ""
            key = info.SerializeToString()
            found = index.get(key)
            if found is None:
                found = index[key] = len(index)
            return found

        graphs = [
            GraphTypes(
                g.name, len(g.node), [entry(i) for i in g.input], [entry(o) for o in g.output],
                {info.name: entry(info) for info in g.value_info},
            )
            for g in iter_proto_graphs(typed.graph)
        ]
        return cls(changed, list(index), graphs)

    def to_json(self) -> dict:
        return {
            "functions_changed": self.functions_changed,
            "table": [base64.b64encode(b).decode() for b in self.table],
            "graphs": [dataclasses.asdict(g) for g in self.graphs],
            "type_conflicts": self.type_conflicts,
            "dropped_shapes": self.dropped_shapes,
        }

    @classmethod
    def from_json(cls, data: dict) -> InferredTypes:
        return cls(
            data["functions_changed"], [base64.b64decode(b) for b in data["table"]],
            [GraphTypes(**g) for g in data["graphs"]], list(data.get("type_conflicts", [])),
            list(data.get("dropped_shapes", [])),
        )


@dataclasses.dataclass
class NativeResult:
    checker_error: CheckerError | None  # None when the model passed
    types: InferredTypes | None  # None when shape inference failed
    crashed: str | None = None  # the child was killed by a signal (which) before answering
    failed: str | None = None  # the child gave no usable answer otherwise (why): redo it in-process


_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def iter_proto_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """A GraphProto and all its subgraphs (If/Loop/Scan bodies, ...), parents first."""
    yield graph
    for node in graph.node:
        attrs = node.attribute
        if not attrs:
            continue
        for attr in attrs:
            kind = attr.type
            if kind == _GRAPH:
                yield from iter_proto_graphs(attr.g)
            elif kind == _GRAPHS:
                for g in attr.graphs:
                    yield from iter_proto_graphs(g)


def _first_line(exc: BaseException) -> str:
    for line in str(exc).strip().splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def check(model: onnx.ModelProto) -> CheckerError | None:
    """onnx's checker: None when ``model`` passes, else its complaint."""
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        return CheckerError(_first_line(exc))
    except ValueError as exc:  # e.g. over 2 GB without external data
        return CheckerError(_first_line(exc), invalid=False)
    return None


def infer(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """``model`` with every intermediate tensor's type inferred, or None when inference fails.
    value_info entries whose shape contradicts inference are replaced by inference's answer."""
    return infer_checked(model)[0]


def _infer(model: onnx.ModelProto, *, strict: bool) -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=strict, data_prop=True)


def infer_checked(model: onnx.ModelProto) -> tuple[onnx.ModelProto | None, list[str], list[str]]:
    """(the inferred model or None, type conflicts, names whose declared shape was dropped).

    Strict inference first: it gives the same types as lenient inference when the model's
    value_info agrees with its ops (every model of the catalog), and refuses when it does not. Only
    then (a second and third run, for such models alone) are the declared entries compared with
    inference on a copy without them: an element type that contradicts it makes the model invalid
    (onnxruntime refuses it too); a shape that contradicts it is dropped (onnxruntime merges
    leniently, preferring inference), and lenient inference runs on the model without it."""
    try:
        return _infer(model, strict=True), [], []
    except (onnx.shape_inference.InferenceError, ValueError) as exc:
        if "existing" not in str(exc):  # not about declared types: lenient inference decides
            return _lenient(model), [], []
    conflicts, stale = _value_info_conflicts(model)
    if conflicts or not stale:
        return _lenient(model), conflicts, []
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    for g in iter_proto_graphs(fixed.graph):
        kept = [v for v in g.value_info if v.name not in stale]
        del g.value_info[:]
        g.value_info.extend(kept)
    return _lenient(fixed), [], sorted(stale)


def _lenient(model: onnx.ModelProto) -> onnx.ModelProto | None:
    try:
        return _infer(model, strict=False)
    except (onnx.shape_inference.InferenceError, ValueError):
        return None


def _value_info_conflicts(model: onnx.ModelProto) -> tuple[list[str], set[str]]:
    """Declared value_info against inference on a copy without it: (a sentence per element type it
    contradicts, the names whose shape it contradicts)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    for g in iter_proto_graphs(bare.graph):
        del g.value_info[:]
    inferred_model = _lenient(bare)
    if inferred_model is None:
        return [], set()
    graphs = list(iter_proto_graphs(model.graph))
    typed = list(iter_proto_graphs(inferred_model.graph))
    if len(graphs) != len(typed):
        return [], set()
    conflicts: list[str] = []
    stale: set[str] = set()
    # each graph against its own inference: a name is a graph's own (an If's two branches may each make
    # a tensor of one name, an int64 in one and a float in the other, as an Optimum merged decoder does)
    for g, t in zip(graphs, typed, strict=True):
        inferred = {v.name: v.type for v in t.value_info}
        producers = {out: node.op_type for node in g.node for out in node.output}
        for v in g.value_info:
            found = inferred.get(v.name)
            if found is None or not (v.type.HasField("tensor_type") and found.HasField("tensor_type")):
                continue
            declared, actual = v.type.tensor_type, found.tensor_type
            if declared.elem_type and actual.elem_type and declared.elem_type != actual.elem_type:
                name = onnx.TensorProto.DataType.Name
                conflicts.append(
                    f"value_info says tensor {v.name!r} is {name(declared.elem_type).lower()}, but its producer "
                    f"{producers.get(v.name, 'node')} makes {name(actual.elem_type).lower()}"
                )
            elif declared.HasField("shape") and actual.HasField("shape") and not _shapes_agree(declared, actual):
                stale.add(v.name)
    return conflicts, stale


def _shapes_agree(declared: onnx.TypeProto.Tensor, inferred: onnx.TypeProto.Tensor) -> bool:
    a, b = declared.shape.dim, inferred.shape.dim
    if len(a) != len(b):
        return False
    return all(
        not (x.HasField("dim_value") and y.HasField("dim_value")) or x.dim_value == y.dim_value
        for x, y in zip(a, b, strict=True)
    )


def inferred_types(model: onnx.ModelProto) -> InferredTypes | None:
    """:func:`infer_checked`, summarized (:class:`InferredTypes`); None when inference fails and
    found no conflict."""
    typed, conflicts, dropped = infer_checked(model)
    if typed is None:
        return InferredTypes(False, [], [], conflicts, dropped) if conflicts else None
    types = InferredTypes.of(typed, model)
    types.type_conflicts, types.dropped_shapes = conflicts, dropped
    return types


class NativeChecks:
    """Both calls in a child process, started at construction; :meth:`result` waits for them."""

    def __init__(self, to_check: onnx.ModelProto | None, to_infer: onnx.ModelProto):
        """``to_check``: the model for onnx's checker (None: no check); ``to_infer``: for shape inference."""
        check_bytes = b"" if to_check is None else to_check.SerializeToString()
        infer_bytes = b"" if to_infer is to_check else to_infer.SerializeToString()
        header = json.dumps({"check": len(check_bytes), "infer": len(infer_bytes)}).encode() + b"\n"
        self._proc = subprocess.Popen(
            child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        from amp_compiler.runtime.pipes import widen_pipes  # here: the child runs this file, importing nothing

        widen_pipes(self._proc)  # the model's bytes cross in fewer round trips
        self._out: list[bytes] = []
        # Writing and reading the pipes release the GIL: the parent's own work goes on meanwhile.
        self._writer = threading.Thread(target=self._write, args=(header, check_bytes, infer_bytes), daemon=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._writer.start()
        self._reader.start()

    def _write(self, *parts: bytes) -> None:
        stdin = self._proc.stdin
        assert stdin is not None  # a pipe
        try:
            for part in parts:
                stdin.write(part)
            stdin.close()
        except OSError:  # the child died: result() reports it
            pass

    def _read(self) -> None:
        stream = self._proc.stdout
        assert stream is not None  # a pipe
        with stream:
            self._out.append(stream.read())

    def cancel(self) -> None:
        """Stop the child (the parent found the model invalid itself)."""
        self._proc.kill()
        self._wait()

    def _wait(self) -> int:
        self._writer.join()
        self._reader.join()
        return self._proc.wait()

    def result(self) -> NativeResult:
        """The child's answer. Killed by a signal (a C++ crash, or the memory killer): ``crashed``.
        Any other failure (an exit status, unreadable output) says nothing about the model:
        ``failed``, and the caller does the work itself."""
        code = self._wait()
        data = self._out[0] if self._out else b""
        if code < 0:
            return NativeResult(None, None, crashed=f"signal {-code}")
        if code:
            return NativeResult(None, None, failed=f"exit status {code}")
        try:
            answer = json.loads(data)
            error, types = answer["checker_error"], answer["types"]
            return NativeResult(error and CheckerError(**error), types and InferredTypes.from_json(types))
        except (ValueError, TypeError, KeyError) as exc:
            return NativeResult(None, None, failed=f"unreadable answer ({type(exc).__name__})")


def child_command() -> list[str]:
    """The child's command line: this file run as ``__main__`` with nothing put on its sys.path
    (neither this package's folder, whose module names could shadow others, nor the current
    directory). ``python -P`` would do the same from Python 3.11 on."""
    boot = "import runpy, sys; sys.path.pop(0); runpy.run_path(sys.argv[1], run_name='__main__')"
    return [sys.executable, "-c", boot, __file__]


def _child() -> None:
    header = json.loads(sys.stdin.buffer.readline())
    to_check = to_infer = None
    if header["check"]:
        to_check = onnx.ModelProto()
        to_check.ParseFromString(sys.stdin.buffer.read(header["check"]))
    if header["infer"]:
        to_infer = onnx.ModelProto()
        to_infer.ParseFromString(sys.stdin.buffer.read(header["infer"]))
    else:
        to_infer = to_check
    assert to_infer is not None  # the parent sends a model to infer, or one to check
    error = check(to_check) if to_check is not None else None
    types = inferred_types(to_infer)
    answer = {"checker_error": error and dataclasses.asdict(error), "types": types and types.to_json()}
    sys.stdout.buffer.write(json.dumps(answer).encode() + b"\n")
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child()
