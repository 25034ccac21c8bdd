"""Low-precision targets and their numeric ranges."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from amp_compiler.errors import OptionError

if TYPE_CHECKING:  # imported where used: the command line reads the choices without loading them
    import numpy as np
    import onnx_ir as ir

__all__ = [
    "FP8_BUDGET", "FP8_CALIBRATION", "FP8_MARGIN", "FP8_MAX_ERROR", "FP8_MAX_SUBNORMAL", "FP8_PERCENTILE",
    "GEMM_RATE", "HOLDOUT", "Metric", "Provider", "Target",
]


#: Dense Tensor Core GEMM throughput relative to FP16 on an H100 SXM (NVIDIA's datasheet: TF32 494.7,
#: FP16/BF16 989.4, FP8 1,978.9 TFLOPS). FP32 GEMMs run as TF32 there: onnxruntime's CUDA provider
#: enables it by default (``use_tf32``), as does TensorRT. ``--tolerance`` values a choice by the GEMM
#: time it saves against FP32.
GEMM_RATE = {"fp32": 0.5, "fp16": 1.0, "bf16": 1.0, "fp8": 2.0}


class Target(enum.Enum):
    """The low-precision format a conversion produces."""

    FP16 = "fp16"
    BF16 = "bf16"
    # FP8 E4M3 (float8e4m3fn: max 448, smallest normal 2^-6) for the inputs of Tensor Core ops whose
    # statistics allow it, through QuantizeLinear/DequantizeLinear; every other op follows ``fallback``.
    FP8 = "fp8"

    @property
    def dtype(self) -> ir.DataType:
        import onnx_ir as ir

        by_target = {
            Target.FP16: ir.DataType.FLOAT16, Target.BF16: ir.DataType.BFLOAT16, Target.FP8: ir.DataType.FLOAT8E4M3FN,
        }
        return by_target[self]

    @property
    def numpy_dtype(self) -> np.dtype:
        import ml_dtypes
        import numpy as np

        by_target = {Target.FP16: np.float16, Target.BF16: ml_dtypes.bfloat16, Target.FP8: ml_dtypes.float8_e4m3fn}
        return np.dtype(by_target[self])

    @property
    def fallback(self) -> Target:
        """The default target of the ops that do not run in this one's format: FP16 for FP8 (BF16 on
        request: ``ConvertOptions.fallback``), else itself."""
        return Target.FP16 if self is Target.FP8 else self

    @property
    def type_str(self) -> str:
        """The ONNX schema spelling, as in type constraints: ``tensor(float16)``."""
        from amp_compiler.dtypes import schema_type

        return schema_type(self.dtype)

    @property
    def max(self) -> float:
        """Largest finite value."""
        import ml_dtypes

        return float(ml_dtypes.finfo(self.numpy_dtype).max)

    @property
    def smallest_normal(self) -> float:
        import ml_dtypes

        return float(ml_dtypes.finfo(self.numpy_dtype).smallest_normal)

    @property
    def smallest_subnormal(self) -> float:
        import ml_dtypes

        return float(ml_dtypes.finfo(self.numpy_dtype).smallest_subnormal)

    @classmethod
    def parse(cls, text: str, option: str = "target") -> Target:
        try:
            return cls(text.lower())
        except ValueError:
            expected = "fp16, bf16 or fp8" if option == "target" else "fp16 or bf16"
            raise OptionError(f"unknown target {text!r}: expected {expected}", option=option) from None


#: Defaults of the FP8 options (``ConvertOptions.fp8_*``; the command line shows them in its help).
FP8_MARGIN = 1
FP8_BUDGET = 0.1
# The share of the calibration samples --tolerance and the FP8 budget hold out: half, so that the
# held-out error is measured as precisely as the one the choice is made on. On ppocr-cls (2 images a
# batch, per-batch FP8 errors from 0.4% to 26%) at the FP8 budget 10%, holding out a quarter of the 8
# calibration batches chose 41 FP8 GEMMs that moved 8 unseen batches by 13.2% (relative L2); half,
# 21 GEMMs and 4.6% (benchmarks.fp8_table).
HOLDOUT = 0.5
FP8_MAX_ERROR = 0.1
FP8_MAX_SUBNORMAL = 0.01
FP8_CALIBRATION = "max"
FP8_PERCENTILE = 99.99


class Provider(enum.Enum):
    """The onnxruntime execution provider the converted model is meant for."""

    CUDA = "cuda"
    TENSORRT = "tensorrt"
    CPU = "cpu"

    @classmethod
    def parse(cls, text: str) -> Provider:
        try:
            return cls(text.lower())
        except ValueError:
            raise OptionError(
                f"unknown provider {text!r}: expected one of cuda, tensorrt, cpu", option="provider"
            ) from None


class Metric(enum.Enum):
    """The error metrics by name (``--metric``), each an error per output, worst output counted:

    - ``rel-l2``: ||converted - FP32|| / ||FP32|| over the samples;
    - ``max-range``: the largest |converted - FP32| as a share of FP32's range (max - min);
    - ``cosine``: 1 - the cosine similarity of converted and FP32;
    - ``argmax``: the share of positions whose argmax over the last axis differs from FP32's (1 -
      top-1 agreement; a row with a NaN never agrees, an output whose last axis holds fewer than 2
      values has none: :class:`~amp_compiler.core.tensor_error.ArgmaxAgreement`).
    """

    REL_L2 = "rel-l2"
    MAX_RANGE = "max-range"
    COSINE = "cosine"
    ARGMAX = "argmax"
