"""Generated token ids for the FX range probe: the example's other inputs, its token ids drawn over the vocabulary.

The FX conversion observes ranges on the example inputs (:mod:`amp_compiler.fx.graph.ranges`). An example is
often a few tokens, and a decoder's massive activations follow particular tokens: the catalog's
``llama-massive-activations-small`` converted on its 2x16-token example saw its third layer's SwiGLU
product (channel 5) reach 2.6e4, within FP16 with the probe's 2x margin, and left it FP16; on 12 of 40
other 2x16-token inputs it reaches 3.3e4-1.6e5, and 7 of them gave inf/NaN logits (4 calibration samples
of 32 tokens missed it too). The ONNX path's range probe draws 128 token ids below the vocabulary size
(:mod:`amp_compiler.onnx.measure.generated_inputs`): this does the same for FX graphs, at least
:data:`LEAST_IDS` ids: with 128 (3 drawn samples beside the example), 4 of 5 draws kept every one of the 40
inputs finite and one left the 7; with 256 (7 drawn samples), all 8 draws tried did.

An integer graph input whose values reach an ``aten.embedding``'s indices (directly or through views and
copies of it) holds token ids below that embedding's row count. :func:`token_id_samples` gives samples
like the example, each such input drawn uniformly below its vocabulary at the example's shape, every other
input the example's own (masks, positions, floats), enough of them that the example and they hold at
least :data:`LEAST_IDS` ids per input (at most :data:`MOST_SAMPLES`: one more FP32 run each, and one more
run of the converted graph to measure it), and at least one where the embeddings have notable rows: each drawn
row ends with the vocabulary's first ids and the rows of largest norm of the embeddings' tables, as the ONNX
probe's ids do (:data:`amp_compiler.runtime.samples.NOTABLE_LOWEST`: a value that overflows FP16 at one token
only). None where the graph has no such input, or its vocabulary is unknown (a symbolic row count).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
import torch.fx as fx

from amp_compiler.runtime.samples import NOTABLE_LARGEST, NOTABLE_LOWEST, end_with

__all__ = ["LEAST_IDS", "MOST_SAMPLES", "notable_ids", "token_id_samples", "vocabularies"]

#: The ids the probe's samples hold per token-id input, at least (twice the ONNX probe's sequence: see above).
LEAST_IDS = 256
#: Generated samples at most (each is one more FP32 run of the graph, and one of the converted graph).
MOST_SAMPLES = 8
_EMBEDDING = torch.ops.aten.embedding.default
#: Ops whose first argument's values reach their result unchanged, rearranged or copied: what the walk
#: from an input to an embedding's indices goes through.
_CARRIERS = frozenset(
    getattr(torch.ops.aten, name).default for name in (
        "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze", "expand", "clone", "contiguous", "alias",
        "flatten", "t", "_to_copy",
    ) if hasattr(getattr(torch.ops.aten, name), "default")
) | frozenset((torch.ops.aten.squeeze.dim, torch.ops.aten.slice.Tensor, torch.ops.aten.select.int,
               torch.ops.aten.permute.default, torch.ops.aten.transpose.int))


def _reached_embeddings(node: fx.Node) -> Iterator[fx.Node]:
    """The ``aten.embedding`` nodes whose indices ``node``'s values reach through carriers."""
    stack, seen = [node], set()
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        for user in current.users:
            if user.op != "call_function":
                continue
            if user.target is _EMBEDDING and len(user.args) > 1 and user.args[1] is current:
                yield user
            elif user.target in _CARRIERS and user.args and user.args[0] is current:
                stack.append(user)


def _rows(embedding: fx.Node) -> int | None:
    """The row count of an embedding's weight (its first argument's traced value), None where unknown."""
    weight = embedding.args[0]
    value = weight.meta.get("val") if isinstance(weight, fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        return None
    rows = value.shape[0]
    return int(rows) if isinstance(rows, int) else None


def vocabularies(gm: fx.GraphModule) -> dict[int, int]:
    """Per integer placeholder (its position among the graph's placeholders) whose values reach embeddings'
    indices: the smallest row count among those embeddings (the ids valid for every one of them)."""
    out = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.is_floating_point() or value.dtype is torch.bool:
            continue
        rows = [_rows(e) for e in _reached_embeddings(node)]
        if rows and all(r is not None and r > 0 for r in rows):
            out[i] = min(r for r in rows if r is not None)
    return out


def _table(embedding: fx.Node, gm: fx.GraphModule) -> torch.Tensor | None:
    """An embedding's weight where the graph holds it (a module attribute), else None."""
    weight = embedding.args[0]
    if not isinstance(weight, fx.Node) or weight.op != "get_attr":
        return None
    value: object = gm
    for part in str(weight.target).split("."):
        value = getattr(value, part, None)
    return value if isinstance(value, torch.Tensor) and value.dim() == 2 else None


def notable_ids(gm: fx.GraphModule, placeholder: fx.Node, size: int) -> list[int]:
    """The ids below ``size`` every drawn row of ``placeholder`` ends with, as the ONNX probe's
    (:data:`amp_compiler.runtime.samples.NOTABLE_LOWEST`): the first ``NOTABLE_LOWEST``, then each reached
    embedding table's ``NOTABLE_LARGEST`` rows of largest L2 norm, each once."""
    ids = list(range(min(NOTABLE_LOWEST, size)))
    for embedding in _reached_embeddings(placeholder):
        table = _table(embedding, gm)
        if table is None or not table.is_floating_point():
            continue
        norms = torch.linalg.vector_norm(table.detach().double(), dim=1)
        ids += [int(i) for i in torch.argsort(-norms, stable=True)[:NOTABLE_LARGEST] if int(i) < size]
    return list(dict.fromkeys(ids))


def token_id_samples(gm: fx.GraphModule, example: tuple, seed: int = 0) -> list[tuple]:
    """Samples like ``example`` (the graph's placeholders' values) whose token-id inputs
    (:func:`vocabularies`) are drawn uniformly below their vocabulary, the other inputs the example's own;
    as many as bring the ids per input to :data:`LEAST_IDS` with the example's, at most
    :data:`MOST_SAMPLES` (none where there is no token-id input)."""
    vocab = {i: v for i, v in vocabularies(gm).items() if i < len(example) and isinstance(example[i], torch.Tensor)}
    if not vocab:
        return []
    ids = min(example[i].numel() for i in vocab)
    if ids == 0:
        return []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    notable = {i: notable_ids(gm, placeholders[i], size) for i, size in vocab.items()}
    count = min(MOST_SAMPLES, max(1 if any(notable.values()) else 0, -(-(LEAST_IDS - ids) // ids)))
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(count):
        sample = list(example)
        for i, size in vocab.items():
            given = example[i]
            drawn = rng.integers(0, size, size=tuple(given.shape))
            if drawn.ndim:
                end_with(drawn, notable[i])
            sample[i] = torch.as_tensor(drawn, dtype=given.dtype, device=given.device)
        samples.append(tuple(sample))
    return samples
