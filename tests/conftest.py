import os
import sys
from pathlib import Path

import pytest

# The model catalog lives in models/ at the repository root and is not installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# Every analysis in the tests checks each pass's requires/ensures (amp_compiler.passes.analysis.pipeline), child
# processes (the CLI tests) included.
os.environ.setdefault("AMP_COMPILER_CHECK_PASSES", "1")


#: A skip whose reason starts with this is part of the design (a backend node case without float
#: data, a peer converter that fails): the summary counts such skips instead of listing each one.
EXPECTED_SKIP = "expected: "


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """List unexpected skips (an import or a tool missing here: coverage lost), count expected ones.
    ``-rs`` (pytest's own list of every skip) still works."""
    skipped = terminalreporter.stats.get("skipped", [])
    unexpected = [r for r in skipped if not _skip_reason(r).startswith(EXPECTED_SKIP)]
    if unexpected:
        terminalreporter.section("unexpected skips")
        for r in unexpected:
            terminalreporter.write_line(f"SKIPPED {r.nodeid}: {_skip_reason(r)}")
    if len(skipped) > len(unexpected):
        terminalreporter.write_line(
            f"{len(skipped) - len(unexpected)} expected skips (reasons starting with {EXPECTED_SKIP.strip()!r}; "
            "-rs lists them)"
        )


@pytest.fixture
def snapshot_only(monkeypatch):
    """Kernel lookups read the shipped snapshots, whatever onnxruntime is installed."""
    from amp_compiler.policy import kernels

    monkeypatch.setenv(kernels.SOURCE_ENV, "snapshot")
    kernels.coverage_for.cache_clear()
    yield
    kernels.coverage_for.cache_clear()
