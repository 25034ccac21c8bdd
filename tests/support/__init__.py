"""What the tests share: model builders (``onnx_builders``, ``fp8_builders``), torch settings
(``fx_helpers``), the fuzzing strategies and the command-line campaigns built on them
(``fuzz_strategies``, ``fuzz_long``, ``backend_sweep``), and the repository's root."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
