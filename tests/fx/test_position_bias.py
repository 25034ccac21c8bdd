"""Position biases on torch.fx graphs: integer inputs holding positions are counted (``PrecisionGraph.counted``,
amp_compiler/fx/graph/integer_flow.py) and an attention's ``attn_mask`` is logits (``logit_inputs``), so
``policy.high.position-bias`` keeps an ALiBi bias over integer positions FP32, as on the ONNX wing.

An ALiBi attention (4 heads, slopes 2^-2..2^-8) over ``pos.float()`` with the bias fed to
``F.scaled_dot_product_attention`` as ``attn_mask`` ran that bias in FP16 (painted between the low attention
products): 8.7% of the output's range at positions 2040-3000, 10.4% at 5000-8000; with its path FP32, 0.04%
at each, every product still FP16 (the bias added to q @ k^T before a softmax: 0.03% either way, painted FP32).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import amp_compiler.fx as ampfx
from amp_compiler.fx.graph.pipeline import capture_for_inference
from amp_compiler.fx.graph.policy import default_policy
from amp_compiler.fx.graph.precision_graph import build_fx_precision_graph
from amp_compiler.targets import Target
from tests.support.fx_helpers import error_of_range, one_thread  # noqa: F401 - autouse: torch on one thread

BIAS = "policy.high.position-bias"
S = 64


class Alibi(torch.nn.Module):
    """Attention with an ALiBi bias ``slope_h * (p_j - p_i)`` from integer positions cast to float first (as an
    export of positions given explicitly does), plus ``(1 - mask) * -10000`` from a 0/1 integer mask;
    ``sdpa``: the bias is ``F.scaled_dot_product_attention``'s ``attn_mask``, else added to ``q @ k^T``."""

    def __init__(self, sdpa: bool = True, positions: bool = True, d: int = 64, heads: int = 4):
        super().__init__()
        self.h, self.hd, self.sdpa, self.positions = heads, d // heads, sdpa, positions
        self.register_buffer("slopes", torch.tensor([2.0 ** (-8 * (i + 1) / heads) for i in range(heads)]))
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor, keys: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.h, self.hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        bias = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0
        if self.positions:
            p = keys.float()
            bias = bias + self.slopes[None, :, None, None] * (p[:, None, :] - p[:, :, None])[:, None]
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        else:
            a = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(self.hd) + bias, dim=-1) @ v
        return self.o(a.transpose(1, 2).reshape(b, s, -1))


def _inputs(start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(1, S, 64, generator=torch.Generator().manual_seed(1))
    return x, torch.arange(S)[None] + start, torch.ones(1, S, dtype=torch.int64)


@pytest.fixture(scope="module", params=[True, False], ids=["sdpa", "softmax"])
def alibi(request):
    torch.manual_seed(0)
    module = Alibi(sdpa=request.param).eval()
    gm = ampfx.convert(module, _inputs(0))
    return module, gm, {d.node: d for d in ampfx.report(gm).decisions}


def test_positions_subtracted_from_themselves_are_counted_and_a_mask_is_not():
    """``keys`` is named like nothing, but ``p_i - p_j`` of it is a relative distance: a position, whose float
    conversion the precision graph counts; the 0/1 ``attention_mask`` cast to float is exact in FP16 and no
    position."""
    captured = capture_for_inference(Alibi().eval(), _inputs(0), None, dynamic_shapes=None, fold_bn=False)
    graph = build_fx_precision_graph(captured.gm, Target.FP16, default_policy()).graph
    assert [(op.op_type, op.fx.args[0].name) for op in graph.counted] == [("to", "keys")], graph.counted


def test_the_bias_from_positions_is_fp32_and_the_products_fp16(alibi):
    module, _, d = alibi
    # keys.float() (to_1), p_i - p_j, x slopes, + the mask's bias: FP32 by the rule; the mask's own float path
    # (to, rsub, mul) is no position.
    for node in ["to_1", "sub", "mul_1", "add"]:
        assert (d[node].precision, d[node].rule) == ("fp32", BIAS), (node, d[node].precision, d[node].rule)
    for node in ["to", "rsub", "mul"]:
        assert d[node].rule != BIAS, node
    assert "(positions)" in d["mul_1"].reason and "to node 'to_1'" in d["mul_1"].reason, d["mul_1"].reason
    products = [n for n, dec in d.items() if any(op in dec.op_type for op in ("linear", "matmul", "scaled_dot"))]
    assert len(products) == (5 if module.sdpa else 6), products
    for n in products:
        assert d[n].precision == "fp16", (n, d[n].precision, d[n].rule)


@pytest.mark.parametrize("start", [3000, 8000])
def test_alibi_over_positions_past_2048_is_accurate(alibi, start):
    """SDPA: 8.7% of range at 3000.., 10.4% at 8000.. with the bias FP16; 0.04% now."""
    module, gm, _ = alibi
    assert error_of_range(module, gm, _inputs(start)) < 0.002


def test_a_mask_alone_is_no_position_and_stays_low():
    """Without positions the 0/1 mask's float path is painted with the attention it feeds: FP16, no pin."""
    torch.manual_seed(0)
    gm = ampfx.convert(Alibi(positions=False).eval(), _inputs(0))
    d = {dec.node: dec for dec in ampfx.report(gm).decisions}
    assert not [n for n, dec in d.items() if dec.rule == BIAS]
    for node in ["to", "rsub", "mul", "scaled_dot_product_attention"]:
        assert d[node].precision == "fp16", (node, d[node].precision, d[node].rule)
