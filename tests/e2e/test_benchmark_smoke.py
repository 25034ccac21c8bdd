"""The benchmark's smallest setting runs end to end and writes its report (numbers are not asserted)."""

from __future__ import annotations

import subprocess
import sys

from tests.support import REPO_ROOT

ROOT = REPO_ROOT


def test_benchmark_smallest_setting_writes_a_report(tmp_path):
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.compare", "--size", "smallest", "--out", str(out),
         "--latency-provider", "CPUExecutionProvider"],  # the GPU latency code path, on the CPU
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
    assert "Command: `python -m benchmarks.compare --size smallest" in text
    latency = text.split("## Latency on CPUExecutionProvider", 1)[1].split("## Notes", 1)[0]
    rows = [line for line in latency.splitlines() if line.startswith("| generated-1000 |")]
    assert [r.split(" | ")[1] for r in rows][:2] == ["fp32", "amp-compiler"]
    assert all(" ms" in r.split(" | ")[3] for r in rows)  # batch 8 runs: the generated batch is symbolic
    assert all(r.rstrip(" |").split(" | ")[-1].startswith("0 of ") for r in rows)  # all on the provider


def test_latency_at_each_batch_and_where_nodes_ran(tmp_path):
    import numpy as np
    import onnx

    from benchmarks.generate import transformer_model
    from benchmarks.latency import measure, nodes_elsewhere

    dynamic, static = tmp_path / "dynamic.onnx", tmp_path / "static.onnx"
    onnx.save(transformer_model(100, batch="batch"), dynamic)
    onnx.save(transformer_model(100), static)
    latencies, where = measure(dynamic, "CPUExecutionProvider", (1, 8), repeats=3)
    assert [lat.batch for lat in latencies] == [1, 8]
    assert all(lat.median_ms is not None and lat.median_ms > 0 for lat in latencies)
    assert where.nodes > 0 and where.elsewhere == []
    latencies, _ = measure(static, "CPUExecutionProvider", (1, 8), repeats=3)
    assert latencies[0].median_ms is not None
    assert latencies[1].median_ms is None and "fixed" in latencies[1].note
    # A profile where one node fell back to the CPU: it is named, with its op and provider.
    events = [
        {"cat": "Node", "name": "mm_kernel_time", "args": {"provider": "CUDAExecutionProvider", "op_name": "MatMul"}},
        {"cat": "Node", "name": "clip_kernel_time", "args": {"provider": "CPUExecutionProvider", "op_name": "Clip"}},
        {"cat": "Session", "name": "model_run", "args": {}},
    ]
    assert nodes_elsewhere(events, "CUDAExecutionProvider") == (2, ["Clip clip (CPUExecutionProvider)"])
    assert np.isfinite(latencies[0].median_ms)


def test_cold_benchmark_times_whole_processes_and_writes_its_section(tmp_path):
    """benchmarks.cold on the demo model: one row with every column filled, written into its own
    section of a results file (in place of the old one; the rest of the file kept)."""
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark\n\nintro\n\n## Headline\n\ntable\n")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.cold", "--runs", "1", "--models", "demo", "--results", str(results)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| demo |"))
    assert "failed" not in row and row.count(" MB") + row.count(" kB") >= 4  # file and three peak RSS cells
    text = results.read_text()
    assert text.index("intro") < text.index("## Cold processes") < text.index("## Headline")
    from benchmarks.cold import write_section

    write_section(results, "## Cold processes\n\nnew")
    text = results.read_text()
    assert text.count("## Cold processes") == 1 and "new" in text and "| demo |" not in text and "table" in text


def test_fp8_table_row_runs_and_counts_a_graph_output_gemm_as_fp8(tmp_path):
    """One row of the FP8 table (no ModelOpt needed: an anchor file without the model gives dashes);
    a GEMM that writes a graph output (renamed by the conversion, a Cast makes the output) counts."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.fp8_table", "--models", "gpt2-small", "--anchor", str(tmp_path / "none.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| gpt2-small | 0.1 |")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[6] == "100%" and cells[7] == "13/0/0"  # the LM head (graph output 'logits') included
    assert cells[11:] == ["-"] * 9


def test_fp8_tolerance_table_rows_meet_their_tolerances(tmp_path):
    """Two rows of the FP8 --tolerance table (no ModelOpt needed): each met on the calibration
    batches, the FP8 share no smaller at the larger tolerance."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.fp8_tolerance_table", "--models", "mlp-softmax", "--tolerances",
         "0.02,0.1", "--anchor", str(tmp_path / "none.json")],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| mlp-softmax |")]
    assert [r[1] for r in rows] == ["0.02", "0.1"]
    assert all("not met" not in r[2] for r in rows)
    shares = [float(r[6].rstrip("%")) for r in rows]
    assert shares[0] <= shares[1] and shares[1] > 0
    assert rows[0][10:] == ["-", "-"]


def test_gpu_benchmark_quick_on_the_cpu_writes_every_step_as_a_row(tmp_path):
    """python -m benchmarks.gpu --provider cpu --quick on one reduced model: the GPU code path (I/O
    binding, the profile's placement, accuracy next to the emulator's) on the CPU provider. Every
    planned step is a row; variants that cannot run here (BF16 on onnxruntime's CPU provider, a tool
    or TensorRT not installed) are rows that say why, and the run still succeeds."""
    import importlib.util
    import json

    out = tmp_path / "out"
    variants = ["fp32", "amp-fp16", "amp-bf16", "onnxconverter-common", "modelopt-autocast"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--provider", "cpu", "--quick", "--models", "gpt2-small",
         "--variants", ",".join(variants), "--parts", "onnx,tensorrt", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "gpu.json").read_text())
    assert doc["schema"] == 1 and doc["environment"]["provider"] == "cpu"
    assert doc["environment"]["command"].startswith("python -m benchmarks.gpu --provider cpu --quick")
    assert {"gpus", "cuda driver API", "versions", "runtime", "amp-compiler commit"} <= set(doc["environment"])
    rows = doc["rows"]
    engines = ["strong:" + v for v in variants] + ["fp16-flag:fp32"]
    assert [(r["part"], r["variant"]) for r in rows] == [("onnx", v) for v in variants] + [("tensorrt", e) for e in engines]
    assert all(r["status"] in ("ok", "failed", "unavailable", "skipped") for r in rows)
    assert all(r["error"] for r in rows if r["status"] != "ok")
    by = {r["variant"]: r for r in rows if r["part"] == "onnx"}
    for name in ("fp32", "amp-fp16", "onnxconverter-common"):
        row = by[name]
        assert row["status"] == "ok", row
        assert [t["batch"] for t in row["latency"]] == [1, 8]
        assert all(t["median_ms"] > 0 and t["p90_ms"] >= t["median_ms"] and t["runs"] == 10 for t in row["latency"])
        assert row["providers"] == ["CPUExecutionProvider"]
        assert row["placement"]["nodes"] > 50 and row["placement"]["fallback"] == []
        assert row["accuracy_device"]["cosine"] > 0.999
    assert by["amp-fp16"]["accuracy_emulated"]["cosine"] > 0.999 and by["amp-fp16"]["emulator_vs_device"] is not None
    assert by["amp-fp16"]["seconds"] > 0 and by["fp32"]["accuracy_emulated"] is None
    assert any(r["status"] != "ok" for r in rows)  # at least one variant failed here, as a row
    if importlib.util.find_spec("tensorrt") is None:
        assert all(r["status"] == "unavailable" and "tensorrt" in r["error"] for r in rows if r["part"] == "tensorrt")
    text = (out / "gpu.md").read_text()
    assert "### gpt2-small" in text and "### TensorRT" in text and "| amp-fp16 | ok |" in text


def test_gpu_benchmark_fx_steps_on_the_cpu():
    """The FX part's training step (prepare_training, BF16) and compile backend (inner eager) on a
    reduced BERT at --quick settings: timed, with the loss of the last step."""
    from benchmarks.gpu.fx import fx_step
    from benchmarks.gpu.rows import Step
    from benchmarks.gpu.settings import quick

    settings = quick("cpu", "unused")
    train = fx_step(Step("fx-train", "bert-base-small", "ampfx-bf16"), settings)
    assert train.status == "ok", train.error
    assert train.latency[0].batch == settings.fx_train_batch and train.latency[0].runs == settings.fx_steps
    assert train.latency[0].median_ms > 0 and train.loss is not None and train.seconds > 0
    infer = fx_step(Step("fx-infer", "bert-base-small", "ampfx.compile-fp16"), settings)
    assert infer.status == "ok", infer.error
    assert infer.note == "inner backend eager" and infer.latency[0].median_ms > 0
    unknown = fx_step(Step("fx-infer", "bert-base-small", "autocast-fp8"), settings)
    assert unknown.status == "skipped" and "unknown fx-infer variant" in unknown.error


def test_autocast_table_writes_its_section_and_keeps_the_rest(tmp_path):
    """One model: amp-compiler's row is measured (AutoCast's too where ModelOpt imports, else says
    why), and the table goes between its markers without touching the file's other sections."""
    out = tmp_path / "RESULTS.md"
    out.write_text("# Results\n\n<!-- cold-processes:begin -->\nkept\n<!-- cold-processes:end -->\n")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.autocast_table", "--models", "mlp-softmax", "--results", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "<!-- cold-processes:begin -->\nkept\n<!-- cold-processes:end -->" in text
    section = text.split("<!-- autocast:begin", 1)[1].split("<!-- autocast:end -->", 1)[0]
    assert "## amp-compiler for TensorRT vs ModelOpt AutoCast" in section
    (ours,) = [line for line in section.splitlines() if line.startswith("| mlp-softmax | rule | amp-compiler |")]
    assert "100.0%" in ours and "yes; runs: yes" in ours
    assert any(line.startswith("| mlp-softmax | rule | autocast |") for line in section.splitlines())


def test_a_new_section_never_lands_inside_another_benchmarks_markers(tmp_path):
    """A heading inside another benchmark's markers is not where a new section goes: the first free one is."""
    from benchmarks.cold import write_section

    results = tmp_path / "RESULTS.md"
    results.write_text("# R\n\nintro\n\n<!-- x:begin (cmd) -->\n## X\n\nx\n<!-- x:end -->\n\n## Headline\n\nh\n")
    write_section(results, "## New\n\nn", "<!-- new:begin -->", "<!-- new:end -->")
    text = results.read_text()
    assert text.index("<!-- x:end -->") < text.index("<!-- new:begin -->") < text.index("## Headline")


def test_tf32_table_row_shows_what_tf32_costs_a_product_kept_fp32():
    """The default conversion of cqt-log keeps its signal path's Convs FP32; read as TF32 they err as FP16 ones
    do, and written TF32-proof (``--fp32-products split``) as exact FP32 ones."""
    from benchmarks.tf32_table import Case, row

    cells = [c.strip() for c in row(Case("cqt-log")).strip("|").split("|")]
    assert cells[:3] == ["cqt-log", "default", "3 (policy.high.signal-path)"]
    exact, tf32, fp16, split = float(cells[3]), float(cells[4].strip("*")), float(cells[5]), float(cells[6])
    assert tf32 > 30 * exact and tf32 > 0.8 * fp16 and split < 1.05 * exact


def test_fresh_architectures_rows_of_a_text_and_a_vision_model_meet_the_goal():
    """benchmarks.fresh_architectures on its smallest text (bloom) and vision (resnet) architectures:
    exported, converted with the defaults, measured on held-out inputs; every Tensor Core op in FP16,
    no NaN/Inf, each output within 2% of its range or flagged by the conversion."""
    import numpy as np

    from benchmarks.fresh_architectures import held_out_inputs, row, table_line, verdict
    from benchmarks.fresh_specs import FRESH

    images = held_out_inputs(FRESH["resnet"])
    assert [tuple(s) for s in images] == [("pixel_values",)] * 3
    noise, smooth, normalised = (s["pixel_values"] for s in images)
    assert noise.min() < -2 and 0 <= smooth.min() < smooth.max() <= 1
    assert normalised.min() < 0 < normalised.max() and not np.allclose(smooth, normalised)
    for name, family in (("bloom", "text"), ("resnet", "vision")):
        r = row(FRESH[name])
        assert (r.model, r.family) == (name, family)
        assert r.tc_total > 0 and r.tc_low == r.tc_total and r.tc_bf16 == 0
        assert r.stated is not None and 0 < r.stated < 0.02 and r.flagged == ()
        (out,) = r.outputs
        assert out.name == "logits" and out.nonfinite == 0 and out.top1 is not None and out.top1 > 0.9
        assert 0 < out.error_of_range < 0.02 and out.cosine > 0.999 and 0 < out.rel_l2 < 0.01
        assert r.finite and r.misses == () and r.goal_met and verdict(r) == "ok"
        assert "batch=1" in r.probe and r.seconds > 0
        cells = [c.strip() for c in table_line(r).strip("|").split("|")]
        assert len(cells) == 13 and cells[:3] == [name, family, f"{r.tc_total}/{r.tc_total}"] and cells[-1] == "ok"


def test_fresh_architectures_goal_counts_an_unflagged_error_as_a_miss():
    """The goal's judgement: past 2% of range (or cosine < 0.999) and flagged is met, unflagged is a
    miss, NaN/Inf fails whether flagged or not."""
    from benchmarks.fresh_architectures import Measured, Row, verdict

    def judged(measured: Measured, flagged: tuple[str, ...]) -> tuple[str, bool]:
        r = Row("m", "text", 4, 4, 0, 0.001, flagged, (measured,), "batch=1", 0.1)
        return verdict(r), r.goal_met

    within = Measured("logits", 0.019, 1e-3, 0.9995, 0, 1.0)
    wide = Measured("logits", 0.021, 1e-3, 0.9999, 0, 1.0)
    turned = Measured("logits", 0.001, 0.05, 0.998, 0, 1.0)
    broken = Measured("logits", float("inf"), float("inf"), -1.0, 3, 0.5)
    assert judged(within, ()) == ("ok", True)
    assert judged(wide, ("logits",)) == ("flagged", True)
    assert judged(wide, ()) == ("**miss** (logits)", False)
    assert judged(turned, ()) == ("**miss** (logits)", False)
    assert judged(wide, ("other",)) == ("**miss** (logits)", False)
    assert judged(broken, ("logits",)) == ("**NaN/Inf**", False)
