"""benchmarks.gpu's parts that a CPU can check: the profile's placement, batches, the worker
isolation, the report, resuming and re-rendering, and the TensorRT build's flags (a stand-in module)."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from benchmarks.gpu import report
from benchmarks.gpu.__main__ import main, plan
from benchmarks.gpu.cases import at_batch
from benchmarks.gpu.placement import placement_from_profile
from benchmarks.gpu.rows import Accuracy, Placement, Row, Step, Timing
from benchmarks.gpu.runner import run_steps
from benchmarks.gpu.settings import quick
from benchmarks.gpu.tensorrt import build_engine
from benchmarks.gpu.variants import Unavailable

PROFILE = Path(__file__).parent / "data" / "ort-1.32-cpu-profile-gpt2-small-fp16.json"


def test_placement_from_a_recorded_profile_separates_fallback_from_shape_arithmetic():
    """A profile onnxruntime 1.32 wrote for amp-compiler's FP16 GPT-2 (small) on the CPU: every node is
    on the CPU provider; read against the CUDA provider, the nodes that move float data are fallback
    and the integer-only ones (Shape and the arithmetic on shapes) are listed apart."""
    events = json.loads(PROFILE.read_text())
    on_cpu = placement_from_profile(events, "CPUExecutionProvider")
    assert on_cpu.nodes > 100 and on_cpu.fallback == [] and on_cpu.shape_like == [] and on_cpu.copies == 0
    cuda = placement_from_profile(events, "CUDAExecutionProvider")
    assert len(cuda.fallback) + len(cuda.shape_like) == cuda.nodes == on_cpu.nodes
    ops = {text.split()[0] for text in cuda.fallback}
    assert {"MatMul", "Gemm", "Cast", "LayerNormalization"} <= ops
    shape_ops = {text.split()[0] for text in cuda.shape_like}
    assert "Shape" in shape_ops and not shape_ops & {"MatMul", "Gemm", "LayerNormalization"}
    assert all(text.endswith("(CPUExecutionProvider)") for text in cuda.fallback + cuda.shape_like)


def test_placement_counts_copies_and_nodes_once():
    def node(name, op, provider, types_):
        return {"cat": "Node", "name": f"{name}_kernel_time",
                "args": {"op_name": op, "provider": provider, "input_type_shape": [{t: [2]} for t in types_]}}

    events = [node("mm", "MatMul", "CUDAExecutionProvider", ["float16"]), node("mm", "MatMul", "CUDAExecutionProvider", ["float16"]),
              node("copy", "MemcpyToHost", "CUDAExecutionProvider", ["float"]),
              node("topk", "TopK", "CPUExecutionProvider", ["float", "int64"]),
              node("shape", "Shape", "CPUExecutionProvider", ["int64"]), {"cat": "Session", "name": "model_run"}]
    where = placement_from_profile(events, "CUDAExecutionProvider")
    assert where == Placement("CUDAExecutionProvider", 4, ["TopK topk (CPUExecutionProvider)"],
                              ["Shape shape (CPUExecutionProvider)"], 1)


def test_at_batch_repeats_rows_along_symbolic_batches_only():
    feeds = {"ids": np.array([[1, 2], [3, 4]]), "scale": np.float32(2.0)}
    out = at_batch(feeds, 3, {"ids": ["batch", 2], "scale": []})
    assert out["ids"].tolist() == [[1, 2], [3, 4], [1, 2]] and out["scale"] == 2.0
    assert at_batch(feeds, 1, {"ids": ["batch", 2]})["ids"].tolist() == [[1, 2]]
    assert at_batch(feeds, 8, {"ids": [2, 2]}) == "input 'ids' has a fixed batch of 2"
    assert at_batch(feeds, 2, {"ids": [2, 2]})["ids"] is feeds["ids"]


_FAKE_WORKER = """
import json, os, sys, time
job = json.loads(sys.stdin.read())
for i, step in enumerate(job["steps"]):
    print(json.dumps({"start": i}), flush=True)
    v = step["variant"]
    if v == "crash":
        os._exit(9)
    if v == "hang":
        time.sleep(120)
    status = "failed" if v == "fail" else "ok"
    print(json.dumps({"row": {**step, "status": status, "error": "boom" if status == "failed" else ""}}), flush=True)
    if v == "fail":
        sys.exit(3)
"""


def test_runner_turns_crashes_timeouts_and_failures_into_rows(tmp_path):
    """Each step comes back once, in order, whatever its worker did: a worker that dies mid-step
    makes a crashed row, one past the time limit a timeout row, one that exits after a failure is
    replaced; the steps after each are measured by a fresh worker."""
    script = tmp_path / "worker.py"
    script.write_text(_FAKE_WORKER)
    names = ["a", "crash", "b", "fail", "c", "hang", "d"]
    steps = [Step("onnx", "m", n) for n in names]
    settings = dataclasses.replace(quick("cpu", str(tmp_path)), step_timeout_s=3.0)
    rows = list(run_steps(steps, settings, log=tmp_path / "log", command=[sys.executable, str(script)]))
    assert [r.variant for r in rows] == names
    assert [r.status for r in rows] == ["ok", "crashed", "ok", "failed", "ok", "timeout", "ok"]
    assert "exit status 9" in rows[1].error and "over 3 s" in rows[5].error


def _rows() -> list[Row]:
    lat = [Timing(1, 2.0, 2.5, 10), Timing(8, 8.0, 9.0, 10)]
    fast = [Timing(1, 1.0, 1.2, 10), Timing(8, 2.0, 2.2, 10)]
    return [
        Row("onnx", "m", "fp32", latency=lat, placement=Placement("CUDAExecutionProvider", 10, [], ["Shape s (CPUExecutionProvider)"], 0),
            accuracy_device=Accuracy(0.99999, 0.001, False, 1)),
        Row("onnx", "m", "amp-fp16", seconds=1.5, latency=fast, memory_bytes=3 << 20,
            placement=Placement("CUDAExecutionProvider", 12, ["TopK t (CPUExecutionProvider)"], [], 2),
            accuracy_device=Accuracy(0.9999, 0.004, False, 1), accuracy_emulated=Accuracy(0.9999, 0.005, False, 1),
            emulator_vs_device=Accuracy(0.99999, 0.002, False, 1)),
        Row("onnx", "m", "ort-fp16", status="failed", error="conversion: IndexError: list index out of range"),
        Row("fx-train", "r", "fp32", seconds=0.0, latency=[Timing(32, 100.0, 110.0, 20)], loss=4.5),
        Row("fx-train", "r", "ampfx-fp16", seconds=9.0, latency=[Timing(32, 50.0, 55.0, 20)], loss=4.5, skipped_steps=1),
    ]


def test_report_shows_speed_ups_fallback_and_failed_rows():
    env = {"command": "python -m benchmarks.gpu --quick", "provider": "cuda", "date": "today", "gpus": ["H200, 580, 141 GiB"],
           "cuda driver API": "13.0", "cpu": "x", "platform": "Linux", "amp-compiler commit": "abc",
           "versions": {"onnxruntime-gpu": "1.31.1"}, "runtime": {}}
    text = report.markdown(env, quick("cuda", "w").to_dict(), _rows())
    assert "| m | 2.00x / 4.00x (1 on CPU) | failed |" in text  # the summary: speed-ups, fallback, the failure
    assert "1.000 / 1.200 ms (2.00x)" in text and "TopK t (CPUExecutionProvider)" in text
    assert "| ort-fp16 | **failed**: conversion: IndexError: list index out of range |" in text
    assert "50.000 / 55.000 ms (2.00x)" in text and "4.5000 (1 skipped)" in text
    assert "- onnx m ort-fp16: failed: conversion: IndexError" in text
    assert "`python -m benchmarks.gpu --quick`" in text and "H200" in text


def test_rows_round_trip_through_json():
    for row in _rows():
        assert Row.from_dict(json.loads(json.dumps(row.to_dict()))) == row


def test_plan_measures_fp32_first_and_every_engine():
    steps = plan(["m"], ["fp32", "amp-fp16"], ["onnx", "tensorrt", "fx"], ["r"])
    assert steps[:5] == [Step("onnx", "m", "fp32"), Step("onnx", "m", "amp-fp16"), Step("tensorrt", "m", "strong:fp32"),
                         Step("tensorrt", "m", "strong:amp-fp16"), Step("tensorrt", "m", "fp16-flag:fp32")]
    assert {s.part for s in steps[5:]} == {"fx-train", "fx-infer"}


def test_resume_measures_only_missing_rows_and_render_writes_the_results_section(tmp_path, capsys):
    """A run whose rows are all in OUT/gpu.json already measures nothing (no worker starts) and keeps
    them; --render writes the Markdown into a results file's gpu section, the rest kept."""
    out = tmp_path / "out"
    env = report.environment("python -m benchmarks.gpu --first", "cpu")
    rows = [Row("onnx", "gpt2-small", "fp32", status="failed", error="x"), Row("onnx", "gpt2-small", "amp-fp16")]
    report.write(out, env, quick("cpu", str(tmp_path)).to_dict(), rows)
    assert main(["--provider", "cpu", "--quick", "--models", "gpt2-small", "--variants", "fp32,amp-fp16",
                 "--parts", "onnx", "--out", str(out), "--resume"]) == 0
    assert "0 steps to measure" in capsys.readouterr().err
    doc = json.loads((out / "gpu.json").read_text())
    assert [Row.from_dict(r) for r in doc["rows"]] == rows
    assert doc["environment"]["command"].startswith("python -m benchmarks.gpu --first && python -m benchmarks.gpu ")
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark\n\nintro\n\n## Headline\n\ntable\n")
    assert main(["--render", str(out / "gpu.json"), "--out", str(tmp_path / "again"), "--results", str(results)]) == 0
    text = results.read_text()
    assert text.index("intro") < text.index(report.SECTION_BEGIN) < text.index(report.SECTION_END) < text.index("## Headline")
    assert "| fp32 | **failed**: x |" in text


class _FakeTensorRT(types.SimpleNamespace):
    """The part of TensorRT's Python API build_engine uses, recording what it was asked."""

    def __init__(self, fp16_flag: bool):
        calls: dict = {}
        flags = types.SimpleNamespace(FP16="fp16") if fp16_flag else types.SimpleNamespace()

        class Network:
            num_inputs = 1

            def get_input(self, i):
                return types.SimpleNamespace(name="x")

        class Config:
            def set_flag(self, flag):
                calls.setdefault("config flags", []).append(flag)

            def add_optimization_profile(self, profile):
                calls["profile"] = profile.shapes

        class Profile:
            def __init__(self):
                self.shapes = {}

            def set_shape(self, name, lo, opt, hi):
                self.shapes[name] = (lo, opt, hi)

        class Builder:
            def __init__(self, logger):
                pass

            def create_network(self, flags):
                calls["network flags"] = flags
                return Network()

            def create_builder_config(self):
                return Config()

            def create_optimization_profile(self):
                return Profile()

            def build_serialized_network(self, network, config):
                return b"plan"

        class Parser:
            def __init__(self, network, logger):
                pass

            def parse_from_file(self, path):
                return True

        super().__init__(
            calls=calls, Logger=type("Logger", (), {"WARNING": 1, "__init__": lambda self, level: None}),
            Builder=Builder, OnnxParser=Parser, BuilderFlag=flags,
            NetworkDefinitionCreationFlag=types.SimpleNamespace(STRONGLY_TYPED=5),
        )


def test_build_engine_builds_strongly_typed_networks_and_weak_fp16_only_where_the_flag_exists(tmp_path):
    shapes = {"x": ((1, 4), (8, 4), (8, 4))}
    trt = _FakeTensorRT(fp16_flag=True)
    assert build_engine(tmp_path / "m.onnx", shapes, trt=trt)[0] == b"plan"
    assert trt.calls["network flags"] == 1 << 5 and "config flags" not in trt.calls and trt.calls["profile"] == shapes
    trt = _FakeTensorRT(fp16_flag=True)
    build_engine(tmp_path / "m.onnx", shapes, fp16=True, trt=trt)
    assert trt.calls["network flags"] == 0 and trt.calls["config flags"] == ["fp16"]
    only_strong = _FakeTensorRT(fp16_flag=False)
    with pytest.raises(Unavailable, match="no weak-typing FP16 flag"):
        build_engine(tmp_path / "m.onnx", shapes, fp16=True, trt=only_strong)
    only_strong.NetworkDefinitionCreationFlag = types.SimpleNamespace()  # strongly typed without asking
    build_engine(tmp_path / "m.onnx", shapes, trt=only_strong)
    assert only_strong.calls["network flags"] == 0
    weak_only = _FakeTensorRT(fp16_flag=True)
    weak_only.NetworkDefinitionCreationFlag = types.SimpleNamespace()
    with pytest.raises(Unavailable, match="no strongly typed networks"):
        build_engine(tmp_path / "m.onnx", shapes, trt=weak_only)


def test_engine_profile_is_read_from_the_onnx_file_even_where_no_cpu_kernel_runs_it(tmp_path):
    """A BF16 conversion does not load on onnxruntime's CPU provider; the TensorRT profile (inputs'
    shapes at the smallest and largest batch, outputs in graph order) comes from the file itself."""
    from benchmarks.gpu.cases import load_case
    from benchmarks.gpu.measure import _profile
    from benchmarks.gpu.variants import produce

    case = load_case("gpt2-small", tmp_path)
    path, _, _ = produce("amp-bf16", case, "cuda", tmp_path)
    profile, by_batch, outputs = _profile(case, path, (1, 8))
    seq = case.feeds["input_ids"].shape[1]
    assert profile == {"input_ids": ((1, seq), (8, seq), (8, seq))}
    assert sorted(by_batch) == [1, 8] and by_batch[8]["input_ids"].dtype == np.int64
    assert outputs == ["logits"]
