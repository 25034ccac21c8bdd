"""onnxruntime is no hard dependency: one clear line when a command needs it and it is missing, broken,
or installed twice (onnxruntime and onnxruntime-gpu overwrite each other's files)."""

from __future__ import annotations

import os
import subprocess
import sys

import onnx
import pytest
from onnx import helper

from amp_compiler import runtime
from amp_compiler.errors import AmpUserError, RuntimeMissingError
from tests.support import REPO_ROOT
from tests.support.onnx_builders import F32, model, tensor, vi, weights

ROOT = REPO_ROOT


@pytest.fixture
def no_onnxruntime(monkeypatch):
    def refuse():
        raise ImportError("No module named 'onnxruntime'")

    monkeypatch.setattr(runtime, "installed_distributions", lambda: ())
    monkeypatch.setattr(runtime, "_import", refuse)


def test_missing(no_onnxruntime) -> None:
    with pytest.raises(RuntimeMissingError) as err:
        runtime.onnxruntime("run the model")
    text = str(err.value)
    assert text == (
        "onnxruntime is not installed (needed to run the model): pip install 'amp-compiler[cpu]' "
        "(or 'amp-compiler[gpu]' for CUDA/TensorRT)"
    )
    assert isinstance(err.value, AmpUserError)


def test_both_builds_installed(monkeypatch) -> None:
    monkeypatch.setattr(runtime, "installed_distributions", lambda: ("onnxruntime", "onnxruntime-gpu"))
    with pytest.raises(RuntimeMissingError, match="onnxruntime and onnxruntime-gpu are all installed: they "
                       "overwrite each other's files") as err:
        runtime.onnxruntime("run the model")
    assert "pip uninstall onnxruntime onnxruntime-gpu" in str(err.value)


def test_installed_here() -> None:
    assert runtime.installed_distributions() in (("onnxruntime",), ("onnxruntime-gpu",))
    assert runtime.onnxruntime("run the model").__name__ == "onnxruntime"


def test_plain_models_convert_without_it(no_onnxruntime) -> None:
    from amp_compiler import convert

    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", F32, [2, 16])], [vi("y", F32, [2, 8])],
              [tensor("w", weights((16, 8)))])
    assert convert(m, probe=False).decisions[0].precision == "fp16"


def test_cli_one_line_when_it_does_not_load(tmp_path) -> None:
    """A model with a contrib op needs onnxruntime's schemas: with an onnxruntime that cannot be
    imported, the command says so in one line and exits 2 (run in a child whose 'onnxruntime' is a
    broken stand-in put first on its path)."""
    fake = tmp_path / "site" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('libonnxruntime.so: cannot open shared object file')\n")
    node = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")
    graph = helper.make_graph([node], "g", [vi("x", F32, [2])], [vi("y", F32, [2])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 9
    onnx.save(m, tmp_path / "m.onnx")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT)])}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; from amp_compiler.cli import main; sys.exit(main())",
         "convert", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out.onnx")],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "does not load (libonnxruntime.so: cannot open shared object file)" in lines[0]
    assert "read the schemas of ops that onnx does not define" in lines[0]
    assert not (tmp_path / "out.onnx").exists()
