"""Against onnxconverter-common's convert_float_to_float16(keep_io_types=True), the usual anchor.

On every CI-size catalog model: where its output loads and runs, ours is at least as accurate (cosine
and max error against FP32, per float output); where it does not, ours does (the catalog tests check
that every converted model loads, runs and is accurate).
"""

from __future__ import annotations

import contextlib
import functools
import io
import warnings

import numpy as np
import pytest

from amp_compiler import convert
from amp_compiler.checks import compare, run_onnxruntime
from models import catalog

float16 = pytest.importorskip("onnxconverter_common.float16")
SMALL = catalog.entries("small")


@functools.cache
def _theirs(name: str):
    """onnxconverter-common's model, or the one-line reason it cannot produce one that runs."""
    model = catalog.load(name)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            out = float16.convert_float_to_float16(model, keep_io_types=True)
        feeds = catalog.get(name).make_inputs(np.random.default_rng(0))
        return out, run_onnxruntime(out, feeds)
    except Exception as exc:  # it fails to convert, or its output does not load or run
        return None, str(exc).splitlines()[0]


def _accuracies(name: str, outputs: list) -> list:
    entry = catalog.get(name)
    model = catalog.load(name)
    feeds = entry.make_inputs(np.random.default_rng(0))
    reference = run_onnxruntime(model, feeds)
    return [
        compare(f"output {i}", r, o)
        for i, (r, o) in enumerate(zip(reference, outputs))
        if np.issubdtype(np.asarray(r).dtype, np.floating)
    ]


@pytest.mark.parametrize("entry", SMALL, ids=lambda e: e.name)
def test_at_least_as_accurate_as_onnxconverter_common(entry):
    theirs, result = _theirs(entry.name)
    ours = convert(catalog.load(entry.name))
    feeds = entry.make_inputs(np.random.default_rng(0))
    our_outputs = run_onnxruntime(ours.model, feeds)  # ours always loads and runs
    if theirs is None:
        pytest.skip(f"onnxconverter-common's model does not run (ours does): {result[:120]}")
    for mine, other in zip(_accuracies(entry.name, our_outputs), _accuracies(entry.name, result)):
        assert mine.finite or not other.finite, mine.name
        assert mine.cosine >= other.cosine - 1e-6, f"{mine.name}: cosine {mine.cosine} < {other.cosine}"
        assert mine.max_abs_error <= other.max_abs_error * (1 + 1e-3) + 1e-6, (
            f"{mine.name}: max error {mine.max_abs_error} > {other.max_abs_error}"
        )


def test_onnxconverter_common_fails_where_we_do_not():
    """The known failure classes are present in the catalog, so the comparison means something."""
    failing = [e.name for e in SMALL if _theirs(e.name)[0] is None]
    assert {"silero-vad", "int-cast-float"} <= set(failing), failing
