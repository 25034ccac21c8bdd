"""The dependency metadata: which onnxruntime each install brings, resolved by pip itself.

onnxruntime and onnxruntime-gpu install the same ``onnxruntime`` package and overwrite each other,
so no install may bring both: the plain install brings neither, ``[cpu]`` the CPU build, ``[gpu]``
the CUDA build, and the test extra (README's test command) the CPU build. The project is built
once as a wheel (pip's isolated build of its real metadata) and pip's resolver is asked what each
install would bring (``pip install --dry-run --ignore-installed --report``), three resolutions at
once. The registry must be reachable (it is in CI); a network failure skips, any other fails.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

ROOT = REPO_ROOT
RUNTIMES = {"onnxruntime", "onnxruntime-gpu"}
NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Temporary failure in name resolution|Max retries exceeded|Network is unreachable|"
    r"ConnectTimeout|ReadTimeout|Could not fetch URL"
)


def _pip(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and NETWORK_ERRORS.search(proc.stdout + proc.stderr):
        pytest.skip(f"the package index is not reachable: {NETWORK_ERRORS.search(proc.stdout + proc.stderr)[0]}")
    assert proc.returncode == 0, f"pip {' '.join(args[:2])} failed:\n{(proc.stdout + proc.stderr)[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _pip("wheel", "--no-deps", "--quiet", "--wheel-dir", str(out), str(ROOT))
    (found,) = out.glob("amp_compiler-*.whl")
    return found


def _resolve(wheel: Path, extras: str, report: Path) -> set[str]:
    """The distributions pip would install for ``wheel[extras]`` into an empty environment."""
    _pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report), f"{wheel}{extras}")
    return {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}


@pytest.fixture(scope="module")
def resolved(wheel: Path, tmp_path_factory) -> dict[str, set[str]]:
    tmp = tmp_path_factory.mktemp("reports")
    extras = {"plain": "", "cpu": "[cpu]", "gpu": "[gpu]"}
    with concurrent.futures.ThreadPoolExecutor(len(extras)) as pool:
        futures = {k: pool.submit(_resolve, wheel, e, tmp / f"{k}.json") for k, e in extras.items()}
        return {k: f.result() for k, f in futures.items()}


def test_each_install_brings_one_onnxruntime_at_most(resolved: dict[str, set[str]]) -> None:
    assert resolved["plain"] & RUNTIMES == set(), "the plain install must bring no onnxruntime"
    assert resolved["cpu"] & RUNTIMES == {"onnxruntime"}
    assert resolved["gpu"] & RUNTIMES == {"onnxruntime-gpu"}, "[gpu] must not bring the CPU build"
    for install in resolved.values():
        assert {"amp-compiler", "onnx", "onnx-ir", "numpy", "sympy"} <= install
        assert "torch" not in install


def test_the_test_extra_brings_the_cpu_runtime(wheel: Path) -> None:
    """README's test command installs ``.[test]``: it needs an onnxruntime, the CPU one (through
    ``[cpu]``), and onnxruntime-genai to build the catalog's decoders. Read from the wheel's metadata
    (resolving the whole test extra takes a minute)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.M)
    test = {r.split(";")[0].strip() for r in requires if 'extra == "test"' in r}
    assert "amp-compiler[cpu]" in test
    assert any(r.startswith("onnxruntime-genai") for r in test)
    assert not any(r.startswith("onnxruntime-gpu") for r in test)
    base = [r for r in requires if "extra ==" not in r]
    assert not any(r.startswith("onnxruntime") for r in base), "onnxruntime is no hard dependency"
