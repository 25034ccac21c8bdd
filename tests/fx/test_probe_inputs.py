"""The FX range probe draws token ids below the vocabulary beside the example (amp_compiler.fx.graph.probe_inputs):
a decoder's massive activation that the example's few tokens miss is seen, as the ONNX path's probe sees it."""

import numpy as np
import pytest
import torch

import amp_compiler.fx as ampfx
from amp_compiler.fx.graph.pipeline import capture
from amp_compiler.fx.graph.probe_inputs import LEAST_IDS, MOST_SAMPLES, notable_ids, token_id_samples, vocabularies
from models.architectures import ARCHS
from tests.support.fx_helpers import build


class Tagger(torch.nn.Module):
    """Token ids (through a view) and segment ids into embeddings; a mask and a float input beside them."""

    def __init__(self):
        super().__init__()
        self.words, self.segments = torch.nn.Embedding(50, 8), torch.nn.Embedding(2, 8)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, ids, segments, mask, scale):
        h = self.words(ids.view(-1, ids.shape[-1])) + self.segments(segments)
        return self.out(h * mask.unsqueeze(-1) * scale)


def _tagger_example():
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(0))
    return ids, torch.zeros(2, 8, dtype=torch.long), torch.ones(2, 8, dtype=torch.long), torch.full((1,), 0.5)


def test_token_id_inputs_and_their_vocabularies():
    gm = capture(Tagger().eval(), _tagger_example())
    assert vocabularies(gm) == {0: 50, 1: 2}  # the mask reaches no embedding, the float input is no id


def test_samples_draw_ids_below_the_vocabulary_and_keep_the_other_inputs():
    example = _tagger_example()
    gm = capture(Tagger().eval(), example)
    samples = token_id_samples(gm, example)
    assert len(samples) == min(MOST_SAMPLES, -(-(LEAST_IDS - 16) // 16))
    drawn = torch.stack([s[0] for s in samples])
    assert drawn.dtype == torch.long and drawn.min() >= 0 and drawn.max() < 50
    assert len(drawn[..., :-4].unique()) > 30  # drawn; each row's last half (4 of 8) the notable ids
    assert (drawn[..., -4:] == torch.tensor([0, 1, 2, 3])).all()
    assert all(int(s[1].max()) < 2 for s in samples)
    assert all(torch.equal(s[2], example[2]) and torch.equal(s[3], example[3]) for s in samples)
    long = (torch.randint(0, 50, (4, 64)), torch.zeros(4, 64, dtype=torch.long), torch.ones(4, 64, dtype=torch.long),
            example[3])
    assert len(token_id_samples(gm, long)) == 1  # 256 ids already: one sample, for the notable ids
    images = capture(torch.nn.Conv2d(3, 4, 3).eval(), (torch.randn(1, 3, 8, 8),))
    assert token_id_samples(images, (torch.randn(1, 3, 8, 8),)) == []


def test_drawn_rows_end_with_the_first_ids_and_the_tables_rows_of_largest_norm():
    """As the ONNX probe's: a value that overflows FP16 at one token only (a T5's FFN at </s>) is probed."""
    torch.manual_seed(0)
    model = Tagger().eval()
    with torch.no_grad():
        model.words.weight[[17, 33]] *= 10.0
    long = (torch.randint(0, 50, (2, 64)), torch.zeros(2, 64, dtype=torch.long), torch.ones(2, 64, dtype=torch.long),
            torch.full((1,), 0.5))
    gm = capture(model, long)
    notable = notable_ids(gm, [n for n in gm.graph.nodes if n.op == "placeholder"][0], 50)
    assert notable[:8] == list(range(8)) and set(notable[8:10]) == {17, 33}
    (sample,) = token_id_samples(gm, long)  # 128 ids already: one sample, for the notable ids
    assert set(range(8)) | {17, 33} <= set(sample[0][0, -16:].tolist()) and sample[0][0, :-16].unique().numel() > 20


def _ids(seed: int) -> tuple:
    arch = next(a for a in ARCHS if a.name == "llama-massive-activations-small")
    return tuple(torch.as_tensor(v) for v in arch.make_inputs(np.random.default_rng(seed)).values())


@pytest.mark.parametrize("seed", [9, 30, 38])
def test_massive_activation_the_example_misses_is_seen_on_drawn_ids(seed):
    """On its 2x16-token example the Llama's third SwiGLU product peaks at 2.6e4 (FP16 with a 2x margin);
    on these inputs at 9.2e4-1.6e5: before, every logit inf or NaN."""
    module, inputs, _ = build("llama-massive-activations-small")
    gm = ampfx.convert(module, inputs)
    rep = ampfx.report(gm)
    assert rep.ranges_from == "the example inputs and 7 sample(s) of generated token ids" and rep.range_runs == 8
    held = _ids(seed)
    with torch.no_grad():
        ref, got = module(*held), gm(*held)
    ref, got = (v[0] if isinstance(v, (tuple, list)) else v for v in (ref, got))
    assert torch.isfinite(got).all()
    assert float((got.float() - ref).abs().max() / (ref.max() - ref.min())) < 0.01
    assert all(d.precision in ("fp16", "bf16") for d in rep.decisions if d.op_type == "aten.linear.default")
