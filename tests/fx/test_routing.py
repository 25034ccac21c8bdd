"""Routing scores on torch.fx graphs: a selection's indices reaching an index input (``PrecisionGraph.index_readers``,
amp_compiler/fx/graph/integer_flow.py) make ``routing.score`` keep the scores it selects from FP32, as on the ONNX
wing (passes/analysis/routing.py).

Before the FX precision graph computed ``index_readers``, the rule never fired on FX: a DGCNN EdgeConv's Gram product
(kNN in feature space, K = 64, N = 256 points, top-10, gather) ran FP16 and 52 of 5,120 neighbour sets changed (10.6
to 16% of the output's range off); an 8-expert top-2 MoE router (linear, topk) ran FP16 and 7 of 16,384 tokens ran
other experts (12-17.7% of the range off for those tokens). With it: 0 changes, 0.039% and 0.017-0.020%.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import amp_compiler.fx as ampfx
from tests.support.fx_helpers import one_thread  # noqa: F401 - autouse: torch on one thread

ROUTING = "routing.score"
LOW = ("fp16", "bf16")


class EdgeConv(torch.nn.Module):
    """DGCNN's EdgeConv on learned features: a kNN graph from the Gram matrix of the features (``-|a - b|^2``), its
    top-k neighbours gathered, an MLP on each edge, a max over the neighbours."""

    def __init__(self, d: int = 64, k: int = 10):
        super().__init__()
        self.k = k
        self.mlp = torch.nn.Sequential(torch.nn.Linear(2 * d, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inner = -2 * h @ h.transpose(1, 2)
        sq = (h * h).sum(-1, keepdim=True)
        idx = (-sq - inner - sq.transpose(1, 2)).topk(self.k, dim=-1).indices
        b, n, d = h.shape
        nb = torch.gather(h.unsqueeze(1).expand(b, n, n, d), 2, idx.unsqueeze(-1).expand(b, n, self.k, d))
        e = torch.cat([h.unsqueeze(2).expand_as(nb), nb - h.unsqueeze(2)], -1)
        return self.mlp(e).max(2).values, idx


class MoE(torch.nn.Module):
    """A top-k mixture of experts: LayerNorm, router linear, top-k and softmax of the chosen logits; ``mask``: every
    expert runs and a one-hot mask (``idx == e``) weights them, else the chosen experts' weights are indexed."""

    def __init__(self, experts: int, mask: bool, d: int = 64, k: int = 2, ffn: int = 32):
        super().__init__()
        self.k, self.experts, self.mask = k, experts, mask
        self.ln = torch.nn.LayerNorm(d)
        self.router = torch.nn.Linear(d, experts, bias=False)
        self.w1 = torch.nn.Parameter(torch.randn(experts, d, ffn) * d**-0.5)
        self.w2 = torch.nn.Parameter(torch.randn(experts, ffn, d) * ffn**-0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.ln(x)
        w, idx = self.router(h).topk(self.k, -1)
        w = w.softmax(-1)
        if self.mask:
            chosen = (idx[..., None] == torch.arange(self.experts, device=x.device)).to(w.dtype)
            gates = (w[..., None] * chosen).sum(-2)
            y = torch.einsum("btd,edf->btef", h, self.w1).relu()
            return x + (gates[..., None] * torch.einsum("btef,efd->bted", y, self.w2)).sum(2), idx
        y = torch.einsum("btd,btkdf->btkf", h, self.w1[idx]).relu()
        return x + (w[..., None] * torch.einsum("btkf,btkfd->btkd", y, self.w2[idx])).sum(2), idx


class Classifier(torch.nn.Module):
    """An MLP classifier returning its logits and their argmax; ``lookup``: the argmax also indexes a buffer of class
    values in the graph (an index input), as a model mapping labels to values does."""

    def __init__(self, classes: int, lookup: bool):
        super().__init__()
        self.lookup = lookup
        self.body = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 128),
                                        torch.nn.GELU())
        self.head = torch.nn.Linear(128, classes)
        self.register_buffer("values", torch.linspace(0.0, 1.0, classes))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.body(x))
        label = logits.argmax(-1)
        return logits, (self.values[label] if self.lookup else label)


def _decisions(gm) -> dict[str, object]:
    return {d.node: d for d in ampfx.report(gm).decisions}


def _changed(a: torch.Tensor, b: torch.Tensor) -> int:
    """Rows whose set of indices differs."""
    return int((a.sort(-1).values != b.sort(-1).values).any(-1).sum())


def _features(seed: int) -> torch.Tensor:
    return F.relu(torch.randn(2, 256, 64, generator=torch.Generator().manual_seed(seed)))


def test_knn_gram_product_stays_fp32_and_no_neighbour_set_changes():
    """The Gram product whose negative distances the top-k reads, and the chain between them, stay FP32 by
    ``routing.score``; the edge MLP stays FP16. Before: the product FP16, 13 of 1,536 held-out neighbour sets
    changed (52 of 5,120 over ten inputs), 10.6% of the range off; after: 0, 0.039%."""
    torch.manual_seed(0)
    module = EdgeConv().eval()
    gm = ampfx.convert(module, (_features(0),))
    decisions = _decisions(gm)
    products = [d for d in decisions.values() if d.op_type == "aten.matmul.default"]
    assert len(products) == 1
    assert (products[0].precision, products[0].rule) == ("fp32", ROUTING)
    assert "topk" in products[0].reason and "gather" in products[0].reason
    assert decisions["topk"].rule == ROUTING
    mlp = [d for d in decisions.values() if d.op_type == "aten.linear.default"]
    assert len(mlp) == 2 and all(d.precision in LOW for d in mlp)
    changed = total = 0
    with torch.no_grad():
        for seed in (100, 101, 102):
            (_, ref), (_, got) = module(_features(seed)), gm(_features(seed))
            changed += _changed(ref, got)
            total += ref.shape[0] * ref.shape[1]
    assert changed == 0, f"{changed}/{total} neighbour sets changed"


@pytest.mark.parametrize(("experts", "tokens", "mask"), [(8, 16384, False), (32, 4096, True)],
                         ids=["indexed-experts", "one-hot-mask"])
def test_router_stays_fp32_experts_low_and_no_expert_changes(experts, tokens, mask):
    """The router linear and its top-k stay FP32 by ``routing.score``, the experts' einsums FP16; the indices reach
    the experts through ``w1[idx]`` (an ``index``) or ``idx == e`` (an ``eq``). Before: router and top-k FP16, 7 of
    16,384 (8 experts) and 7 of 4,096 (32 experts) held-out tokens ran other experts, 12.5-14.4% of the range off."""
    torch.manual_seed(0)
    module = MoE(experts, mask).eval()

    def tokens_of(seed: int) -> torch.Tensor:
        return torch.randn(tokens // 64, 64, 64, generator=torch.Generator().manual_seed(seed))

    gm = ampfx.convert(module, (tokens_of(0),))
    decisions = _decisions(gm)
    router = [d for d in decisions.values() if d.op_type == "aten.linear.default"]
    assert len(router) == 1 and (router[0].precision, router[0].rule) == ("fp32", ROUTING)
    assert f"a product of {experts} columns" in router[0].reason
    assert decisions["topk"].rule == ROUTING
    experts_ops = [d for d in decisions.values() if d.op_type == "aten.einsum.default"]
    assert len(experts_ops) == 2 and all(d.precision in LOW for d in experts_ops)
    with torch.no_grad():
        (ref_y, ref), (got_y, got) = module(tokens_of(1)), gm(tokens_of(1))
    assert _changed(ref, got) == 0
    assert float((ref_y - got_y.float()).abs().max() / (ref_y.max() - ref_y.min())) < 1e-3


@pytest.mark.parametrize(("classes", "lookup", "pinned"), [(10, False, False), (10, True, True), (1000, True, False)],
                         ids=["label-output", "label-lookup", "vocabulary-lookup"])
def test_classifier_argmax_pins_at_most_its_head(classes, lookup, pinned):
    """A classifier's argmax written only to an output routes nothing: no op is pinned for it. Read by an index input
    in the graph, its head (10 columns: a router's size) stays FP32, and nothing upstream of the head: the body's
    products stay FP16. A head of 1,000 columns is no router (``MAX_CHOICES``): it stays FP16 too."""
    torch.manual_seed(0)
    module = Classifier(classes, lookup).eval()
    gm = ampfx.convert(module, (torch.randn(64, 32, generator=torch.Generator().manual_seed(0)),))
    decisions = _decisions(gm)
    products = [d for d in decisions.values() if d.op_type == "aten.linear.default"]
    assert len(products) == 3
    *body, head = products
    assert all(d.precision in LOW for d in body)
    assert (head.precision == "fp32" and head.rule == ROUTING) is pinned
    assert (head.precision in LOW) is not pinned
    routed = {d.node for d in decisions.values() if d.rule == ROUTING}
    assert (not routed) is not pinned
    assert not any(d.rule == ROUTING for d in body)
