"""onnx's checker and shape inference in a child process (amp_compiler.onnx.load.native_checks), for large models.

The child path is forced on small models by lowering ``CHILD_MIN_NODES``: it must give the same
conversion, byte for byte, and the same errors as the in-process path.
"""

from __future__ import annotations

import signal
import sys

import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load import native_checks
from benchmarks.generate import transformer_model
from models import catalog
from tests.support.onnx_builders import F32, model, tensor, vi, weights


@pytest.fixture
def child_always(monkeypatch):
    monkeypatch.setattr(native_checks, "CHILD_MIN_NODES", 0)


@pytest.fixture
def child_never(monkeypatch):
    monkeypatch.setattr(native_checks, "CHILD_MIN_NODES", 10**12)


def _convert_bytes(m, **kw) -> bytes:
    return convert(m, probe=False, **kw).model.SerializeToString(deterministic=True)


@pytest.mark.parametrize("name", ["bert-base-small", "silero-vad", "if-branches", "loop-carried", "t5-small-decoder-small"])
def test_child_path_converts_byte_for_byte_as_in_process(name, monkeypatch):
    entry = next(e for e in catalog.entries("small") if e.name == name)
    m = catalog.load(entry)
    monkeypatch.setattr(native_checks, "CHILD_MIN_NODES", 10**12)
    expected = _convert_bytes(m)
    monkeypatch.setattr(native_checks, "CHILD_MIN_NODES", 0)
    assert _convert_bytes(m) == expected


def test_large_model_from_a_file_uses_the_child_and_matches(tmp_path, monkeypatch):
    m = transformer_model(600)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    started = []
    real = native_checks.NativeChecks

    class Spy(real):
        def __init__(self, *args):
            started.append(True)
            super().__init__(*args)

        def result(self):
            answer = super().result()
            assert answer.failed is None and answer.crashed is None  # the child answered
            assert answer.types is not None and answer.types.graphs
            return answer

    monkeypatch.setattr(native_checks, "NativeChecks", Spy)
    monkeypatch.setattr(native_checks, "CHILD_MIN_NODES", 500)
    via_child = _convert_bytes(str(path))
    assert started == [True]
    monkeypatch.setattr(native_checks, "CHILD_MIN_NODES", 10**12)
    assert _convert_bytes(str(path)) == via_child
    assert started == [True]


def _cyclic() -> onnx.ModelProto:
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "b"], ["a"], name="first"),
            helper.make_node("Relu", ["a"], ["b"], name="second"),
        ],
        "g", [vi("x", F32, [2])], [vi("b", F32, [2])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("mode", ["child_always", "child_never"])
def test_checker_faults_get_the_precise_message_either_way(mode, request):
    request.getfixturevalue(mode)
    with pytest.raises(ModelLoadError, match="cycle"):
        convert(_cyclic(), probe=False)


@pytest.mark.parametrize("mode", ["child_always", "child_never"])
def test_a_fault_found_in_this_process_stops_the_child(mode, request):
    request.getfixturevalue(mode)
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, [2, 2])], [vi("y", F32, [2, 2])], [tensor("w", weights((2, 2)))],
    )
    m.graph.initializer[0].raw_data = m.graph.initializer[0].raw_data[:-4]  # 3 floats for a 2x2
    with pytest.raises(ModelLoadError, match="holds 12 bytes"):
        convert(m, probe=False)


def test_a_child_that_dies_is_reported_not_ignored(child_always, monkeypatch):
    die = f"import os, signal; os.kill(os.getpid(), signal.SIG{signal.Signals.SIGSEGV.name[3:]})"
    monkeypatch.setattr(native_checks, "child_command", lambda: [sys.executable, "-c", die])
    m = model(
        [helper.make_node("Relu", ["x"], ["y"], name="r")], [vi("x", F32, [2])], [vi("y", F32, [2])],
    )
    with pytest.raises(ModelLoadError, match=r"stopped on this model \(signal 11\)"):
        convert(m, probe=False)


def test_shape_inference_failure_in_the_child_keeps_declared_types(child_always, monkeypatch):
    """A child whose shape inference failed (simulated: it answers so) is not an error: the types the
    model declares stand, as when inference fails in-process."""
    answer = 'import sys; sys.stdin.buffer.read(); print(\'{"checker_error": null, "types": null}\')'
    monkeypatch.setattr(native_checks, "child_command", lambda: [sys.executable, "-c", answer])
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, [2, 16])], [vi("y", F32, [2, 4])], [tensor("w", weights((16, 4)))],  # K = 16
    )
    result = convert(m, probe=False)
    assert {d.node: d.precision for d in result.decisions}["mm"] == "fp16"
    assert result.casts_inserted == 2


@pytest.mark.parametrize("child", ["import sys; sys.exit(3)", "print('not json')"])
def test_a_child_that_fails_on_its_own_hands_the_work_back(child, child_always, monkeypatch):
    """An exit status or an unreadable answer says nothing about the model: the checks and shape
    inference run in this process instead, with the same result."""
    m = model(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [vi("x", F32, [2, 4])], [vi("y", F32, [2, 4])], [tensor("w", weights((4, 4)))],
    )
    expected = _convert_bytes(m)
    monkeypatch.setattr(native_checks, "child_command", lambda: [sys.executable, "-c", child])
    assert _convert_bytes(m) == expected
    with pytest.raises(ModelLoadError, match="cycle"):
        convert(_cyclic(), probe=False)  # and the checker's verdict still comes, from this process


def test_the_native_checks_pipes_are_widened_on_linux():
    """The model's bytes go to the checks' child through a 1 MiB pipe, as to the runner's."""
    import fcntl
    import os

    from amp_compiler.runtime.pipes import PIPE_BYTES

    if not sys.platform.startswith("linux") or not os.path.exists("/proc/sys/fs/pipe-max-size"):
        pytest.skip("expected: pipe sizes are Linux's")
    with open("/proc/sys/fs/pipe-max-size") as f:
        if int(f.read()) < PIPE_BYTES:
            pytest.skip("expected: this system lets a process widen its pipes less")
    checks = native_checks.NativeChecks(None, onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [])))
    size = fcntl.fcntl(checks._proc.stdout.fileno(), getattr(fcntl, "F_GETPIPE_SZ", 1032))
    checks.result()
    assert size == PIPE_BYTES
