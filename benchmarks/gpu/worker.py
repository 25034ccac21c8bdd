"""The worker process: measures a list of steps and reports each as it goes (run by
:mod:`benchmarks.gpu.runner`, never by hand).

    python -m benchmarks.gpu.worker  < {"settings": {...}, "steps": [{"part", "model", "variant"}, ...]}

Protocol on the original stdout, one JSON object per line: ``{"start": i}`` when step ``i`` begins,
``{"row": {...}}`` when it is measured. Everything else the libraries print goes to stderr (the
parent's log). After a step that failed on a GPU the worker exits (status 3), so the next step starts
in a fresh process with a clean device context (a failed conversion, or a failure on the CPU
provider, leaves no device context behind: the worker goes on); a model whose FP32 file cannot be built fails all of its steps at once instead
of being built again for each.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu.rows import Row, Step
from benchmarks.gpu.settings import Settings

__all__ = ["main"]

RESTART = 3  # exit status: a step failed, the rest need a fresh process


def _warm_device(provider: str) -> Any:
    """A session of a one-node model on the provider, so that the device context exists before any
    step's memory baseline is read (it would otherwise count against the first variant)."""
    if provider == "cpu":
        return None
    import onnx

    from benchmarks.gpu.sessions import make_session

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "warm",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"amp-gpu-warm-{os.getpid()}.onnx"
    # IR 10, opset 17: what onnxruntime 1.31 reads (onnx 1.23 would write IR 14 by default).
    onnx.save(onnx.helper.make_model(graph, ir_version=10, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(path))
    try:
        return make_session(path, "cuda")
    except Exception:  # noqa: BLE001 - each step then says what is wrong with the device
        return None
    finally:
        path.unlink(missing_ok=True)


def _run(step: Step, settings: Settings, cases: dict[str, Any]) -> Row:
    from benchmarks.gpu import measure
    from benchmarks.gpu.cases import load_case

    if step.part.startswith("fx-"):
        from benchmarks.gpu.fx import fx_step

        return fx_step(step, settings)
    folder = Path(settings.workdir) / step.model
    case = cases.get(step.model)
    if case is None:
        case = cases[step.model] = load_case(step.model, folder)
    if step.part == "tensorrt":
        return measure.tensorrt_step(step, case, settings, folder)
    return measure.onnx_step(step, case, settings, folder)


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what libraries print (C code included) goes to stderr
    job = json.loads(sys.stdin.read())
    settings = Settings.from_dict(job["settings"])
    steps = [Step(**s) for s in job["steps"]]

    def emit(message: dict) -> None:
        protocol.write(json.dumps(message) + "\n")

    warm = _warm_device(settings.provider)
    cases: dict[str, Any] = {}
    broken: dict[str, str] = {}  # model -> why its FP32 file could not be built
    for i, step in enumerate(steps):
        if settings.deadline is not None and time.time() > settings.deadline:
            emit({"start": i})
            emit({"row": Row.failed(step, "not run", "the run's deadline passed first").to_dict()})
            continue
        emit({"start": i})
        if step.model in broken:
            row = Row.failed(step, "failed", broken[step.model])
        else:
            try:
                row = _run(step, settings, cases)
            except Exception as exc:  # noqa: BLE001 - the model itself could not be built
                text = str(exc).strip().splitlines()
                broken[step.model] = f"model: {type(exc).__name__}: {text[0][:300] if text else ''}"
                row = Row.failed(step, "failed", broken[step.model])
        emit({"row": row.to_dict()})
        touched_device = settings.provider != "cpu" and not row.error.startswith("conversion:")
        if row.status == "failed" and touched_device and step.model not in broken and i + 1 < len(steps):
            return RESTART
    del warm
    return 0


if __name__ == "__main__":
    sys.exit(main())
