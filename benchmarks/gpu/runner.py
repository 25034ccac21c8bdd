"""Steps measured in worker processes, so that no variant can take the whole run down with it.

:func:`run_steps` starts :mod:`benchmarks.gpu.worker` with the steps still to measure and reads its
reports. A step that runs past ``step_timeout_s`` (or the run's deadline) is killed and becomes a
``timeout`` row; a worker that dies while measuring a step (a segfault in a provider, the device's
memory gone) makes that step a ``crashed`` row with the end of the worker's log; a worker that
exits after a failure (:data:`benchmarks.gpu.worker.RESTART`) or dies is replaced by a fresh one for
the remaining steps. Every step given comes back as exactly one row.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from benchmarks.gpu.rows import Row, Step
from benchmarks.gpu.settings import Settings
from benchmarks.gpu.worker import RESTART

__all__ = ["WORKER", "run_steps"]

ROOT = Path(__file__).resolve().parents[2]
WORKER = [sys.executable, "-m", "benchmarks.gpu.worker"]
_GRACE_S = 60.0  # past the deadline, a step still running is given this long


def _tail(log: Path, lines: int = 6) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])[-800:]


def _exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _messages(proc: subprocess.Popen, limit: Callable[[], float]) -> Iterator[dict | None]:
    """The worker's protocol messages; None once ``limit()`` (seconds left) runs out; ends at EOF."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    buffer = b""
    try:
        while True:
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line)
            left = limit()
            if left <= 0:
                yield None
                return
            if not selector.select(min(left, 5.0)):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            buffer += chunk
    finally:
        selector.close()


class _StepClock:
    """Seconds left to the step being measured: its time limit, or the run's deadline (plus grace)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.started = time.monotonic()

    def restart(self) -> None:
        self.started = time.monotonic()

    def left(self) -> float:
        left = self.started + self.settings.step_timeout_s - time.monotonic()
        if self.settings.deadline is not None:
            left = min(left, self.settings.deadline + _GRACE_S - time.time())
        return left


def run_steps(steps: list[Step], settings: Settings, *, log: Path, command: list[str] | None = None,
              say: Callable[[str], None] = lambda _: None) -> Iterator[Row]:
    """Measure ``steps`` in worker processes; yields one row per step, in order, as each is done.
    ``log``: the workers' stderr (appended). ``command``: the worker's command line (tests)."""
    pending = list(steps)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
           "PYTHONUNBUFFERED": "1"}
    while pending:
        job = json.dumps({"settings": settings.to_dict(), "steps": [vars(s) for s in pending]})
        with log.open("ab") as err:
            proc = subprocess.Popen(command or WORKER, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    cwd=ROOT, env=env, start_new_session=True)
        assert proc.stdin is not None
        try:
            proc.stdin.write(job.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        current: int | None = None
        clock = _StepClock(settings)
        done = 0
        timed_out = False
        for message in _messages(proc, clock.left):
            if message is None:
                timed_out = True
                break
            if "start" in message:
                current = int(message["start"])
                clock.restart()
                say(f"{pending[current].part} {pending[current].model} {pending[current].variant}")
            elif "row" in message:
                yield Row.from_dict(message["row"])
                done, current = done + 1, None
        if timed_out:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if done < len(pending):
            step = pending[done]
            if timed_out:
                yield Row.failed(step, "timeout", f"over {settings.step_timeout_s:.0f} s, or past the run's deadline")
                done += 1
            elif current is not None or proc.returncode != RESTART:
                # It died measuring this step, or before starting it: either way the step is the
                # worker's last word, and the next worker starts after it.
                yield Row.failed(step, "crashed", f"the worker died ({_exit(proc.returncode)}): {_tail(log)}")
                done += 1
        pending = pending[done:]
