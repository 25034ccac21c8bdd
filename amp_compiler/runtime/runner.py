"""Running a model in onnxruntime: the one place amp-compiler does it, in a child process with a
time and memory budget (or, for trusted models only, in this process:
:mod:`amp_compiler.runtime.in_process`; the interface both implement: :mod:`amp_compiler.runtime.session`).

A model is untrusted input: a few hundred bytes can loop for ever (a Loop with a huge trip count),
allocate tens of GB (ConstantOfShape), or crash onnxruntime itself. :class:`ChildRunner` runs every
session in one child process (:mod:`amp_compiler.runtime.child`) whose address space is limited
(``RLIMIT_AS``, set by the child before it imports onnxruntime) and whose every load and run must
answer within ``RunBudget.seconds``; an overrun is a :class:`~amp_compiler.errors.RunBudgetError`,
a crash a :class:`~amp_compiler.errors.ModelCrashError`, onnxruntime's refusal a
:class:`~amp_compiler.errors.ModelRunError`: never a hung or dead tool. :class:`InProcessRunner`
runs sessions here, without limits, for models the caller trusts (the test suite's own).

    with ChildRunner(RunBudget(seconds=60)) as runner:
        session = runner.load(model)           # an onnx.ModelProto, or a model file's path
        outputs = session.run({"x": x})        # graph outputs, in order

The calibration, the ``--tolerance`` refinement, the report's accuracy and the CLI's load check
of a converted model all run through a :class:`Runner`; public functions that take one default to
a :class:`ChildRunner` with the default budget.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from amp_compiler import runtime
from amp_compiler.errors import (
    ModelCrashError,
    ModelRefusedError,
    ModelRunError,
    ModelUnsupportedError,
    RunBudgetError,
)
from amp_compiler.runtime import child as runner_child
from amp_compiler.runtime import child_folds
from amp_compiler.runtime.budget import RunBudget
from amp_compiler.runtime.in_process import InProcessRunner
from amp_compiler.runtime.pipes import widen_pipes
from amp_compiler.runtime.session import CPU, Runner, Session, check_provider, compare_feeds
from amp_compiler.sizes import format_bytes

__all__ = ["ChildRunner", "InProcessRunner", "Runner", "Session", "default_runner"]


#: How long the child may take to start (import onnxruntime), whatever the budget.
_START_SECONDS = 60.0
_EXIT_SECONDS = 2.0  #: how long a closed child may take to exit before it is killed


class _ChildSession(Session):
    def __init__(self, runner: ChildRunner, sid: int, facts: Mapping[str, list[str]]):
        self._runner, self._sid = runner, sid
        self._set_facts(facts)

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        names = list(feeds)
        return self._runner._request(
            {"op": "run", "session": self._sid, "names": names}, [feeds[n] for n in names], doing="running"
        )[1]

    def close(self) -> None:
        if self._runner._alive():
            self._runner._request({"op": "close", "session": self._sid}, doing="closing")


class ChildRunner(Runner):
    """Sessions in one child process with a :class:`RunBudget` (started at once, so that importing
    onnxruntime overlaps the caller's own work). Every load and run must answer within
    ``budget.seconds`` (else the child is killed); the child's address space is ``budget.memory``."""

    def __init__(self, budget: RunBudget | None = None):
        runtime.require("run the model")
        self.budget = budget or RunBudget()
        env = dict(os.environ, MALLOC_ARENA_MAX="2")  # each thread's malloc arena reserves 64 MB of address space
        self._proc = subprocess.Popen(
            child_command(self.budget.memory), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, bufsize=0, env=env,
        )
        widen_pipes(self._proc)
        self._pending = bytearray()
        self._ready = False
        self.onnxruntime_version = ""  # known once the child answered
        self._failed: ModelRunError | None = None

    # --- the public side

    def load(
        self, model: onnx.ModelProto | str | os.PathLike, *, provider: str = CPU, basic: bool = False, threads: int = 0,
        data_folder: str | os.PathLike | None = None, prepack: bool = True, disabled: Sequence[str] = (),
        chained: bool = False,
    ) -> Session:
        check_provider(provider)
        if isinstance(model, onnx.ModelProto):
            payload = [model.SerializeToString()]  # once: ByteSize would encode the whole model too
            header: dict[str, Any] = {"op": "load", "bytes": len(payload[0])}
        else:
            header, payload = {"op": "load", "path": os.path.abspath(model)}, []
        header.update(provider=provider, basic=basic, threads=threads, prepack=prepack, chained=chained)
        if data_folder is not None:
            header["data_folder"] = os.path.abspath(data_folder)
        if disabled:
            header["disabled_optimizers"] = [str(name) for name in disabled]
        answer, _ = self._request(header, raw=payload, doing="loading")
        return _ChildSession(self, answer["session"], answer)

    def load_chain(
        self, models: Iterable[onnx.ModelProto], *, basic: bool = False, chained: bool = False,
        data_folder: str | os.PathLike | None = None, prepack: bool = True,
    ) -> list[Session]:
        """As :meth:`Runner.load_chain`, each model serialized while the child makes the session of the one
        before (serializing is most of the parent's part of a load, making the session the child's)."""
        folder = {"data_folder": os.path.abspath(data_folder)} if data_folder is not None else {}
        sessions: list[Session] = []
        sent: float | None = None  # the deadline of a load sent whose answer is not read yet
        try:
            for model in models:
                payload = model.SerializeToString()
                if sent is not None:
                    deadline, sent = sent, None
                    sessions.append(self._loaded(deadline))
                with self._guard("loading"):
                    sent = self._send({"op": "load", "bytes": len(payload), "provider": CPU, "basic": basic,
                                       "chained": chained, "prepack": prepack, **folder}, raw=[payload])
                del payload
            if sent is not None:
                deadline, sent = sent, None
                sessions.append(self._loaded(deadline))
        except BaseException as exc:
            if sent is not None and self._alive() and isinstance(exc, Exception):  # the protocol stays in step
                with contextlib.suppress(ModelRunError):
                    sessions.append(self._loaded(sent))
            elif sent is not None:  # interrupted: the child is stopped, not waited for
                self._kill()
            for session in sessions:
                session.close()
            raise
        return sessions

    def _loaded(self, deadline: float) -> Session:
        with self._guard("loading"):
            answer, _ = self._receive(deadline, "loading")
        return _ChildSession(self, answer["session"], answer)

    def fold(self, sessions: list[Session], feeds: Mapping[str, np.ndarray], key: int) -> None:
        if not all(isinstance(s, _ChildSession) and s._runner is self for s in sessions):
            raise ValueError("fold runs sessions of this runner only")
        names = list(feeds)
        self._request(
            {"op": "fold", "sessions": [s._sid for s in sessions], "fold": key, "names": names},  # type: ignore[attr-defined]
            [np.asarray(feeds[n]) for n in names], doing="running",
        )

    def statistics(self, key: int) -> dict[str, list[float]]:
        answer, _ = self._request({"op": "statistics", "fold": key}, doing="running")
        return _checked_statistics(answer.get("statistics"))

    def compare(
        self, reference: Sequence[Session], converted: Sequence[Session], feeds: Mapping[str, np.ndarray],
        pairs: Sequence[tuple[str, str]], outputs: Sequence[tuple[str, str]], key: int,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if not all(isinstance(s, _ChildSession) and s._runner is self for s in (*reference, *converted)):
            raise ValueError("compare runs sessions of this runner only")
        ref_names, conv_names, half = compare_feeds(reference, converted, feeds)
        names = list(dict.fromkeys([*ref_names, *conv_names]))
        _, kept = self._request(
            {"op": "compare", "reference": [s._sid for s in reference],  # type: ignore[attr-defined]
             "converted": [s._sid for s in converted], "fold": key,  # type: ignore[attr-defined]
             "pairs": [list(p) for p in pairs], "outputs": [list(p) for p in outputs],
             "reference_feeds": ref_names, "converted_feeds": conv_names, "half": half, "names": names},
            [np.asarray(feeds[n]) for n in names], doing="running",
        )
        if len(kept) != 2 * len(outputs):
            raise ModelCrashError("onnxruntime's process answered something that is not outputs", how="protocol")
        return kept[: len(outputs)], kept[len(outputs):]

    def errors(self, key: int) -> dict[str, list[float]]:
        answer, _ = self._request({"op": "statistics", "fold": key}, doing="running")
        return _checked_statistics(answer.get("statistics"), len(child_folds.ERROR_FIELDS))

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is not None:  # an error or a signal: stop the child at once
            self._kill()
        self.close()

    @property
    def alive(self) -> bool:
        """False once a load or run went over the time budget or crashed the child: every later
        request raises that error again (start another runner to go on)."""
        return self._alive()

    def close(self) -> None:
        """End the child (its stdin closed, it exits at once), reaped on a thread (:func:`_reap`): the caller no
        longer waits for the kernel to free its memory (ViT-B's calibration child: 0.12 s, ppocr-v4-det's 0.03 s)."""
        if self._proc.poll() is None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()  # type: ignore[union-attr]
            threading.Thread(target=_reap, args=(self._proc,), name="amp-compiler-reap", daemon=True).start()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()

    # --- the protocol

    def _alive(self) -> bool:
        return self._failed is None and self._proc.poll() is None

    def _request(
        self, header: dict, arrays: list[np.ndarray] = (), *, raw: list[bytes] = (), doing: str  # type: ignore[assignment]
    ) -> tuple[dict, list[np.ndarray]]:
        with self._guard(doing):
            return self._receive(self._send(header, arrays, raw), doing)

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """Raise the runner's failure again; within, a child past its time budget is killed (a
        :class:`RunBudgetError`), one whose pipe closed is a crash: for every later request too."""
        if self._failed is not None:
            raise self._failed
        try:
            yield
        except _Timeout:
            self._kill()
            self._failed = RunBudgetError(
                f"{doing} the model in onnxruntime took longer than its time budget of "
                f"{self.budget.seconds:g} s; stopped",
                option="run_seconds",
            )
            raise self._failed from None
        except _Ended:
            self._failed = self._ended(doing)
            raise self._failed from None

    def _send(self, header: dict, arrays: Sequence[np.ndarray] = (), raw: Sequence[bytes] = ()) -> float:
        """Write one request; the time by which its answer must come."""
        self._wait_ready()
        deadline = time.monotonic() + self.budget.seconds
        arrays = [np.ascontiguousarray(a) for a in arrays]
        message = dict(header)
        if arrays:
            message["arrays"] = runner_child.array_header(arrays)
        self._write(json.dumps(message).encode() + b"\n", deadline)
        for chunk in raw:
            self._write(chunk, deadline)
        for a in arrays:
            if a.dtype.kind in runner_child.RAW_KINDS and a.nbytes:
                self._write(a.data.cast("B"), deadline)
        return deadline

    def _receive(self, deadline: float, doing: str) -> tuple[dict, list[np.ndarray]]:
        """The answer to the request sent, its arrays; onnxruntime's refusal as a :class:`ModelRunError`."""
        answer = self._read_header(deadline)
        if not answer.get("ok"):
            message_text = str(answer.get("message", ""))
            if answer.get("kind") == "memory":
                raise RunBudgetError(
                    f"{doing} the model in onnxruntime needed more than its memory budget of "
                    f"{format_bytes(self.budget.memory)} ({message_text})",
                    option="run_memory",
                )
            error: type[ModelRunError] = ModelRunError
            if answer.get("kind") == "unsupported":
                error = ModelUnsupportedError
            elif doing == "loading":
                error = ModelRefusedError
            verb = {"loading": "load", "running": "run"}.get(doing, doing)
            raise error(f"onnxruntime could not {verb} the model: {message_text}")
        return answer, self._read_arrays(answer.get("arrays", []), deadline)

    def _wait_ready(self) -> None:
        if self._ready:
            return
        try:
            hello = self._read_header(time.monotonic() + max(_START_SECONDS, self.budget.seconds))
        except _Ended:
            code = self._proc.wait()
            if code > 0 and self.budget.memory < 2**30:
                raise RunBudgetError(
                    f"onnxruntime cannot start within a memory budget of {format_bytes(self.budget.memory)}",
                    option="run_memory",
                ) from None
            raise RuntimeError(f"the onnxruntime child process did not start ({_status(code)})") from None
        self.onnxruntime_version = str(hello.get("onnxruntime", ""))
        self._ready = True

    def _ended(self, doing: str) -> ModelRunError:
        code = self._proc.wait()
        if code < 0:
            name = _signal_name(-code)
            hint = " (the system's out-of-memory killer?)" if -code == signal.SIGKILL else ""
            return ModelCrashError(f"onnxruntime crashed ({name}{hint}) {doing} the model", how=name)
        return ModelCrashError(f"onnxruntime's process ended ({_status(code)}) {doing} the model", how=_status(code))

    def _kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()

    def _wait_for(self, fd: int, event: int, deadline: float) -> None:
        poller = select.poll()
        poller.register(fd, event)
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(remaining * 1000):
            raise _Timeout

    def _write(self, data: bytes | memoryview, deadline: float) -> None:
        stream = self._proc.stdin
        assert stream is not None  # a pipe
        view = memoryview(data).cast("B")
        while len(view):
            self._wait_for(stream.fileno(), select.POLLOUT, deadline)
            try:
                k = stream.write(view)
            except (BrokenPipeError, ConnectionResetError):
                raise _Ended from None
            view = view[k or 0:]

    def _fill(self, deadline: float) -> None:
        stream = self._proc.stdout
        assert stream is not None  # a pipe
        self._wait_for(stream.fileno(), select.POLLIN, deadline)
        chunk = stream.read(1 << 20)
        if not chunk:
            raise _Ended
        self._pending += chunk

    def _read_header(self, deadline: float) -> dict:
        while b"\n" not in self._pending:
            if len(self._pending) > 1 << 26:  # a header is small, even with string outputs
                raise _Ended
            self._fill(deadline)
        line, _, rest = bytes(self._pending).partition(b"\n")
        self._pending = bytearray(rest)
        try:
            answer = json.loads(line)
        except ValueError:
            raise _Ended from None
        if not isinstance(answer, dict):
            raise _Ended
        return answer

    def _read_exact(self, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        got = min(n, len(self._pending))
        buf[:got] = self._pending[:got]
        del self._pending[:got]
        stream = self._proc.stdout
        assert stream is not None  # a pipe
        view = memoryview(buf)
        while got < n:
            self._wait_for(stream.fileno(), select.POLLIN, deadline)
            k = os.readv(stream.fileno(), [view[got:]])
            if not k:
                raise _Ended
            got += k
        return buf

    def _read_arrays(self, entries: list, deadline: float) -> list[np.ndarray]:
        """The answer's arrays, each entry checked (a numeric dtype, a shape that holds its bytes, all
        together no more than the child could have held) before anything is allocated."""
        out: list[np.ndarray] = []
        total = 0
        for e in entries:
            shape = tuple(int(d) for d in e["shape"])
            if any(d < 0 for d in shape):
                raise _Ended
            if "strings" in e:
                strings = e["strings"]
                if len(strings) != math.prod(shape):
                    raise _Ended
                out.append(np.array(strings, dtype=object).reshape(shape))
                continue
            dtype = np.dtype(str(e["dtype"]))
            nbytes = int(e["nbytes"])
            total += nbytes
            if dtype.kind not in runner_child.RAW_KINDS or nbytes != math.prod(shape) * dtype.itemsize:
                raise _Ended
            if total > self.budget.memory:
                raise _Ended
            out.append(np.frombuffer(self._read_exact(nbytes, deadline), dtype=dtype).reshape(shape))
        return out


def _checked_statistics(raw: object, fields: int = len(child_folds.STAT_FIELDS)) -> dict[str, list[float]]:
    """The child's statistics, checked (a name to ``fields`` numbers each: :data:`child_folds.STAT_FIELDS`'s
    by default): a child that answers anything else has left the protocol (:class:`ModelCrashError`)."""
    ok = isinstance(raw, dict) and all(
        isinstance(k, str) and isinstance(v, list) and len(v) == fields
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
        for k, v in raw.items()
    )
    if not ok or not isinstance(raw, dict):
        raise ModelCrashError("onnxruntime's process answered something that is not statistics", how="protocol")
    return {k: [float(x) for x in v] for k, v in raw.items()}


class _Timeout(Exception):
    """The child did not answer within the budget."""


class _Ended(Exception):
    """The child's pipe closed, or it answered something that is not the protocol."""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _status(code: int) -> str:
    return f"killed by {_signal_name(-code)}" if code < 0 else f"exit status {code}"


def child_command(memory: int) -> list[str]:
    """The child's command line: :mod:`amp_compiler.runtime.child` run as a script, nothing put on
    its sys.path (as :func:`amp_compiler.onnx.load.native_checks.child_command` does)."""
    boot = "import runpy, sys; sys.path.pop(0); runpy.run_path(sys.argv[1], run_name='__main__')"
    return [sys.executable, "-c", boot, runner_child.__file__, str(memory)]


def _reap(proc: subprocess.Popen) -> None:
    """Wait for the closed child ``proc`` to exit; kill it if it has not in :data:`_EXIT_SECONDS` (a hung call)."""
    try:
        proc.wait(timeout=_EXIT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def default_runner(runner: Runner | None) -> tuple[Runner, bool]:
    """``runner``, or a new :class:`ChildRunner` with the default budget; and whether the caller made
    it (and must close it)."""
    return (runner, False) if runner is not None else (ChildRunner(), True)
