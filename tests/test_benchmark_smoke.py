"""The benchmark's smallest setting runs end to end and writes its report (numbers are not asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_benchmark_smallest_setting_writes_a_report(tmp_path):
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "--size", "smallest", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("# Benchmark")
    for heading in ("## Headline", "## Public architectures", "## Generated transformer graphs", "## Notes"):
        assert heading in text
    for tool in ("amp-compiler", "onnxconverter-common", "modelopt-autocast"):
        assert f"| {tool} |" in text or f"- {tool} did not run" in text
    amp_rows = [line for line in text.splitlines() if line.startswith("| amp-compiler | ") and " s (1.0x)" in line]
    assert len(amp_rows) == 2  # one architecture, one generated graph: converted, measured
    assert "GPU latency" in text and "Command: `python -m benchmarks.compare --size smallest" in text
