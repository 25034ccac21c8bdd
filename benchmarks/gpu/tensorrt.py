"""TensorRT engines from ONNX files: the one engine build, and an engine's latency and outputs.

:func:`build_engine` is the single place this repository builds a TensorRT engine: a **strongly
typed** network (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``: every tensor keeps the type the
ONNX graph gives it, which is how an amp-compiler output for ``--provider tensorrt`` is meant to
run; a TensorRT without that flag and without weak typing's builds nothing but strongly typed
networks), or with ``fp16=True`` the older weak typing (``BuilderFlag.FP16`` on an FP32 network:
TensorRT picks FP16 kernels where it thinks fit), where the installed TensorRT still has that flag.
Both are detected by feature, not by version: a TensorRT without one raises :class:`Unavailable`.
One optimization profile covers the batch sizes measured (min: the smallest, opt and max: the
largest), other dimensions fixed to the inputs'.

Engines run with their I/O in CUDA memory from torch, timed with CUDA events on torch's stream.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpu.rows import Timing
from benchmarks.gpu.variants import Unavailable

__all__ = ["Engine", "build_engine", "has_fp16_flag", "tensorrt_module"]


def tensorrt_module() -> Any:
    """The ``tensorrt`` module; :class:`Unavailable` when it does not import."""
    try:
        import tensorrt
    except Exception as exc:  # noqa: BLE001 - missing, or its libraries do not load: the row says which
        raise Unavailable(f"tensorrt does not import: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    return tensorrt


def has_fp16_flag(trt: Any) -> bool:
    """Whether this TensorRT still has weak typing's FP16 builder flag."""
    return getattr(getattr(trt, "BuilderFlag", None), "FP16", None) is not None


def build_engine(onnx_path: Path, profile: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]],
                 *, fp16: bool = False, trt: Any = None) -> tuple[bytes, float]:
    """A serialized engine of the ONNX model at ``onnx_path`` and its build time in seconds.

    ``profile``: each input's (min, opt, max) shape. ``fp16`` False: a strongly typed network;
    True: a weakly typed one with ``BuilderFlag.FP16``. Raises :class:`Unavailable` when the installed
    TensorRT lacks what is asked for, RuntimeError when its parser or builder refuses the model."""
    trt = trt or tensorrt_module()
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if not fp16:
        strong = getattr(getattr(trt, "NetworkDefinitionCreationFlag", None), "STRONGLY_TYPED", None)
        if strong is not None:
            flags |= 1 << int(strong)
        elif has_fp16_flag(trt):  # weak typing is its default, and it has no other
            raise Unavailable("this TensorRT has no strongly typed networks (NetworkDefinitionCreationFlag.STRONGLY_TYPED)")
        # else: without weak typing's flag, every network is strongly typed (TensorRT 11)
    elif not has_fp16_flag(trt):
        raise Unavailable("this TensorRT has no weak-typing FP16 flag (BuilderFlag.FP16): networks are strongly typed")
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise RuntimeError("TensorRT's ONNX parser refused the model: " + "; ".join(errors[:3]))
    config = builder.create_builder_config()
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    shapes = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        if name not in profile:
            raise RuntimeError(f"no shape for the engine's input {name!r}")
        shapes.set_shape(name, *profile[name])
    config.add_optimization_profile(shapes)
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    seconds = time.perf_counter() - start
    if plan is None:
        raise RuntimeError("TensorRT could not build the engine (its log above says why)")
    return bytes(plan), seconds


class Engine:
    """A deserialized engine and its execution context, run on torch's current CUDA stream."""

    def __init__(self, plan: bytes, trt: Any = None):
        import torch

        self.trt = trt or tensorrt_module()
        self.torch = torch
        logger = self.trt.Logger(self.trt.Logger.WARNING)
        self.runtime = self.trt.Runtime(logger)  # kept: the engine must not outlive it
        self.engine = self.runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise RuntimeError("TensorRT could not deserialize the engine")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = self.trt.TensorIOMode.INPUT
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) != mode]
        self._held: list[Any] = []  # the bound input tensors, alive while the engine reads them

    def _dtype(self, name: str) -> Any:
        t, trt = self.torch, self.trt
        table = {"FLOAT": t.float32, "HALF": t.float16, "BF16": t.bfloat16, "INT32": t.int32, "INT64": t.int64,
                 "BOOL": t.bool, "INT8": t.int8, "UINT8": t.uint8}
        dtype = self.engine.get_tensor_dtype(name)
        for key, torch_type in table.items():
            if getattr(trt.DataType, key, None) == dtype:
                return torch_type
        raise RuntimeError(f"engine tensor {name!r} has type {dtype}, which this harness does not bind")

    def bind(self, feeds: dict[str, np.ndarray]) -> list[Any]:
        """Copy ``feeds`` to the device, allocate the outputs, set every address; the outputs."""
        torch = self.torch
        self._held = []
        for name in self.inputs:
            tensor = torch.from_numpy(np.ascontiguousarray(feeds[name])).to("cuda", self._dtype(name))
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
            self._held.append(tensor)
        outputs = []
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            tensor = torch.empty(shape, dtype=self._dtype(name), device="cuda")
            self.context.set_tensor_address(name, tensor.data_ptr())
            outputs.append(tensor)
        return outputs

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on ``feeds``: the outputs by name (floats as FP32), on the host."""
        outputs = self.bind(feeds)
        stream = self.torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT's execute_async_v3 failed")
        stream.synchronize()
        return {name: o.float().cpu().numpy() if o.is_floating_point() else o.cpu().numpy()
                for name, o in zip(self.outputs, outputs)}

    def latency(self, feeds: dict[str, np.ndarray], batch: int, warmup: int, repeats: int) -> Timing:
        self.bind(feeds)
        torch = self.torch
        stream = torch.cuda.current_stream()
        for _ in range(warmup):
            self.context.execute_async_v3(stream.cuda_stream)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
        for start, end in events:
            start.record(stream)
            self.context.execute_async_v3(stream.cuda_stream)
            end.record(stream)
        stream.synchronize()
        times = [start.elapsed_time(end) for start, end in events]
        return Timing(batch, statistics.median(times), float(np.percentile(times, 90)), repeats)
