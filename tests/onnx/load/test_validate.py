"""Valid models onnx_ir cannot read as they are still convert: sparse tensors, stale value_info.

Sparse initializers and Constant(sparse_value) are made dense first (onnxruntime does so at load
anyway), within a size limit. value_info that contradicts inference: an element type makes the
model invalid (onnxruntime refuses it too); a shape gives way to inference's, in the IR and the output.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from amp_compiler import convert
from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load.sparse import densify
from amp_compiler.onnx.measure.checks import run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from tests.support.onnx_builders import F32, tensor, vi, weights


def _make(nodes, inputs, outputs, inits=(), sparse=(), value_info=(), opset=17) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    g.sparse_initializer.extend(sparse)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)  # valid (full_check's inference does not type sparse initializers)
    return m


def _sparse(name, dense: np.ndarray, linear: bool) -> onnx.SparseTensorProto:
    flat = np.flatnonzero(dense)
    idx = flat if linear else np.stack(np.unravel_index(flat, dense.shape), axis=1)
    return helper.make_sparse_tensor(tensor(name, dense.ravel()[flat]), tensor(f"{name}_idx", idx.astype(np.int64)),
                                     list(dense.shape))


def _w(k: int = 4) -> np.ndarray:
    w = weights((k, 3))
    w[w < 0.1] = 0  # about half zeros
    return w


@pytest.mark.parametrize("linear", [True, False], ids=["linear-indices", "coordinate-indices"])
def test_a_sparse_initializer_converts_and_computes_what_onnxruntime_does(linear):
    w = _w(16)  # K = 16: a shorter product of x stays FP32 (policy.high.raw-small-product)
    m = _make([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [vi("x", F32, [2, 16])], [vi("y", F32, [2, 3])],
              sparse=[_sparse("W", w, linear)])
    result = convert(m, probe=False)
    assert {d.node: d.precision for d in result.decisions}["mm"] == "fp16"
    validate(result.model)
    out_w = next(t for t in result.model.graph.initializer if t.name == "W")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(out_w), w.astype(np.float16))
    x = weights((2, 16), seed=3)
    reference = run_onnxruntime(m, {"x": x})[0]  # onnxruntime reads the sparse original
    np.testing.assert_allclose(run_onnxruntime(emulate(result.model), {"x": x})[0], reference, rtol=1e-2, atol=1e-3)


def test_sparse_constants_and_subgraph_initializers_are_dense_too():
    w = _w()
    branch = helper.make_graph([helper.make_node("MatMul", ["x", "Wb"], ["b_out"], name="b_mm")], "then", [],
                               [vi("b_out", F32, [2, 3])])
    branch.sparse_initializer.append(_sparse("Wb", w, linear=True))
    other = helper.make_graph([helper.make_node("Constant", [], ["e_out"], name="e_const",
                                                sparse_value=_sparse("E", np.eye(2, 3, dtype=np.float32), False))],
                              "else", [], [vi("e_out", F32, [2, 3])])
    m = _make([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=other, name="if")],
              [vi("x", F32, [2, 4]), vi("c", TensorProto.BOOL, [])], [vi("y", F32, [2, 3])])
    dense = densify(m)
    assert dense is not m and not any(len(g.sparse_initializer) for g in (dense.graph,))
    result = convert(m, probe=False)
    validate(result.model)
    x = weights((2, 4), seed=4)
    for c, expected in ((True, x @ w), (False, np.eye(2, 3))):
        got = run_onnxruntime(emulate(result.model), {"x": x, "c": np.array(c)})[0]
        np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dims, indices, needle", [
    ([10**6, 10**6], np.array([0, 1, 2]), "takes 4000 GB dense, more than a model may hold"),
    ([4, 3], np.array([0, 1, 12]), "has an index outside its 12 elements"),
    ([4, 3], np.array([[0, 0], [1, 1], [4, 0]]), "has an index outside its shape [4, 3]"),
    ([4, 3], np.array([[0, 0, 0]]), "3 values but indices of shape [1, 3]"),
])
def test_sparse_tensors_that_cannot_be_made_dense_are_refused(dims, indices, needle):
    sparse = helper.make_sparse_tensor(tensor("W", np.ones(3, np.float32)), tensor("W_idx", indices.astype(np.int64)),
                                       dims)
    m = onnx.ModelProto()
    m.CopyFrom(_make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, [2])], [vi("y", F32, [2])]))
    m.graph.sparse_initializer.append(sparse)
    with pytest.raises(ModelLoadError) as info:
        convert(m, probe=False)
    assert needle in str(info.value)


def _stale(declared_type=F32, declared_shape=(7, 7)) -> onnx.ModelProto:
    """x [2, 16] @ w [16, 3] -> t -> Relu -> y, with value_info declaring t as ``declared_type[declared_shape]``."""
    return _make([helper.make_node("MatMul", ["x", "w"], ["t"], name="mm"), helper.make_node("Relu", ["t"], ["y"], name="relu")],
                 [vi("x", F32, [2, 16])], [vi("y", F32, [2, 3])], [tensor("w", weights((16, 3)))],
                 value_info=[vi("t", declared_type, list(declared_shape))])


@pytest.mark.parametrize("shape", [(7, 7), (2, 3, 1)], ids=["dims", "rank"])
def test_a_stale_value_info_shape_gives_way_to_inference(shape):
    result = convert(_stale(declared_shape=shape), probe=False)
    validate(result.model)  # strict inference: the output says what the ops make
    (t,) = result.model.graph.value_info
    assert t.name == "t" and [d.dim_value for d in t.type.tensor_type.shape.dim] == [2, 3]
    assert t.type.tensor_type.elem_type == TensorProto.FLOAT16
    run_onnxruntime(result.model, {"x": weights((2, 16))})


def test_a_value_info_type_that_contradicts_its_producer_makes_the_model_invalid():
    with pytest.raises(ModelLoadError) as info:
        convert(_stale(TensorProto.INT64, (2, 3)), probe=False)
    assert str(info.value) == "model: invalid ONNX model: value_info says tensor 't' is int64, but its producer MatMul makes float"


def _zipmap_classifier() -> onnx.ModelProto:
    """skl2onnx's default classifier output: the probabilities repackaged by ZipMap as seq(map(int64, float))."""
    zipmap = helper.make_node("ZipMap", ["p"], ["output_probability"], domain="ai.onnx.ml", classlabels_int64s=[0, 1])
    seq_map = helper.make_sequence_type_proto(helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Softmax", ["z"], ["p"]), zipmap],
                          "g", [vi("x", F32, ["N", 4])], [helper.make_value_info("output_probability", seq_map)],
                          [tensor("w", weights((4, 2)))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)])
    onnx.checker.check_model(m, full_check=True)
    return m


def test_a_zipmap_output_is_refused_with_the_export_option_that_avoids_it():
    # onnx_ir holds no map type: ir.from_proto raised NotImplementedError, an internal error (exit 1)
    with pytest.raises(ModelLoadError) as info:
        convert(_zipmap_classifier(), probe=False)
    message = str(info.value)
    assert "map-typed output 'output_probability' (ZipMap)" in message and "'zipmap': False" in message
    # any exporter's (CatBoost's has no such option): the tensor to make the output instead
    assert "make the ZipMap's input 'p'" in message


def _with_opsets(*versions: int) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [vi("x", F32, [2, 4])],
                          [vi("y", F32, [2, 3])], [tensor("w", weights((4, 3)))])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", v) for v in versions])


def test_an_opset_imported_twice_at_one_version_is_accepted_and_written_once():
    # skl2onnx 1.20 writes ('', 22) twice for tree models; onnx's checker and onnxruntime accept it
    model = _with_opsets(17, 17)
    onnx.checker.check_model(model, full_check=True)
    result = convert(model, probe=False)
    assert [(o.domain, o.version) for o in result.model.opset_import] == [("", 17)]
    run_onnxruntime(result.model, {"x": weights((2, 4))})


def test_an_opset_imported_at_two_versions_is_refused():
    with pytest.raises(ModelLoadError, match="imports domain 'ai.onnx' twice, at opsets 17 and 18"):
        convert(_with_opsets(17, 18), probe=False)
