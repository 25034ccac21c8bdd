"""One step of the ONNX and TensorRT parts: make the variant, run it on the device, fill its row.

ONNX (:func:`onnx_step`): the variant's file (:mod:`benchmarks.gpu.variants`), an onnxruntime
session on the provider (:mod:`benchmarks.gpu.sessions`: latency at each batch, memory, the nodes
off the provider), its outputs on the entry's inputs against FP32 on the same device, and amp-
compiler's CPU emulation of the same file against FP32 on the CPU (:mod:`benchmarks.gpu.accuracy`).
TensorRT (:func:`tensorrt_step`): an engine from the same file (:mod:`benchmarks.gpu.tensorrt`):
build time, latency, accuracy against the FP32 model's strongly typed engine.

References (FP32 on the CPU, FP32 on the device, each variant's emulated outputs) are kept as
``.npz`` files in the model's work folder, so a worker that starts again after a crash reuses them.
"""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np

from benchmarks.gpu import accuracy, sessions
from benchmarks.gpu.cases import Case, at_batch
from benchmarks.gpu.rows import Row, Step
from benchmarks.gpu.settings import Settings
from benchmarks.gpu.variants import NotApplicable, Unavailable, produce

__all__ = ["onnx_step", "tensorrt_step"]


def _load(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"o{i}"] for i in range(len(data.files))]


def _saved(path: Path, make) -> list[np.ndarray]:
    """The arrays saved at ``path``, else ``make()``'s, saved there."""
    if path.exists():
        return _load(path)
    arrays = make()
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **{f"o{i}": a for i, a in enumerate(arrays)})
    tmp.replace(path)
    return arrays


def cpu_reference(case: Case, folder: Path) -> list[np.ndarray]:
    """FP32 on onnxruntime's CPU provider."""
    def make() -> list[np.ndarray]:
        session = sessions.make_session(case.path, "cpu")
        return sessions.run_outputs(session, case.feeds)

    return _saved(folder / "fp32.cpu.npz", make)


def device_reference(case: Case, folder: Path, provider: str) -> list[np.ndarray]:
    """FP32 on the provider."""
    def make() -> list[np.ndarray]:
        session = sessions.make_session(case.path, provider)
        return sessions.run_outputs(session, case.feeds)

    return _saved(folder / f"fp32.{provider}.npz", make)


def _variant_file(step: Step, case: Case, settings: Settings, folder: Path, row: Row, *, reuse: bool = False
                  ) -> Path | None:
    """The variant's file, made now (``reuse``: unless an earlier step made it); None when the row
    is finished (skipped, unavailable or failed)."""
    made = folder / f"{step.variant}.onnx"
    if reuse and step.variant != "fp32" and made.exists():
        return made
    try:
        path, seconds, note = produce(step.variant, case, settings.provider, folder)
    except NotApplicable as exc:
        row.status, row.error = "skipped", str(exc)
        return None
    except Unavailable as exc:
        row.status, row.error = "unavailable", str(exc)
        return None
    except Exception as exc:  # noqa: BLE001 - a tool that fails is a row
        row.status, row.error = "failed", f"conversion: {_line(exc)}"
        return None
    row.seconds, row.note = (seconds if step.variant != "fp32" else None), note
    row.size_mb = path.stat().st_size / 1e6
    return path


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def onnx_step(step: Step, case: Case, settings: Settings, folder: Path) -> Row:
    row = Row(step.part, step.model, step.variant)
    path = _variant_file(step, case, settings, folder, row)
    if path is None:
        return row
    provider = settings.provider
    try:
        gc.collect()
        before, how = sessions.device_memory(provider)
        session = sessions.make_session(path, provider)
        row.providers = list(session.get_providers())
        row.latency = sessions.latency(session, case.feeds, provider, settings.batches, settings.warmup,
                                       settings.repeats)
        after, how = sessions.device_memory(provider)
        row.memory_bytes = after - before if after is not None and before is not None else None
        row.memory_how = how
        outputs = sessions.run_outputs(session, case.feeds)
        del session
        gc.collect()
        row.placement = sessions.placement(path, provider, case.feeds)
    except Exception as exc:  # noqa: BLE001 - does not load or run on the device: a row
        row.status, row.error = "failed", f"on {provider}: {_line(exc)}"
        return row
    try:
        cpu = cpu_reference(case, folder)
        if step.variant == "fp32":
            _saved(folder / f"fp32.{provider}.npz", lambda: outputs)  # the other variants' reference
            row.accuracy_device = accuracy.worst(cpu, outputs)  # FP32 on the device against the CPU
            row.note = (row.note + "; " if row.note else "") + "accuracy: the device's FP32 against the CPU's"
            return row
        row.accuracy_device = accuracy.worst(device_reference(case, folder, provider), outputs)
        emulated = _saved(folder / f"{step.variant}.emulated.npz", lambda: accuracy.emulated_outputs(path, case.feeds))
        row.accuracy_emulated = accuracy.worst(cpu, emulated)
        row.emulator_vs_device = accuracy.worst(emulated, outputs)
    except Exception as exc:  # noqa: BLE001 - the timings stand; the accuracy's failure is said
        row.error = f"accuracy not measured: {_line(exc)}"
    return row


# ------------------------------------------------------------------------------------ TensorRT


def _profile(case: Case, path: Path, batches: tuple[int, ...]) -> tuple[dict, dict[int, dict], list[str]]:
    """The engine's optimization profile, the feeds (in the model's input types) at each batch size
    it covers, and the model's output names in order: read from the ONNX file, which need not load
    on any onnxruntime provider here (a BF16 graph does not on the CPU)."""
    import onnx

    from models.deployment import feeds_for

    model = onnx.load(str(path), load_external_data=False)
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    shapes = {i.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim]
              for i in inputs}
    typed = feeds_for(model, {k: v for k, v in case.feeds.items() if k in shapes})
    by_batch = {}
    for batch in batches:
        fed = at_batch(typed, batch, shapes)
        if not isinstance(fed, str):
            by_batch[batch] = fed
    if not by_batch:
        raise RuntimeError("no batch size the model takes")
    low, high = by_batch[min(by_batch)], by_batch[max(by_batch)]
    profile = {name: (low[name].shape, high[name].shape, high[name].shape) for name in low}
    return profile, by_batch, [o.name for o in model.graph.output]


def tensorrt_step(step: Step, case: Case, settings: Settings, folder: Path) -> Row:
    """``step.variant`` is ``strong:<variant>`` (a strongly typed engine of that variant's file) or
    ``fp16-flag:fp32`` (weak typing's FP16 flag on the FP32 model)."""
    from benchmarks.gpu.tensorrt import Engine, build_engine, tensorrt_module

    kind, _, variant = step.variant.partition(":")
    row = Row(step.part, step.model, step.variant)
    try:
        trt = tensorrt_module()
    except Unavailable as exc:
        row.status, row.error = "unavailable", str(exc)
        return row
    source = _variant_file(Step("onnx", step.model, variant), case, settings, folder, row, reuse=True)
    if source is None:
        return row
    try:
        profile, by_batch, names = _profile(case, source, settings.batches)
        plan, row.seconds = build_engine(source, profile, fp16=kind == "fp16-flag", trt=trt)
        row.note = f"TensorRT {trt.__version__}, " + ("strongly typed" if kind == "strong" else "weak typing, BuilderFlag.FP16")
        engine = Engine(plan, trt)
        row.latency = [engine.latency(by_batch[b], b, settings.warmup, settings.repeats) if b in by_batch
                       else _no_batch(b) for b in settings.batches]
        by_name = engine.run(_typed_like(by_batch, case))
        outputs = [by_name[n] for n in names]
    except Unavailable as exc:
        row.status, row.error = "unavailable", str(exc)
        return row
    except Exception as exc:  # noqa: BLE001 - TensorRT refusing a model is a row
        row.status, row.error = "failed", f"TensorRT: {_line(exc)}"
        return row
    if step.variant == "strong:fp32":
        _saved(folder / "fp32.tensorrt.npz", lambda: outputs)
        row.accuracy_device = accuracy.worst(cpu_reference(case, folder), outputs)
        row.note += "; accuracy: the engine's FP32 against onnxruntime CPU's"
        return row
    reference = folder / "fp32.tensorrt.npz"
    if reference.exists():
        row.accuracy_device = accuracy.worst(_load(reference), outputs)
    else:
        row.error = "accuracy not measured: the FP32 engine did not run"
    if variant != "fp32":
        emulated = _saved(folder / f"{variant}.emulated.npz", lambda: accuracy.emulated_outputs(source, case.feeds))
        row.accuracy_emulated = accuracy.worst(cpu_reference(case, folder), emulated)
        row.emulator_vs_device = accuracy.worst(emulated, outputs)
    return row


def _typed_like(by_batch: dict[int, dict], case: Case) -> dict:
    """The entry's own inputs (its batch) in the types of the feeds ``_profile`` made."""
    some = next(iter(by_batch.values()))
    return {k: v.astype(some[k].dtype) if k in some else v for k, v in case.feeds.items() if k in some}


def _no_batch(batch: int):
    from benchmarks.gpu.rows import Timing

    return Timing(batch, note="the model's batch dimension is fixed to another size")
