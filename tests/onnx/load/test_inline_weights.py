"""Large weights inside a model file left in the file (amp_compiler.onnx.load.inline_weights): the model parses
as if they were external data in the file itself, converts to the same bytes as when it is read whole, and
is written as one file; anything but the plain layout, and any framing that does not add up, is parsed
as a whole. (``python -m benchmarks.hash_catalog --from-files`` checks the same on every catalog model.)
"""

from __future__ import annotations

import random

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load import files
from amp_compiler.onnx.load.inline_weights import skim
from amp_compiler.onnx.write import inline_output
from amp_compiler.runtime.runner import InProcessRunner
from benchmarks.generate import transformer_inputs, transformer_model
from tests.support.onnx_builders import F32, model, tensor, vi, weights


def _save(tmp_path, m: onnx.ModelProto, name: str = "m.onnx"):
    path = tmp_path / name
    onnx.save(m, path)
    return path


def _read_back(m: onnx.ModelProto, folder) -> onnx.ModelProto:
    from onnx import external_data_helper

    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            external_data_helper.load_external_data_for_tensor(t, str(folder))
            del t.external_data[:]
            t.ClearField("data_location")
    return m


def test_large_weights_become_references_into_the_file_itself(tmp_path):
    m = transformer_model(blocks=2, hidden=64)
    path = _save(tmp_path, m)
    skimmed = onnx.ModelProto.FromString(skim(path, 4096))
    external = [t for t in skimmed.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert external
    for t in external:
        fields = {e.key: e.value for e in t.external_data}
        assert fields["location"] == "m.onnx" and int(fields["length"]) >= 4096 and not t.raw_data
    small = [t for t in skimmed.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert small and all(t.ByteSize() < 4096 + 200 for t in small)
    assert _read_back(skimmed, tmp_path).SerializeToString() == m.SerializeToString()


def test_a_model_without_large_weights_is_not_skimmed(tmp_path):
    assert skim(_save(tmp_path, transformer_model(blocks=2)), 1 << 20) is None


def test_typed_data_fields_and_duplicate_graphs_are_left_to_protobuf(tmp_path):
    w = weights((64, 64))
    typed = onnx.TensorProto(name="w", data_type=F32, dims=[64, 64])
    typed.float_data.extend(w.ravel().tolist())
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", F32, [2, 64])], [vi("y", F32, [2, 64])],
              [typed])
    assert skim(_save(tmp_path, m), 1024) is None  # float_data: not the plain layout
    m2 = model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", F32, [2, 64])], [vi("y", F32, [2, 64])],
               [tensor("w", w)])
    data = m2.SerializeToString()
    graph_field = onnx.ModelProto(graph=m2.graph).SerializeToString()
    path = tmp_path / "twice.onnx"
    path.write_bytes(data + graph_field)  # protobuf merges two graph fields
    assert skim(path, 1024) is None
    packed = onnx.TensorProto(name="q", data_type=onnx.TensorProto.INT4, dims=[8192], raw_data=bytes(4096))
    graph = helper.make_graph([helper.make_node("Identity", ["q"], ["y"])], "g", [], [vi("y", onnx.TensorProto.INT4)],
                              [packed])
    assert skim(_save(tmp_path, helper.make_model(graph), "int4.onnx"), 1024) is None  # 4-bit: left as it is


def test_mangled_files_never_raise(tmp_path):
    data = bytearray(_save(tmp_path, transformer_model(blocks=1, hidden=64)).read_bytes())
    rng = random.Random(0)
    for k in range(200):
        mangled = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            mangled[rng.randrange(len(mangled))] = rng.randrange(256)
        if k % 3 == 0:
            mangled = mangled[: rng.randrange(len(mangled))]
        path = tmp_path / "mangled.onnx"
        path.write_bytes(bytes(mangled))
        out = skim(path, 1024)
        assert out is None or isinstance(out, bytes)
        try:  # what is skimmed goes through the same checks as a file read whole
            files.load_model_deferred(path, min_bytes=1024, skim_file_bytes=0)
        except ModelLoadError:
            pass


@pytest.mark.parametrize("streamed", [True, False], ids=["weights-streamed", "one-serialization"])
@pytest.mark.parametrize("target", ["fp16", "bf16"])
def test_a_skimmed_model_converts_to_the_same_bytes_in_one_file(tmp_path, monkeypatch, target, streamed):
    """Written as one file: each large weight streamed into the file when its turn comes (inline_output),
    or the whole model serialized at once: the same bytes as converting the model read whole."""
    monkeypatch.setattr(inline_output, "STREAM_MIN_BYTES", 4096 if streamed else 1 << 40)
    spliced: list[int] = []
    splice = inline_output._splice
    monkeypatch.setattr(inline_output, "_splice", lambda skeleton, weights: spliced.append(len(weights)) or splice(
        skeleton, weights))
    m = transformer_model(blocks=3, hidden=64, batch="B")
    path = _save(tmp_path, m)
    loaded = files.load_model_deferred(path, min_bytes=4096, check=False, skim_file_bytes=0)
    assert loaded.inline and loaded.locations and loaded.files == [path]
    result = convert(loaded, target=target, probe=False)
    assert result.output is not None and result.output.inline
    out = tmp_path / "out.onnx"
    assert result.save(out, input_files=[path]) is None
    expected = convert(m, target=target, probe=False).model.SerializeToString()
    assert out.read_bytes() == expected and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "out.onnx"]
    assert result.model.SerializeToString() == expected
    assert (spliced[0] > 0) == streamed


def test_a_large_model_file_is_skimmed_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "SKIM_MIN_FILE_BYTES", 1024)
    path = _save(tmp_path, transformer_model(blocks=2, hidden=256))
    assert files.load_model_deferred(path, check=False).inline
    reloaded = files.load_model_deferred(path, check=False)
    full = onnx.load(path)
    assert reloaded.load().SerializeToString() == full.SerializeToString()  # read back as the file holds it
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(reloaded.model.graph.initializer[-1]),
                                  onnx.numpy_helper.to_array(full.graph.initializer[-1]))


def test_fp8_reads_weights_left_in_the_file_first(tmp_path):
    """--target fp8 needs every weight in memory (its choice runs the model): a skimmed file's are read in."""
    m = transformer_model(blocks=2, hidden=64)
    path = _save(tmp_path, m)
    samples = [transformer_inputs(m, seed=k) for k in range(2)]
    loaded = files.load_model_deferred(path, min_bytes=4096, check=False, skim_file_bytes=0)
    assert loaded.inline
    with InProcessRunner() as runner:
        skimmed = convert(loaded, target="fp8", samples=samples, runner=runner, probe=False)
        whole = convert(m, target="fp8", samples=samples, runner=runner, probe=False)
    assert skimmed.output is None
    assert skimmed.model.SerializeToString() == whole.model.SerializeToString()
