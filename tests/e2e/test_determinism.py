"""Determinism: the same input and options give byte-identical output files, in one process, across
processes with different hash seeds (set and dict iteration orders), and whatever the order in which
repeatable options are given."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert
from tests.support import REPO_ROOT

ROOT = REPO_ROOT
vi = helper.make_tensor_value_info


def wide_model(branches: int = 12) -> onnx.ModelProto:
    """Many parallel branches sharing inputs and initializers, with HIGH/LOW/FOLLOW/PASS mixes, If
    and Loop subgraphs: plenty of places where an unordered set could leak into the output."""
    rng = np.random.default_rng(0)
    nodes, inits = [], [numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.2).astype(np.float32), "w_shared")]
    outs = []
    for b in range(branches):
        w = f"w{b}"
        inits.append(numpy_helper.from_array((rng.standard_normal((8, 8)) * 0.2).astype(np.float32), w))
        nodes += [
            helper.make_node("MatMul", ["x", w], [f"m{b}"], name=f"b{b}/mm"),
            helper.make_node("MatMul", [f"m{b}", "w_shared"], [f"s{b}"], name=f"b{b}/mm_shared"),
            helper.make_node(["Exp", "Tanh", "Relu", "Softmax"][b % 4], [f"s{b}"], [f"a{b}"], name=f"b{b}/act"),
            helper.make_node("Add", [f"a{b}", "x"], [f"r{b}"], name=f"b{b}/res"),
        ]
        outs.append(f"r{b}")
    nodes.append(helper.make_node("Sum", outs, ["total"], name="sum"))
    then = helper.make_graph(
        [helper.make_node("MatMul", ["total", "w_shared"], ["t"], name="then/mm")], "then", [],
        [vi("t", TensorProto.FLOAT, [2, 8])],
    )
    other = helper.make_graph(
        [helper.make_node("Softmax", ["total"], ["e"], name="else/sm")], "else", [], [vi("e", TensorProto.FLOAT, [2, 8])]
    )
    nodes.append(helper.make_node("If", ["flag"], ["branch"], name="if", then_branch=then, else_branch=other))
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("MatMul", ["v", "w_shared"], ["v_mm"], name="body/mm"),
            helper.make_node("Tanh", ["v_mm"], ["v_out"], name="body/tanh"),
        ],
        "body", [vi("i", TensorProto.INT64, []), vi("c_in", TensorProto.BOOL, []), vi("v", TensorProto.FLOAT, [2, 8])],
        [vi("c_out", TensorProto.BOOL, []), vi("v_out", TensorProto.FLOAT, [2, 8])],
    )
    inits.append(numpy_helper.from_array(np.array(3, np.int64), "trip"))
    nodes.append(helper.make_node("Loop", ["trip", "", "branch"], ["y"], name="loop", body=body))
    g = helper.make_graph(
        nodes, "wide", [vi("x", TensorProto.FLOAT, [2, 8]), vi("flag", TensorProto.BOOL, [])],
        [vi("y", TensorProto.FLOAT, [2, 8]), vi("total", TensorProto.FLOAT, [2, 8])], inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("target", ["fp16", "bf16"])
@pytest.mark.parametrize("keep_io_types", [True, False])
def test_same_bytes_in_one_process(target, keep_io_types):
    m = wide_model()
    first = convert(m, target=target, keep_io_types=keep_io_types, probe=False).model.SerializeToString()
    for _ in range(2):
        assert convert(m, target=target, keep_io_types=keep_io_types, probe=False).model.SerializeToString() == first


def test_same_bytes_from_a_copy_of_the_model():
    m = wide_model()
    copy = onnx.ModelProto.FromString(m.SerializeToString())
    assert convert(m, probe=False).model.SerializeToString() == convert(copy, probe=False).model.SerializeToString()


def _cli_digest(src: Path, dst: Path, hashseed: str, *options: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hashseed}
    proc = subprocess.run(
        [sys.executable, "-m", "amp_compiler.cli", "convert", str(src), "-o", str(dst), "-q", *options],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return hashlib.sha256(dst.read_bytes()).hexdigest()


@pytest.mark.parametrize("model", ["demo", "wide"])
def test_same_bytes_across_processes_with_different_hash_seeds(tmp_path, model):
    if model == "demo":
        src = ROOT / "models" / "demo.onnx"
    else:
        src = tmp_path / "wide.onnx"
        onnx.save(wide_model(), src)
    digests = {_cli_digest(src, tmp_path / f"out{seed}.onnx", seed) for seed in ("0", "1", "4242")}
    assert len(digests) == 1


def test_same_bytes_whatever_the_order_of_repeated_options(tmp_path):
    src = tmp_path / "wide.onnx"
    onnx.save(wide_model(), src)
    a = _cli_digest(src, tmp_path / "a.onnx", "7", "--block-op", "Tanh", "--block-op", "Add",
                    "--block-node", "b1/.*", "--block-node", "b2/.*", "--target", "bf16")
    b = _cli_digest(src, tmp_path / "b.onnx", "8", "--target", "bf16", "--block-node", "b2/.*",
                    "--block-node", "b1/.*", "--block-op", "Add", "--block-op", "Tanh")
    assert a == b


def test_output_file_is_exactly_the_serialized_model(tmp_path):
    """What the CLI writes is convert()'s model, byte for byte (no re-encoding on the way)."""
    src = tmp_path / "wide.onnx"
    onnx.save(wide_model(), src)
    _cli_digest(src, tmp_path / "o.onnx", "0")
    assert (tmp_path / "o.onnx").read_bytes() == convert(wide_model(), probe=False).model.SerializeToString()
