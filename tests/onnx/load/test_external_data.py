"""Models with external data: weights stay on disk during a conversion and the output is written
with external data (the path a model over 2 GB takes, exercised on a small one).

The benchmark (``python -m benchmarks.compare --size full``) runs the same path on a generated
~2.5 GB model and reports its time and peak memory; tests assert behaviour, never those numbers.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.errors import ModelLoadError, OutputError
from amp_compiler.onnx.load.deferred import DeferredTensor
from amp_compiler.onnx.load.files import DEFER_MIN_BYTES, load_model, load_model_deferred
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from amp_compiler.sizes import format_bytes
from benchmarks.generate import transformer_inputs, transformer_model


def _saved(folder: Path, hidden: int = 128, blocks: int = 2) -> tuple[Path, onnx.ModelProto]:
    """A generated decoder saved with its weights in ``m.onnx.data`` (the large ones are >= 64 KiB)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = transformer_model(hidden=hidden, heads=2, blocks=blocks, external_data=folder / "m.onnx.data")
    path = folder / "m.onnx"
    onnx.save(model, path)
    return path, model


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    return _saved(tmp_path_factory.mktemp("ext") / "model")[0]


def _cli(*argv) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def test_large_weights_stay_on_disk_and_the_rest_is_validated(saved):
    loaded = load_model_deferred(saved)
    assert loaded.deferred and loaded.files == [saved, saved.with_name("m.onnx.data")]
    external = [t for t in loaded.model.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    inline = [t for t in loaded.model.graph.initializer if t.data_location != TensorProto.EXTERNAL]
    assert external and all(len(t.external_data) and not t.raw_data for t in external)
    assert all(np.prod(t.dims) * 4 >= DEFER_MIN_BYTES for t in external)
    assert inline and all(np.prod(t.dims) * 4 < DEFER_MIN_BYTES for t in inline)  # biases, norms, shapes
    assert set(loaded.locations) == {"m.onnx.data"}
    assert loaded.locations["m.onnx.data"] == Path(os.path.realpath(saved.with_name("m.onnx.data")))
    full = loaded.load()  # reads the rest: the same model load_model gives
    assert full.SerializeToString() == load_model(saved).SerializeToString()


def test_deferred_conversion_decides_and_converts_as_the_in_memory_one(saved):
    eager = convert(load_model(saved), probe=False)
    deferred = convert(saved, probe=False)
    assert deferred.output is not None and eager.output is None
    assert deferred.decisions == eager.decisions
    assert (deferred.casts_inserted, deferred.constants_converted) == (eager.casts_inserted, eager.constants_converted)
    # Unconverted weights are still on disk after the conversion; converted ones are in memory.
    kinds = {type(v.const_value) for v in deferred.output.ir_model.graph.initializers.values()}
    assert DeferredTensor not in kinds  # every large weight of this model was converted to FP16
    assert deferred.model.SerializeToString() == eager.model.SerializeToString()  # built on request


def test_cli_writes_external_data_that_onnxruntime_loads_and_outputs_match(saved, tmp_path):
    out = tmp_path / "m.fp16.onnx"
    code, stdout, err = _cli("convert", saved, "-o", out)
    assert code == 0, err
    assert "fp16 model written" in stdout
    data = tmp_path / "m.fp16.onnx.data"
    assert data.is_file() and out.stat().st_size < data.stat().st_size
    # the size line counts the data files, before and after
    size_in = sum(f.stat().st_size for f in saved.parent.iterdir() if f.name.startswith(saved.name))
    size_out = out.stat().st_size + data.stat().st_size
    assert f"size {format_bytes(size_in)} -> {format_bytes(size_out)}" in stdout
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    proto = onnx.load(out, load_external_data=False)
    moved = [t for t in proto.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert moved and {e.value for t in moved for e in t.external_data if e.key == "location"} == {data.name}
    # onnxruntime loads it from the path (reading the data file itself) and runs it.
    fp32 = load_model(saved)
    feeds = transformer_inputs(fp32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)[0]
    reference = run_onnxruntime(fp32, feeds)[0]
    acc = compare("y", reference, got)
    assert acc.finite and acc.cosine > 0.999 and acc.error_of_range < 0.02
    # Read back through the same validated loader: a valid model, exactly the in-memory conversion's.
    back = load_model(out)
    validate(back)
    emulated = run_onnxruntime(emulate(back), feeds)[0]
    assert compare("y", reference, emulated).cosine > 0.999
    eager = convert(fp32, probe=False).model
    for t in eager.graph.initializer:
        u = next(x for x in back.graph.initializer if x.name == t.name)
        np.testing.assert_array_equal(numpy_helper.to_array(u), numpy_helper.to_array(t))
    assert [n.SerializeToString() for n in back.graph.node] == [n.SerializeToString() for n in eager.graph.node]


def test_bf16_through_the_same_path(saved, tmp_path):
    out = tmp_path / "m.bf16.onnx"
    code, _, err = _cli("convert", saved, "-o", out, "--target", "bf16", "-q")
    assert code == 0, err
    fp32 = load_model(saved)
    feeds = transformer_inputs(fp32)
    got = run_onnxruntime(emulate(load_model(out)), feeds)[0]
    assert compare("y", run_onnxruntime(fp32, feeds)[0], got).cosine > 0.999


def test_weights_kept_fp32_are_copied_from_the_input_file(tmp_path):
    path, _ = _saved(tmp_path / "model")
    result = convert(path, block_ops=["MatMul"], probe=False)  # nothing converted: every weight stays on disk
    kinds = [type(v.const_value) for v in result.output.ir_model.graph.initializers.values()]
    assert DeferredTensor in kinds
    out = tmp_path / "o.onnx"
    result.save(out, input_files=[path, path.with_name("m.onnx.data")])
    back, reference = load_model(out), load_model(path)
    for t in reference.graph.initializer:
        u = next(x for x in back.graph.initializer if x.name == t.name)
        np.testing.assert_array_equal(numpy_helper.to_array(u), numpy_helper.to_array(t))


def test_a_deferred_weight_inside_a_subgraph(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((128, 128)).astype(np.float32) * 0.1
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w_then"], ["t"])], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, 128])],
        [numpy_helper.from_array(w, "w_then")],
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [4, 128])]
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 128]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 128])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "if.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True, location="if.data", size_threshold=0)
    assert load_model_deferred(path).deferred
    out = tmp_path / "if.fp16.onnx"
    code, _, err = _cli("convert", path, "-o", out, "-q")
    assert code == 0, err
    x = rng.standard_normal((4, 128)).astype(np.float32)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x, "c": np.array(True)})[0]
    assert compare("y", x @ w, got).cosine > 0.999


def test_the_output_data_file_never_overwrites_the_inputs(tmp_path):
    path, _ = _saved(tmp_path / "model")
    data = path.with_name("m.onnx.data")
    before = data.stat().st_size
    # Converting in place (--force) would write m.onnx.data: the input's own weights. Refused.
    code, _, err = _cli("convert", path, "-o", path, "--force")
    assert code == 2 and "would overwrite the input model's files" in err
    assert data.stat().st_size == before
    code, _, err = _cli("convert", path, "-o", data)
    assert code == 2 and "external data" in err


def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    import amp_compiler.onnx.write.save as io  # the module that renames the written files into place

    path, _ = _saved(tmp_path / "model")
    result = convert(path, probe=False)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    real = os.replace

    def fail_on_model(a, b):
        if str(b).endswith(".onnx"):
            raise OSError(28, "No space left on device")
        real(a, b)

    monkeypatch.setattr(io.os, "replace", fail_on_model)
    with pytest.raises(OutputError, match="cannot write"):
        result.save(out_dir / "o.onnx")
    assert list(out_dir.iterdir()) == []  # no model, no data file, no temporary file
    monkeypatch.undo()
    # The result is intact: saving works now, and gives the in-memory conversion's weights.
    result.save(out_dir / "o.onnx")
    eager = convert(load_model(path), probe=False).model
    back = load_model(out_dir / "o.onnx")
    for t in eager.graph.initializer:
        u = next(x for x in back.graph.initializer if x.name == t.name)
        np.testing.assert_array_equal(numpy_helper.to_array(u), numpy_helper.to_array(t))
    # A second failure, over that output, keeps the earlier files as they were.
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    monkeypatch.setattr(io.os, "replace", fail_on_model)
    with pytest.raises(OutputError):
        result.save(out_dir / "o.onnx")
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before


def test_deferred_weights_are_still_validated(tmp_path):
    path, model = _saved(tmp_path / "model")
    data = path.with_name("m.onnx.data")
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size - 4)  # the last weight is now short
    with pytest.raises(ModelLoadError, match="shorter than declared"):
        convert(path, probe=False)
    escaping = onnx.load(path, load_external_data=False)
    t = next(t for t in escaping.graph.initializer if t.data_location == TensorProto.EXTERNAL)
    for e in t.external_data:
        if e.key == "location":
            e.value = "../m.onnx.data"
    onnx.save(escaping, path)
    with pytest.raises(ModelLoadError, match="escapes the model's folder"):
        convert(path, probe=False)


def test_a_model_without_external_data_is_converted_in_memory_as_before(tmp_path):
    model = transformer_model(60)
    path = tmp_path / "plain.onnx"
    onnx.save(model, path)
    result = convert(path, probe=False)
    assert result.output is None
    assert result.model.SerializeToString() == convert(model, probe=False).model.SerializeToString()
    assert result.save(tmp_path / "o.onnx") is None and not (tmp_path / "o.onnx.data").exists()
    assert onnx.load(tmp_path / "o.onnx").SerializeToString() == result.model.SerializeToString()


@pytest.mark.parametrize("target", [np.float16, ml_dtypes.bfloat16], ids=["fp16", "bf16"])
def test_a_weight_on_disk_is_written_converted_a_chunk_at_a_time(tmp_path, monkeypatch, target):
    """DeferredTensor.tofile_as gives the bytes numpy's astype gives (out-of-range values infinite),
    across chunk boundaries, and refuses a file that shrank since it was validated."""
    monkeypatch.setattr("amp_compiler.onnx.load.deferred._COPY_CHUNK", 4096)  # 1,024 values a chunk
    values = np.random.default_rng(3).standard_normal((37, 100)).astype(np.float32) * 100
    values[0, :3] = [1e38, -1e38, np.nan]
    data = tmp_path / "w.data"
    data.write_bytes(b"\0" * 24 + values.tobytes())
    external = ir.ExternalTensor(
        "w.data", 24, values.nbytes, ir.DataType.FLOAT, shape=ir.Shape(values.shape), name="w", base_dir=tmp_path
    )
    tensor = DeferredTensor(external, data)
    out = io.BytesIO()
    tensor.tofile_as(out, np.dtype(target))
    with np.errstate(over="ignore"):
        assert out.getvalue() == values.astype(target).tobytes()
    data.write_bytes(b"\0" * 24 + values.tobytes()[:-4])
    with pytest.raises(ModelLoadError, match="shorter than declared"):
        tensor.tofile_as(io.BytesIO(), np.dtype(target))
