"""Low-precision targets and their numeric ranges."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from amp_compiler.errors import OptionError

if TYPE_CHECKING:  # imported where used: the command line reads the choices without loading them
    import numpy as np
    import onnx_ir as ir


class Target(enum.Enum):
    """The low-precision format a conversion produces."""

    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def dtype(self) -> ir.DataType:
        import onnx_ir as ir

        return ir.DataType.FLOAT16 if self is Target.FP16 else ir.DataType.BFLOAT16

    @property
    def numpy_dtype(self) -> np.dtype:
        import ml_dtypes
        import numpy as np

        return np.dtype(np.float16) if self is Target.FP16 else np.dtype(ml_dtypes.bfloat16)

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
    def parse(cls, text: str) -> Target:
        try:
            return cls(text.lower())
        except ValueError:
            raise OptionError(f"unknown target {text!r}: expected fp16 or bf16", option="target") from None


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
