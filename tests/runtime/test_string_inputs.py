"""String inputs: generated ones take the words the model's string ops know; given ones come as str arrays."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from amp_compiler import convert
from amp_compiler.runtime.input_kinds import input_kinds
from amp_compiler.runtime.samples import CalibrationDataError, load_samples, random_samples
from amp_compiler.runtime.string_inputs import string_vocabularies
from tests.support.onnx_builders import F32, model, vi

STRING = onnx.TensorProto.STRING
COLOURS = ["black", "blue", "green", "red"]


def _onehot_mlp() -> onnx.ModelProto:
    """cat [batch, 1] strings -> Reshape -> OneHotEncoder (4 colours) -> MatMul -> y: what skl2onnx writes
    for a one-hot encoded column before a linear model."""
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32), "w")
    shape = onnx.numpy_helper.from_array(np.array([-1, 1], np.int64), "shape")
    nodes = [
        helper.make_node("Reshape", ["cat", "shape"], ["cat2"]),
        helper.make_node("OneHotEncoder", ["cat2"], ["hot3"], domain="ai.onnx.ml", cats_strings=COLOURS, zeros=1),
        helper.make_node("Flatten", ["hot3"], ["hot"], axis=1),
        helper.make_node("Cast", ["hot"], ["hotf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("MatMul", ["hotf", "w"], ["y"]),
    ]
    return model(nodes, [vi("cat", STRING, ["batch", 1])], [vi("y", F32, ["batch", 3])], [shape, w],
                 extra_opsets=[helper.make_opsetid("ai.onnx.ml", 3)])


def _tfidf() -> onnx.ModelProto:
    """text [batch] strings -> StringSplit -> TfIdfVectorizer (unigrams) -> y: raw texts split into words."""
    pool = ["apple", "banana", "cherry"]
    nodes = [
        helper.make_node("StringSplit", ["text"], ["words", "count"], delimiter=" "),
        helper.make_node("TfIdfVectorizer", ["words"], ["y"], mode="TF", min_gram_length=1, max_gram_length=1,
                         max_skip_count=0, ngram_counts=[0], ngram_indexes=[0, 1, 2], pool_strings=pool),
    ]
    return model(nodes, [vi("text", STRING, ["batch"])], [vi("y", F32, ["batch", 3])], opset=20)


def test_a_string_input_takes_the_categories_of_the_op_that_reads_it():
    vocab = string_vocabularies(_onehot_mlp())["cat"]
    assert vocab.words == tuple(COLOURS) and not vocab.text and vocab.ops == ("OneHotEncoder",)
    kind = input_kinds(_onehot_mlp())["cat"]
    assert kind.kind == "words" and kind.why == "values drawn from the 4 words of its OneHotEncoder"
    (sample,) = random_samples(_onehot_mlp(), {"cat": (64, 1)}, informed=True)
    assert sample["cat"].dtype == object and set(sample["cat"].ravel()) == set(COLOURS)


def test_a_text_split_into_words_takes_texts_of_the_pool():
    vocab = string_vocabularies(_tfidf())["text"]
    assert vocab.text and vocab.words == ("apple", "banana", "cherry")
    (sample,) = random_samples(_tfidf(), {"text": (16,)}, informed=True, seed=1)
    words = {w for text in sample["text"] for w in text.split(" ")}
    assert words <= {"apple", "banana", "cherry"} and len(words) == 3


def test_the_probe_of_a_one_hot_model_sees_its_categories():
    """Before, the probe fed the string "1", no category: the one-hot rows were zeros and the MatMul saw nothing."""
    result = convert(_onehot_mlp(), input_shapes={"cat": (8, 1)})
    assert "cat: values drawn from the 4 words of its OneHotEncoder" in result.probe_inputs


def test_string_data_comes_as_a_str_array(tmp_path):
    m = _onehot_mlp()
    np.savez(tmp_path / "s.npz", cat=np.array([["red"], ["blue"]]))
    (sample,) = load_samples(tmp_path / "s.npz", m)
    assert sample["cat"].dtype == object and sample["cat"].tolist() == [["red"], ["blue"]]
    np.savez(tmp_path / "n.npz", cat=np.ones((2, 1), np.float32))
    with pytest.raises(CalibrationDataError, match="the model expects strings"):
        load_samples(tmp_path / "n.npz", m)
