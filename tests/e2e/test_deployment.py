"""The graphs people deploy on onnxruntime GPU, each against the FP16 graph its own flow ships.

Per deployment entry of the catalog (models/deployment.py: BERT, GPT-2, ViT, CLIP and T5 fused by
onnxruntime's transformer optimizer; Llama decoders written by onnxruntime-genai's builder in FP32
and int4, and exported by torch.onnx with a KV cache), the FP16 conversion:

- is valid (checker full_check and strict shape inference where onnx knows the ops; onnxruntime's
  schema for the others), apart from faults of the input model itself;
- runs on onnxruntime's CPU provider, decoders on a decode step with a non-empty KV cache and on
  a prompt with an empty one, with graph inputs and outputs kept or made FP16;
- matches FP32 with exact FP16 storage (amp_compiler.onnx.measure.emulate) within the entry's tolerance;
- has at least as many fused and MatMul nodes in FP16 as the anchor, and at most the anchor's
  Casts plus one per graph input/output the anchor makes FP16 and we keep FP32 (plus, for the
  torch-exported decoder, the Casts its FP32 norms need: ``TorchDecoder.extra_casts``);
- types the KV cache as the builder's FP16 graph does when graph I/O may change (keep_io_types=False).

Small entries run in CI; full-size ones are ``slow``.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest

from amp_compiler import convert
from amp_compiler.onnx.measure.checks import compare, run_onnxruntime, validate
from amp_compiler.onnx.measure.emulate import emulate
from models import anchors, catalog, deployment

SMALL = catalog.entries("small", "deployment")
FULL = catalog.entries("full", "deployment")
PARAMS = [pytest.param(e.name, id=e.name) for e in SMALL] + [
    pytest.param(e.name, id=e.name, marks=pytest.mark.slow) for e in FULL
]
DECODERS = [p for p in PARAMS if isinstance(deployment.spec(p.values[0]), deployment.GenaiDecoder | deployment.TorchDecoder)]
FP16 = onnx.TensorProto.FLOAT16


@functools.cache
def _fp32(name: str) -> onnx.ModelProto:
    return catalog.load(name)


@functools.cache
def _converted(name: str, keep_io_types: bool) -> onnx.ModelProto:
    return convert(_fp32(name), keep_io_types=keep_io_types, probe=False).model


@functools.cache
def _anchor(name: str) -> onnx.ModelProto:
    (build,) = deployment.spec(name).anchors().values()
    return build(catalog.CACHE_DIR)


def _input_sets(name: str) -> list[dict[str, np.ndarray]]:
    spec = deployment.spec(name)
    rng = np.random.default_rng(0)
    sets = [spec.make_inputs(rng)]  # decoders: one new token after a non-empty cache
    if hasattr(spec, "prompt_inputs"):
        sets.append(spec.prompt_inputs(rng))  # a prompt, the cache empty
    return sets


def test_the_catalog_has_the_deployment_graphs() -> None:
    names = {e.name for e in SMALL}
    assert {"bert-fused-small", "gpt2-fused-small", "vit-fused-small", "clip-vision-fused-small",
            "t5-encoder-fused-small", "llama-genai-fp32-small", "llama-genai-int4-small",
            "llama-torch-kv-small"} <= names
    for e in SMALL:
        assert e.kind == "deployment" and e.name.endswith("-small")


@pytest.mark.parametrize("keep_io_types", [True, False], ids=["keep-io", "fp16-io"])
@pytest.mark.parametrize("name", PARAMS)
def test_valid_and_runs(name: str, keep_io_types: bool) -> None:
    model = _converted(name, keep_io_types)
    validate(model, converted_from=_fp32(name))
    for inputs in _input_sets(name):
        outputs = run_onnxruntime(model, deployment.feeds_for(model, inputs))
        assert all(np.isfinite(o).all() for o in outputs if np.issubdtype(o.dtype, np.floating))


@pytest.mark.parametrize("name", PARAMS)
def test_matches_fp32_with_exact_fp16_storage(name: str) -> None:
    entry = catalog.get(name)
    emulated = emulate(_converted(name, True))
    names = [o.name for o in _fp32(name).graph.output]
    for inputs in _input_sets(name):
        reference = run_onnxruntime(_fp32(name), inputs)
        got = run_onnxruntime(emulated, inputs)
        for output, ref, out in zip(names, reference, got):
            if not np.issubdtype(ref.dtype, np.floating):
                continue
            acc = compare(output, ref, out)
            assert acc.finite, output
            assert acc.cosine >= entry.tolerance.min_cosine, f"{output}: cosine {acc.cosine:.7f}"
            assert acc.error_of_range <= entry.tolerance.max_error_of_range, f"{output}: {acc.error_of_range:.2%}"


@pytest.mark.parametrize("name", PARAMS)
def test_at_least_the_anchors_fp16_nodes_and_at_most_its_casts(name: str) -> None:
    ours_model = _converted(name, True)
    ours, anchor = anchors.counts(ours_model), anchors.counts(_anchor(name))
    assert ours.fused == anchor.fused and ours.matmul == anchor.matmul, (ours, anchor)
    assert ours.fused_low >= anchor.fused_low, f"ours {ours.row()}, anchor {anchor.row()}"
    assert ours.matmul_low >= anchor.matmul_low, f"ours {ours.row()}, anchor {anchor.row()}"
    extra = getattr(deployment.spec(name), "extra_casts", 0)
    assert ours.casts <= anchors.cast_allowance(ours_model, anchor) + extra, f"ours {ours.row()}, anchor {anchor.row()}"


@pytest.mark.parametrize("name", DECODERS)
def test_kv_cache_typed_as_the_builders_fp16_graph(name: str) -> None:
    """With graph I/O free to change, the KV cache is FP16 as in onnxruntime-genai's FP16 graph of the
    same decoder (the torch export and the builder's graph share the cache's names)."""
    spec = deployment.spec(name)
    builder = next(s for s in deployment.SPECS if isinstance(s, deployment.GenaiDecoder) and s.decoder == spec.decoder)
    expected = anchors.io_types(builder.anchor_cuda(catalog.CACHE_DIR))
    assert expected and set(expected.values()) == {FP16}
    assert anchors.io_types(_converted(name, False)) == expected
    assert set(anchors.io_types(_converted(name, True)).values()) == {onnx.TensorProto.FLOAT}
