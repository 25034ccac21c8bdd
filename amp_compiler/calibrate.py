"""Calibration: observed value ranges of every tensor, from runs of the FP32 model on sample inputs.

Samples come from ``--calibration-data``: an ``.npz`` keyed by graph input name (one sample), or a
folder of such files (one sample each, in name order). They are checked against the model's inputs
(names, dtypes, ranks and fixed dims) before anything runs. Statistics are streamed: each run's
tensors are folded into running min/max/counts and dropped, so memory holds one run's activations.

:func:`run_intermediates` runs a model with every float tensor of its main graph exposed as an
output; the ``--tolerance`` refinement uses it to compare converted and FP32 tensors.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx.shape_inference

from amp_compiler.dtypes import FLOAT_TYPES
from amp_compiler.errors import AmpUserError, OptionError
from amp_compiler.report.model import TensorRange
from amp_compiler.targets import Provider

FP16_SMALLEST_SUBNORMAL = 2.0**-24
FP16_SMALLEST_NORMAL = 2.0**-14


class CalibrationDataError(AmpUserError):
    """Calibration data that is missing, unreadable or does not match the model's inputs."""


def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that must be fed (initializers listed as inputs are optional)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _check_sample(sample: dict[str, np.ndarray], model: onnx.ModelProto, origin: str) -> None:
    inputs = {i.name: i for i in model_inputs(model)}
    optional = {i.name for i in model.graph.input} - set(inputs)
    for name in sample:
        if name not in inputs and name not in optional:
            raise CalibrationDataError(
                f"{origin}: {name!r} is not an input of the model (inputs: {', '.join(inputs)})"
            )
    for name, info in inputs.items():
        if name not in sample:
            raise CalibrationDataError(f"{origin}: no array for the model input {name!r}")
        array = sample[name]
        tt = info.type.tensor_type
        expected = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if array.dtype != expected:
            raise CalibrationDataError(
                f"{origin}: input {name!r} is {array.dtype}, the model expects {expected}"
            )
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim]
            bad = len(dims) != array.ndim or any(
                d is not None and d != a for d, a in zip(dims, array.shape, strict=True)
            )
            if bad:
                shown = "x".join("?" if d is None else str(d) for d in dims) or "scalar"
                raise CalibrationDataError(
                    f"{origin}: input {name!r} has shape {'x'.join(map(str, array.shape)) or 'scalar'}, "
                    f"the model expects {shown}"
                )


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError) as exc:
        raise CalibrationDataError(f"{path}: not a readable .npz file ({exc})") from None


def sample_files(path: str | Path) -> list[Path]:
    """The .npz files of a calibration path (a file or a folder of files)."""
    p = Path(path)
    if not p.exists():
        raise CalibrationDataError(f"{p}: no such file or folder")
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.suffix == ".npz" and f.is_file())
        if not files:
            raise CalibrationDataError(f"{p}: the folder holds no .npz files")
        return files
    if p.suffix != ".npz":
        raise CalibrationDataError(f"{p}: calibration data must be an .npz file or a folder of them")
    return [p]


def load_samples(path: str | Path, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """All samples of a calibration path, each checked against the model's inputs."""
    samples = []
    for f in sample_files(path):
        sample = _read_npz(f)
        _check_sample(sample, model, str(f))
        samples.append(sample)
    return samples


def random_samples(
    model: onnx.ModelProto, input_shapes: dict[str, tuple[int, ...]] | None = None, n: int = 1, seed: int = 0
) -> list[dict[str, np.ndarray]]:
    """Inputs for a model when no data is given: floats ~ N(0, 1), integers 1, booleans True.

    Dynamic dims take ``input_shapes`` or 1.
    """
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        sample = {}
        for info in model_inputs(model):
            tt = info.type.tensor_type
            shape = (input_shapes or {}).get(info.name) or tuple(
                d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in tt.shape.dim
            )
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
            if np.issubdtype(dtype, np.floating):
                sample[info.name] = rng.standard_normal(shape).astype(dtype)
            elif dtype == np.bool_:
                sample[info.name] = np.ones(shape, dtype)
            else:
                sample[info.name] = np.ones(shape, dtype)
        out.append(sample)
    return out


def exposed_model(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A copy of ``model`` whose main-graph float tensors are all graph outputs, and their names."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    existing = {o.name for o in inferred.graph.output}
    types = {vi.name: vi for vi in inferred.graph.value_info}
    extra = []
    for node in inferred.graph.node:
        for name in node.output:
            vi = types.get(name)
            if (
                name and name not in existing and vi is not None and vi.type.HasField("tensor_type")
                and vi.type.tensor_type.elem_type in FLOAT_TYPES
            ):
                extra.append(vi)
                existing.add(name)
    inferred.graph.output.extend(extra)
    return inferred, [o.name for o in inferred.graph.output]


# onnxruntime's name of each execution provider an IntermediateRunner can run on.
_ORT_PROVIDERS = {Provider.CPU: "CPUExecutionProvider", Provider.CUDA: "CUDAExecutionProvider"}


class IntermediateRunner:
    """Runs a model on onnxruntime with every main-graph float tensor exposed, on the CPU provider or
    (``provider=Provider.CUDA``) on the CUDA provider, whose real FP16/BF16 kernels then run; a
    provider this onnxruntime cannot run is an :class:`OptionError`."""

    def __init__(self, model: onnx.ModelProto, provider: Provider = Provider.CPU):
        import onnxruntime as ort

        name = _ORT_PROVIDERS.get(provider)
        if name is None or name not in ort.get_available_providers():
            raise OptionError(
                f"onnxruntime {ort.__version__} here cannot run the {provider.value} execution provider "
                f"(available: {', '.join(ort.get_available_providers())})", option="provider",
            )
        exposed, self.names = exposed_model(model)
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        self.session = ort.InferenceSession(exposed.SerializeToString(), opts, providers=[name])
        if self.session.get_providers()[0] != name:
            raise OptionError(f"onnxruntime did not start the {provider.value} execution provider", option="provider")
        self.feeds = {i.name: i.type for i in self.session.get_inputs()}
        self.runs = 0

    def run(self, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs += 1
        values = self.session.run(None, {k: _as_input(v, self.feeds[k]) for k, v in sample.items() if k in self.feeds})
        return dict(zip(self.names, values, strict=True))


def _as_input(array: np.ndarray, ort_type: str) -> np.ndarray:
    """A float sample array in the float type the session's input takes (an FP16 input of a model
    converted without keeping its I/O types); anything else as it is."""
    if ort_type == "tensor(float16)" and np.issubdtype(array.dtype, np.floating):
        return array.astype(np.float16)
    return array


@dataclasses.dataclass
class _Acc:
    min: float = np.inf
    max: float = -np.inf
    absmax: float = 0.0
    nonzero: int = 0
    flushed: int = 0
    subnormal: int = 0
    count: int = 0

    def add(self, a: np.ndarray) -> None:
        a = np.asarray(a, dtype=np.float64).ravel()
        finite = a[np.isfinite(a)]
        if a.size == 0:
            return
        self.count += a.size
        if finite.size:
            self.min = min(self.min, float(finite.min()))
            self.max = max(self.max, float(finite.max()))
        absval = np.abs(a)
        self.absmax = max(self.absmax, float(np.max(absval)))
        nz = absval[absval > 0]
        self.nonzero += nz.size
        self.flushed += int(np.count_nonzero(nz < FP16_SMALLEST_SUBNORMAL / 2))
        self.subnormal += int(np.count_nonzero(nz < FP16_SMALLEST_NORMAL))

    def range(self) -> TensorRange:
        return TensorRange(
            min=self.min if self.count else 0.0,
            max=self.max if self.count else 0.0,
            absmax=self.absmax,
            underflow_share=self.flushed / self.nonzero if self.nonzero else 0.0,
            subnormal_share=self.subnormal / self.nonzero if self.nonzero else 0.0,
            count=self.count,
        )


def _progress(items: list, label: str) -> Iterator:
    """Yield items, drawing a progress bar on stderr when it is a terminal."""
    tty = sys.stderr.isatty()
    n = len(items)
    for i, item in enumerate(items, 1):
        yield item
        if tty:
            filled = int(30 * i / n)
            sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {i}/{n}")
            sys.stderr.flush()
    if tty and n:
        sys.stderr.write("\n")


def collect_ranges(model: onnx.ModelProto, samples: Iterable[dict[str, np.ndarray]]) -> dict[str, TensorRange]:
    """Observed range of every main-graph float tensor of the FP32 model over the samples."""
    runner = IntermediateRunner(model)
    accs: dict[str, _Acc] = {}
    for sample in _progress(list(samples), "calibrating"):
        for name, value in runner.run(sample).items():
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                accs.setdefault(name, _Acc()).add(value)
        for name, value in sample.items():
            if np.issubdtype(value.dtype, np.floating):
                accs.setdefault(name, _Acc()).add(value)
    return {name: acc.range() for name, acc in accs.items()}
