"""What a process imports: a plain conversion of a standard-op model never loads torch or onnxruntime
(the load check imports onnxruntime in its child, not here), and ``--help``/``import amp_compiler``
load none of the heavy libraries (numpy, onnx, onnx_ir) at all. Each case runs in a fresh process,
which prints the top-level modules it ended with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import helper

from tests.support import REPO_ROOT
from tests.support.onnx_builders import F32, model, tensor, vi, weights

ROOT = REPO_ROOT
HEAVY = ("torch", "onnxruntime", "onnx", "onnx_ir", "numpy", "networkx", "sympy")

_SCRIPT = """
import json, sys
from amp_compiler.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # --help
    code = exc.code
from amp_compiler.cli.deferred_imports import is_deferred  # stand-ins for modules never imported
print(json.dumps({"code": code, "modules": sorted({m.split('.')[0] for m in sys.modules if not is_deferred(m)})}))
"""


def _modules_after(*argv: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["code"] == 0, proc.stderr
    return set(report["modules"]) & set(HEAVY)


@pytest.fixture
def standard_model(tmp_path) -> Path:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    m = model(nodes, [vi("x", F32, [2, 8])], [vi("y", F32, [2, 8])], [tensor("w", weights((8, 8)))])
    onnx.save(m, tmp_path / "m.onnx")
    return tmp_path / "m.onnx"


@pytest.mark.parametrize("load_check", [True, False], ids=["load-check", "no-load-check"])
def test_plain_convert_loads_neither_torch_nor_onnxruntime(standard_model, tmp_path, load_check) -> None:
    out = tmp_path / "out.onnx"
    argv = ["convert", "-q", str(standard_model), "-o", str(out)] + ([] if load_check else ["--no-load-check"])
    loaded = _modules_after(*argv)
    assert out.exists()
    assert "onnx" in loaded  # the script did convert in this process
    assert not loaded & {"torch", "onnxruntime"}


def test_help_loads_no_heavy_library() -> None:
    assert _modules_after("--help") == set()
    assert _modules_after("convert", "--help") == set()


def test_import_loads_no_heavy_library() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", "import json, sys, amp_compiler; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, cwd=ROOT, timeout=120, check=True,
    )
    assert not {m.split(".")[0] for m in json.loads(proc.stdout)} & set(HEAVY)


def test_comparison_formats_match_the_renderer() -> None:
    """The compare command's --format choices are spelt in the CLI (its parser is built without
    importing the comparison): they must be the renderer's."""
    from amp_compiler.cli.args.compare import FORMATS as CLI_FORMATS
    from amp_compiler.report.comparison import FORMATS

    assert CLI_FORMATS == FORMATS


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_a_plain_convert_never_imports_sympy(standard_model, tmp_path) -> None:
    """onnx_ir imports sympy at its import; the command line defers it (amp_compiler.cli.deferred_imports)."""
    out = tmp_path / "out.onnx"
    code = (
        "import sys\nfrom amp_compiler.cli import main\n"
        f"assert main(['convert', '-q', {str(standard_model)!r}, '-o', {str(out)!r}]) == 0\n"
        "from amp_compiler.cli.deferred_imports import is_deferred\n"
        "print(is_deferred('sympy'), is_deferred('onnx_ir._symbolic_shapes'), 'sympy.core' in sys.modules)"
    )
    assert _run(code) == "True True False"
    assert out.exists()


def test_a_deferred_module_is_the_real_one_once_used() -> None:
    code = (
        "import sys\nfrom amp_compiler.cli.deferred_imports import defer, is_deferred\ndefer()\n"
        "import onnx_ir as ir\nimport sympy\nassert is_deferred('sympy')\n"
        "d = ir.SymbolicDim('N') * 2\n"  # onnx_ir's dim arithmetic: parses with sympy
        "from sympy import Symbol\nimport sympy.core\n"
        "print(is_deferred('sympy'), sympy.Symbol is Symbol, str(d), sys.modules['sympy'].Symbol is Symbol)"
    )
    assert _run(code) == "False True 2*N True"
