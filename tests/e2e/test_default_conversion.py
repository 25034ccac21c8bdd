"""The default conversion (``amp-compiler convert`` as people run it: the range probe on) over the catalog
(issue 23): no NaN/Inf where FP32 has none, a warning for every output that misses 2% of its range,
and the Tensor Core ops it keeps low, per model, held to a record that says why any is FP32."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.output_error import concentrated, misses, moves_at_ties, output_accuracy
from amp_compiler.onnx.write.result import ConversionResult
from amp_compiler.policy import default_table
from amp_compiler.runtime.runner import InProcessRunner
from models import catalog

#: Tensor Core ops kept in FP16 by the default conversion, where fewer than all, and why (a model not
#: listed keeps all of them low). A drop below a record fails with the model named; a change of a
#: record needs a reason here.
TENSOR_CORE_RECORD: dict[str, tuple[int, int, str]] = {
    "llama-rope-long": (6, 7, "the rotary angle MatMul (K = 1, an outer product of inv_freq and the positions: 0.2% "
                        "of the FLOPs) computes Cos/Sin arguments up to 32k rad (policy.high.phase-argument)"),
    "cqt-log": (2, 5, "the constant-Q front end's Convs read raw audio into a Log (policy.high.signal-path)"),
    "moe-router": (1, 2, "the router's 64-column MatMul, which computes the scores TopK picks experts by "
                   "(routing.score): 2/64 of the experts' FLOPs"),
    "quantized-encoder": (0, 4, "integer MatMuls whose results are quantized again (quantized.requantize)"),
    "rnn-batch-first": (1, 2, "a MatMul onnxruntime crashes on with a Cast inside (runtime.ort-transpose-matmul)"),
    "convtranspose-einsum": (2, 3, "the Einsum 'bij,bjk->bik' contracts K = 8 of the raw graph input 'a', below one "
                             "MMA tile (K = 16): bound by memory, FP32 gains as much (policy.high.raw-small-product)"),
    "vae-decoder-overflow": (5, 6, "post_quant_conv, a 1x1 Conv over the 4 raw latent channels (K = 4, 0.03% of the "
                             "decoder's FLOPs: policy.high.raw-small-product)"),
    "event-steps": (2, 3, "fc1, the K = 8 product of the raw events' per-step differences (policy.high."
                    "raw-small-product; before, FP16 on range-scaled operands): 2.5% of the MLP's FLOPs"),
    "sensor-folded-standardisation": (2, 3, "fc1, the first Gemm over 16 raw-unit sensor features, whose bias cancels "
                                      "their offsets (a folded standardisation): FP16 rounding at 1500 m blurs its "
                                      "pre-activations, 1.8% of range (policy.high.raw-offset-product)"),
    "pairwise-distance-gram": (0, 1, "the K = 3 Gram MatMul of raw coordinates, which |a|^2 + |b|^2 - 2 a.b cancels "
                               "(57% of range in FP16: policy.high.raw-small-product)"),
}

#: Models whose default conversion warns that an output's error is concentrated in a few positions
#: (:func:`~amp_compiler.onnx.measure.output_error.concentrated`), and why that is so (measured). Every other
#: output within the line has its worst row at most 3.0x its 90th percentile.
#: Not here: llama-massive-activations-small, whose error sits in a rare token (tests/e2e/test_holdout_catalog.py's
#: MISSES_ON_FRESH; 8 draws of 128 random tokens 0.05-1.15% of range, of 256 up to 93%). The probe's draw held one
#: (1.15% stated, its worst token 46x the 90th percentile's: warned) until its last 16 ids became the vocabulary's
#: notable ones (amp_compiler.runtime.samples.NOTABLE_LOWEST): 0.13% stated, 5.3x, within the line; the converted
#: model is the same (37/37 Tensor Core ops low, 0.03-0.10% on 6 held-out draws).
CONCENTRATED: dict[str, str] = {
    "massive-swiglu-tail": (
        "stated 0.40%, its worst token 12x the 90th percentile's; 512 held-out tokens 0.6-9.7% (the pattern)"),
}
#: Models whose default conversion warns that a tie between two classes would move a probability output past the
#: line (:func:`~amp_compiler.onnx.measure.output_error.moves_at_ties`), and why that is so (measured). Every other
#: probability output within the line moves a tie by at most 0.4% of its range (gated-softmax-output, magika,
#: ppocr-cls, decomposed-activations, cqt-log's sigmoid notes).
AT_TIES: dict[str, str] = {
    "tie-softmax-classifier": (
        "stated 0.55% on the probe's rows, a tie moves 3.3%; 64 held-out rows 2.1-4.3%, bisected ties up to 4.4%"),
}
_ENTRIES = [e.name for e in catalog.entries("small")]


@functools.cache
def _default(name: str) -> ConversionResult:
    return convert(catalog.load(name), probe=True, runner=InProcessRunner())  # the catalog's own models


@pytest.mark.parametrize("name", _ENTRIES)
def test_tensor_core_ops_kept_low_by_the_default_conversion(name):
    result = _default(name)
    table = default_table()
    heavy = [d for d in result.decisions if table.is_tensor_core(d.domain, d.op_type)]
    # low: on Tensor Cores in 16 bits, the target's type or a range fallback's BF16 (--range-fallback)
    low_types = {result.options.target.value, "bf16"}
    low = sum(d.precision in low_types for d in heavy)
    recorded, total, why = TENSOR_CORE_RECORD.get(name, (len(heavy), len(heavy), ""))
    assert len(heavy) == total, f"{name}: {len(heavy)} Tensor Core ops, the record has {total}"
    assert low >= recorded, (
        f"{name}: {low}/{len(heavy)} Tensor Core ops low, the record is {recorded} ({why or 'all'}); FP32: "
        + ", ".join(f"{d.node} ({d.rule})" for d in heavy if d.precision not in low_types)
    )


@pytest.mark.parametrize("name", _ENTRIES)
def test_no_nan_where_fp32_has_none_and_a_warning_for_every_miss(name):
    entry = catalog.get(name)
    fp32, result = catalog.load(entry), _default(name)
    samples = [entry.make_inputs(np.random.default_rng(100))]
    accuracy = output_accuracy(fp32, result.model, samples, InProcessRunner())
    assert all(a.finite for a in accuracy), f"{name}: NaN/Inf where FP32 is finite: {accuracy}"
    missed = [a.name for a in accuracy if misses(a)]
    warned = any(misses(a) or concentrated(a) or moves_at_ties(a) for a in result.accuracy)
    if missed:
        assert warned, f"{name}: outputs {missed} miss 2% of range and the conversion does not warn ({result.accuracy})"


@pytest.mark.parametrize("name", _ENTRIES)
def test_concentrated_error_is_stated_where_recorded_only(name):
    """FP16 rounding moves every position of an output alike; an output whose worst position stands far
    beyond the rest is warned of (its max says nothing of other inputs), on the models recorded only."""
    flagged = [(a.name, a.concentration) for a in _default(name).accuracy if concentrated(a)]
    assert bool(flagged) == (name in CONCENTRATED), f"{name}: concentrated {flagged}, recorded: {CONCENTRATED.get(name)}"


@pytest.mark.parametrize("name", _ENTRIES)
def test_a_tie_past_the_line_is_stated_where_recorded_only(name):
    """A probability output within the line on the probe whose logits' errors would move a tie past it is warned
    of (the probe's inputs seldom tie), on the models recorded only."""
    flagged = [(a.name, a.tie_move) for a in _default(name).accuracy if moves_at_ties(a)]
    assert bool(flagged) == (name in AT_TIES), f"{name}: moves at ties {flagged}, recorded: {AT_TIES.get(name)}"


def test_the_text_recogniser_is_warned_of():
    """ppocr-v4-rec misses 2% of range on real-like text lines (2.67%). Probed at -1..1 (its own 0.5/0.5
    normalization) only the dead-leaves sample showed it (noise 0.5-0.8%); over ImageNet's range, which
    unnormalized images are now probed at, both do (seeds 0, 1: noise 3.95%, 3.48%; dead leaves 3.25%, 26.9%);
    dead leaves at 0..1 and -1..1 run too (the normalization is not in the graph), and the worst is stated."""
    result = _default("ppocr-v4-rec")
    missed = [a for a in result.accuracy if misses(a)]
    assert missed, result.accuracy
    kinds = {"uniform noise", "dead-leaves image", "dead-leaves image -1..1", "dead-leaves image 0..1"}
    assert set(result.accuracy_on.values()) <= kinds, result.accuracy_on
