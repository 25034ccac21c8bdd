"""Every ONNX backend node test case converts to FP16, stays valid and matches its reference.

One test per case of ``onnx/backend/test/data/node`` (generated from ``onnx.backend.test.case.node``
when the onnx wheel does not ship the folder); see ``tests/support/backend_sweep.py`` for what each status
means and the comparison rule. Skipped statuses (non-tensor I/O, no float32 data, onnxruntime cannot
run the FP32 model) are expected pytest skips (their reasons start with "expected:", which the skip
summary counts instead of listing); convert-error, invalid, shape-inference, ort-error and mismatch fail.
"""

from __future__ import annotations

import pytest

from tests.support.backend_sweep import FAIL_STATUSES, SKIP_STATUSES, node_case_dirs, run_case

_CASES = node_case_dirs()


@pytest.mark.parametrize("case_dir", _CASES, ids=[d.name for d in _CASES])
def test_node_case_fp16(case_dir):
    result = run_case(case_dir, "fp16")
    if result.status in SKIP_STATUSES:
        pytest.skip(f"expected: {result.status}: {result.detail}")
    assert result.status not in FAIL_STATUSES, f"{result.status}: {result.detail}"
