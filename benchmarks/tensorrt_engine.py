"""Build and run a strongly typed TensorRT engine from an ONNX file: the one place that does it.

    from benchmarks.tensorrt_engine import available, build_strongly_typed, run_engine
    why = available()                       # None, or why TensorRT cannot run here
    engine = build_strongly_typed("model.onnx", {"x": (1, 3, 224, 224)})
    outputs = run_engine(engine, {"x": x})  # by output name, as numpy arrays

TensorRT 11 builds strongly typed networks only (10.x with ``NetworkDefinitionCreationFlag
.STRONGLY_TYPED``): each tensor's type is the one the ONNX file gives, no builder precision flag.
The network is parsed from the file (external data beside it), built for one optimization profile
whose min, opt and max shapes are the shapes given (dynamic dims fixed there), and run on the
default CUDA device. Device buffers come from torch when it has CUDA, else from cuda-python's
runtime API: TensorRT's Python package allocates none itself.

Used by ``tests/e2e/test_tensorrt_parser.py`` (the parser check of every catalog model's
``--provider tensorrt`` output); GPU benchmarks call the same two functions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["EngineError", "available", "build_strongly_typed", "run_engine"]


class EngineError(RuntimeError):
    """TensorRT refused the model: the parser's errors, or the builder's failure, in one line."""


def available() -> str | None:
    """None when TensorRT can build and run engines here, else why not (one line)."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return "TensorRT's Python package (tensorrt) is not installed"
    if _device() is None:
        return "no CUDA device (neither torch nor cuda-python sees one)"
    return None


def build_strongly_typed(path: str | os.PathLike, shapes: Mapping[str, tuple[int, ...]]) -> bytes:
    """The serialized engine of the ONNX file at ``path``, parsed into a strongly typed network and
    built for the input ``shapes`` (name -> shape); :class:`EngineError` when the parser or the
    builder refuses it."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(os.fspath(path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise EngineError("TensorRT's ONNX parser refuses the model: " + " | ".join(e.splitlines()[0] for e in errors))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        if tensor.name not in shapes:
            raise EngineError(f"no shape given for input {tensor.name!r}")
        shape = tuple(shapes[tensor.name])
        if tensor.is_shape_tensor:
            raise EngineError(f"input {tensor.name!r} is a shape tensor: not supported here")
        profile.set_shape(tensor.name, shape, shape, shape)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineError("TensorRT's builder failed on the parsed network")
    return bytes(serialized)


def run_engine(engine_bytes: bytes, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a serialized engine once on ``feeds`` (name -> array); its outputs by name."""
    import tensorrt as trt

    device = _device()
    if device is None:
        raise EngineError("no CUDA device")
    logger = trt.Logger(trt.Logger.ERROR)
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_bytes)
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    buffers: dict[str, Any] = {}
    for name in inputs:
        array = np.ascontiguousarray(feeds[name])
        context.set_input_shape(name, array.shape)
        buffers[name] = device.upload(array, _dtype_name(engine.get_tensor_dtype(name)))
    outputs = [n for n in names if n not in inputs]
    for name in outputs:
        shape = tuple(context.get_tensor_shape(name))
        buffers[name] = device.empty(shape, _dtype_name(engine.get_tensor_dtype(name)))
    for name in names:
        context.set_tensor_address(name, device.pointer(buffers[name]))
    if not context.execute_async_v3(device.stream()):
        raise EngineError("TensorRT could not run the engine")
    device.synchronize()
    for name in inputs:
        device.release(buffers[name])
    return {name: device.download(buffers[name]) for name in outputs}


def _dtype_name(dtype: Any) -> str:
    """A TensorRT DataType's name as numpy (and torch) spell it: "float16", "bfloat16", "int64"."""
    names = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
             "INT8": "int8", "UINT8": "uint8", "BOOL": "bool"}
    name = getattr(dtype, "name", str(dtype).rsplit(".", 1)[-1])
    if name not in names:
        raise EngineError(f"an engine input or output of type {name}: not supported here")
    return names[name]


def _device() -> Any:
    """Device buffers through torch (when it has CUDA), else through cuda-python; None without a GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            return _TorchDevice()
    except ImportError:
        pass
    try:
        return _CudaPythonDevice()
    except (ImportError, RuntimeError):
        return None


class _TorchDevice:
    def __init__(self):
        import torch

        self.torch = torch

    def _type(self, name: str) -> Any:
        return getattr(self.torch, name)

    def upload(self, array: np.ndarray, dtype: str) -> Any:
        source = self.torch.from_numpy(array.astype(np.float32) if dtype == "bfloat16" else array)
        return source.to(device="cuda", dtype=self._type(dtype)).contiguous()

    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        return self.torch.empty(shape, dtype=self._type(dtype), device="cuda")

    @staticmethod
    def pointer(buffer: Any) -> int:
        return int(buffer.data_ptr())

    def stream(self) -> int:
        return int(self.torch.cuda.current_stream().cuda_stream)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    @staticmethod
    def release(buffer: Any) -> None:
        del buffer  # torch frees it with its last reference

    def download(self, buffer: Any) -> np.ndarray:
        host = buffer.float() if buffer.dtype == self.torch.bfloat16 else buffer
        return host.cpu().numpy()


class _CudaPythonDevice:
    """cuda-python's runtime API (``cuda.bindings.runtime``, or ``cuda.cudart`` before 12.6)."""

    def __init__(self):
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:
            from cuda import cudart  # type: ignore[no-redef]
        self.cudart = cudart
        err, count = cudart.cudaGetDeviceCount()
        if int(err) != 0 or count == 0:
            raise RuntimeError("no CUDA device")
        self._stream = self._check(cudart.cudaStreamCreate())
        self._shapes: dict[int, tuple[tuple[int, ...], str]] = {}

    @staticmethod
    def _check(result: tuple) -> Any:
        err, *rest = result
        if int(err) != 0:
            raise EngineError(f"CUDA runtime error {err}")
        return rest[0] if rest else None

    def empty(self, shape: tuple[int, ...], dtype: str) -> int:
        size = max(int(np.prod(shape)) * _itemsize(dtype), 1)
        pointer = int(self._check(self.cudart.cudaMalloc(size)))
        self._shapes[pointer] = (shape, dtype)
        return pointer

    def upload(self, array: np.ndarray, dtype: str) -> int:
        if dtype == "bfloat16":
            import ml_dtypes

            array = array.astype(ml_dtypes.bfloat16)
        else:
            array = array.astype(dtype)
        pointer = self.empty(array.shape, dtype)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(self.cudart.cudaMemcpy(pointer, array.ctypes.data, array.nbytes, kind))
        return pointer

    @staticmethod
    def pointer(buffer: int) -> int:
        return buffer

    def stream(self) -> int:
        return int(self._stream)

    def synchronize(self) -> None:
        self._check(self.cudart.cudaStreamSynchronize(self._stream))

    def release(self, buffer: int) -> None:
        self._shapes.pop(buffer, None)
        self._check(self.cudart.cudaFree(buffer))

    def download(self, buffer: int) -> np.ndarray:
        shape, dtype = self._shapes[buffer]
        if dtype == "bfloat16":
            import ml_dtypes

            host = np.empty(shape, ml_dtypes.bfloat16)
        else:
            host = np.empty(shape, dtype)
        kind = self.cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(self.cudart.cudaMemcpy(host.ctypes.data, buffer, host.nbytes, kind))
        self.release(buffer)
        return host.astype(np.float32) if dtype == "bfloat16" else host


def _itemsize(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
