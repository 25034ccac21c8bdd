"""What a model's string inputs may hold, from the string ops that read them (:func:`string_vocabularies`):
the categories of a OneHotEncoder, LabelEncoder or CategoryMapper, the n-gram pool of a TfIdfVectorizer.
Generated string inputs draw their values from these words (a word no op knows maps to nothing: a
OneHotEncoder's row of zeros, TF-IDF features of zeros, and a measure of nothing); where a tokenizer
splits the input first, each value is a few of these words joined by spaces.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import onnx

__all__ = ["StringVocabulary", "string_vocabularies", "string_values"]

#: (domain, op) -> the attribute listing the strings the op knows, each with why it says what the input holds.
VOCABULARY_ATTRIBUTES: Mapping[tuple[str, str], str] = {
    ("ai.onnx.ml", "OneHotEncoder"): "cats_strings",  # the categories; any other string is a row of zeros
    ("ai.onnx.ml", "LabelEncoder"): "keys_strings",  # the keys; any other string takes the default
    ("ai.onnx.ml", "CategoryMapper"): "cats_strings",  # the categories; any other string takes the default
    ("", "TfIdfVectorizer"): "pool_strings",  # the n-grams counted (words of the unigrams and longer ones)
}
#: String ops an input's words pass through on their way to an op with a vocabulary (as their input 0):
#: reshapes and selections keep them; StringNormalizer changes their case (the vocabulary is in the case it
#: gives them); a tokenizer splits a text into them (its input is then words joined by spaces).
_PASS = frozenset({
    "Reshape", "Identity", "Flatten", "Squeeze", "Unsqueeze", "Gather", "Slice", "Transpose", "Expand", "Concat",
    "StringNormalizer", "Tokenizer", "StringSplit",
})
_SPLITS = frozenset({"Tokenizer", "StringSplit"})
#: Words per generated text, at most (a text input split by a tokenizer).
TEXT_WORDS = 8


@dataclasses.dataclass(frozen=True)
class StringVocabulary:
    """The strings the ops reading a string input know (``words``, sorted), and whether a tokenizer
    splits the input first (``text``: each value is words joined by spaces); ``ops``: those ops' types."""

    words: tuple[str, ...]
    text: bool
    ops: tuple[str, ...]

    def describe(self) -> str:
        what = "texts of" if self.text else "values drawn from"
        return f"{what} the {len(self.words)} words of its {', '.join(self.ops)}"


def string_vocabularies(model: onnx.ModelProto) -> dict[str, StringVocabulary]:
    """Each main-graph string input's :class:`StringVocabulary`, where an op with a vocabulary reads it
    (directly, or through :data:`_PASS`); inputs no such op reads are not in the result."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    inits = {i.name for i in model.graph.initializer}
    out = {}
    for info in model.graph.input:
        if info.name in inits or info.type.tensor_type.elem_type != onnx.TensorProto.STRING:
            continue
        words: set[str] = set()
        ops: list[str] = []
        text = False
        stack, seen = [(info.name, False)], {info.name}
        while stack:
            value, split = stack.pop()
            for node in consumers.get(value, ()):
                domain = "" if node.domain in ("", "ai.onnx") else node.domain
                attribute = VOCABULARY_ATTRIBUTES.get((domain, node.op_type))
                if attribute is not None:
                    found = _strings(node, attribute)
                    if found:
                        words |= found
                        ops.append(node.op_type)
                        text = text or split
                elif node.op_type in _PASS and node.input and node.input[0] == value:
                    for o in node.output:
                        if o and o not in seen:
                            seen.add(o)
                            stack.append((o, split or node.op_type in _SPLITS))
        if words:
            out[info.name] = StringVocabulary(tuple(sorted(words)), text, tuple(dict.fromkeys(ops)))
    return out


def _strings(node: onnx.NodeProto, attribute: str) -> set[str]:
    """The words of ``node``'s string attribute (an n-gram pool's entries are single words)."""
    for a in node.attribute:
        if a.name == attribute:
            return {s.decode("utf-8", "replace") for s in a.strings if s}
    return set()


def string_values(vocabulary: StringVocabulary, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A string array of ``shape`` drawn from ``vocabulary`` (texts of 1 to :data:`TEXT_WORDS` words where
    it is ``text``), as onnxruntime takes strings: an object array of ``str``."""
    words = np.asarray(vocabulary.words, dtype=object)
    count = int(np.prod(shape))
    if not vocabulary.text:
        return rng.choice(words, size=count).reshape(shape)
    values = [" ".join(rng.choice(words, size=int(rng.integers(1, TEXT_WORDS + 1)))) for _ in range(count)]
    return np.asarray(values, dtype=object).reshape(shape)
