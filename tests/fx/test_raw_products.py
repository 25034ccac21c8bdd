"""Raw small products on torch.fx graphs: the shared pass (passes/analysis/raw_products.py) reads K from the
traced shapes and the aten table's ``gemm`` layouts (schema argument names).

PointNet++'s ``square_distance`` of coordinates 40 from the origin: the K = 3 ``matmul(pos, pos^T)`` in FP16
stores a.b ~ 5000 to within 2, and the subtraction cancels it: with an MLP of the distances after it, 9.9% of
the output's range converted to FP16 (BF16: 44%). It stays FP32 now: 0.05% (0.33%), the K = 32 Linear layers of
learned features still low.
"""

from __future__ import annotations

import torch

import amp_compiler.fx as ampfx
from amp_compiler.core.tensor_error import ErrorStats
from tests.support.fx_helpers import one_thread  # noqa: F401 - autouse: torch on one thread

RULE = "policy.high.raw-small-product"


class SquareDistance(torch.nn.Module):
    """PointNet++'s square_distance of pos [B, N, 3], then an MLP of learned features."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(1, 32)
        self.second = torch.nn.Linear(32, 32)
        self.third = torch.nn.Linear(32, 8)

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        d2 = -2 * torch.matmul(pos, pos.transpose(1, 2))
        d2 = d2 + (pos ** 2).sum(-1)[:, :, None] + (pos ** 2).sum(-1)[:, None, :]
        h = torch.relu(self.first(d2.clamp(min=0).sqrt()[..., None]))
        return self.third(torch.relu(self.second(h)))


def _cloud(seed: int, shift: float) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(1, 24, 3, generator=g) * 6.0 + shift


def test_the_gram_matmul_stays_fp32_and_the_distances_are_accurate():
    torch.manual_seed(0)
    module = SquareDistance().eval()
    gm = ampfx.convert(module, (_cloud(0, 0.0),), target="fp16")
    decisions = {d.node: d for d in ampfx.report(gm).decisions}
    gram = decisions["matmul"]
    assert (gram.precision, gram.rule) == ("fp32", RULE) and "K = 3" in gram.reason, gram
    # the distances' first Linear (K = 1, computed from the coordinates through powers and sums) stays FP32 too;
    # the K = 32 ones read learned features
    assert (decisions["linear"].precision, decisions["linear"].rule) == ("fp32", RULE)
    assert decisions["linear_1"].precision == decisions["linear_2"].precision == "fp16"
    pos = _cloud(1, 40.0)
    with torch.no_grad():
        ref, out = module(pos).numpy(), gm(pos).float().numpy()
    stats = ErrorStats()
    stats.add(ref.ravel(), out.ravel())
    assert stats.error_of_range < 0.01, stats.error_of_range
