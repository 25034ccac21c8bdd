"""The weight-free description onnx's checker and shape inference get for a large model: which weights
it describes, and that a conversion through it gives the same bytes, and refuses the same models
(tests/e2e/test_hostile_inputs.py runs every hostile input both ways too)."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from amp_compiler import convert
from amp_compiler.onnx.load import skeleton
from models import catalog
from tests.support.onnx_builders import F32, tensor, vi, weights


@pytest.fixture
def describe_all(monkeypatch):
    """Describe every weight of MIN_ELEMENTS or more, however little that saves."""
    monkeypatch.setattr(skeleton, "MIN_SAVED_BYTES", 0)


def _model(w: onnx.TensorProto) -> onnx.ModelProto:
    """A MatMul by ``w``, not checked (some cases are invalid on purpose)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", w.name], ["y"])], "g", [vi("x", F32, [2, 64])], [vi("y", F32, [2, 32])], [w]
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    return m


def test_plain_float_weights_are_described_by_type_and_shape(describe_all):
    big, small = tensor("w", weights((64, 32))), tensor("b", weights((32,)))
    m = _model(big)
    m.graph.initializer.append(small)
    described = skeleton.weight_free(m)
    assert described is not None
    w, b = described.graph.initializer
    assert (w.name, list(w.dims), w.data_type, w.raw_data) == ("w", [64, 32], TensorProto.FLOAT, b"")
    assert w.data_location == TensorProto.EXTERNAL
    assert b == small  # under MIN_ELEMENTS: shape inference may read such values
    assert described.graph.node == m.graph.node and described.opset_import == m.opset_import
    assert m.graph.initializer[0] == big  # the model itself is untouched


@pytest.mark.parametrize(
    "change",
    [
        lambda w: w.float_data.append(1.0),  # two value fields: the checker refuses it
        lambda w: setattr(w, "raw_data", w.raw_data[:-4]),  # too few bytes for its shape
        lambda w: setattr(w, "data_type", TensorProto.INT32),  # not a float weight
    ],
    ids=["two-fields", "short", "int"],
)
def test_weights_the_checker_must_see_are_passed_whole(describe_all, change):
    w = tensor("w", weights((64, 32)))
    change(w)
    assert skeleton.weight_free(_model(w)) is None  # nothing described: the model goes as it is


def test_typed_field_weights_are_passed_whole(describe_all):
    w = numpy_helper.from_array(weights((64, 32)), "w")
    w.ClearField("raw_data")
    w.float_data.extend(weights((64, 32)).ravel().tolist())
    assert skeleton.weight_free(_model(w)) is None


def test_small_weights_are_not_worth_a_description():
    assert skeleton.weight_free(_model(tensor("w", weights((64, 32))))) is None  # 8 kB < MIN_SAVED_BYTES


@pytest.mark.parametrize("entry", catalog.entries("small", "architecture")[:4], ids=lambda e: e.name)
def test_conversion_through_the_description_is_the_same(monkeypatch, entry):
    fp32 = catalog.load(entry)
    whole = convert(fp32, probe=False).model.SerializeToString()
    calls = []
    real = skeleton.weight_free

    def counted(m):
        calls.append(real(m))
        return calls[-1]

    monkeypatch.setattr(skeleton, "MIN_SAVED_BYTES", 0)
    monkeypatch.setattr("amp_compiler.onnx.load.typed.weight_free", counted)
    assert convert(fp32, probe=False).model.SerializeToString() == whole
    assert calls and calls[0] is not None  # the description was used


def test_a_described_model_with_a_structural_fault_is_refused_the_same(describe_all):
    from amp_compiler.errors import ModelLoadError

    m = _model(tensor("w", weights((64, 32))))
    m.graph.node.append(helper.make_node("Relu", ["nowhere"], ["z"]))
    with pytest.raises(ModelLoadError, match="nowhere"):
        convert(m, probe=False)
