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


class EinsumDistance(torch.nn.Module):
    """Squared pairwise distances with the Gram matrix written as an einsum, the same ``|a|^2 + |b|^2 - 2 a.b``."""

    def __init__(self, equation: str = "bnd,bmd->bnm"):
        super().__init__()
        self.equation = equation

    def forward(self, pos: torch.Tensor) -> torch.Tensor:
        sq = (pos * pos).sum(-1)
        return sq[:, :, None] + sq[:, None, :] - 2 * torch.einsum(self.equation, pos, pos)


def _atoms(seed: int, dim: int = 3) -> torch.Tensor:
    """Atoms 40-50 A from the origin."""
    return torch.rand(2, 64, dim, generator=torch.Generator().manual_seed(seed)) * 10 + 40


def _error(module: torch.nn.Module, gm: torch.nn.Module, *inputs: torch.Tensor) -> float:
    with torch.no_grad():
        ref, out = module(*inputs).numpy(), gm(*inputs).float().numpy()
    stats = ErrorStats()
    stats.add(ref.ravel(), out.ravel())
    return stats.error_of_range


def test_an_einsum_gram_of_raw_coordinates_stays_fp32():
    """The einsum's K is read from its equation and its operands' traced shapes (before: unknown on FX, the
    einsum FP16, 5.0% of the distances' range off; the matmul form and the ONNX wing FP32, 0%)."""
    for equation in ("bnd,bmd->bnm", "...nd,...md->...nm", "...nd,...md"):  # explicit, ellipsis, implicit output
        module = EinsumDistance(equation).eval()
        gm = ampfx.convert(module, (_atoms(0),), target="fp16")
        einsum = next(d for d in ampfx.report(gm).decisions if d.node == "einsum")
        assert (einsum.precision, einsum.rule) == ("fp32", RULE) and "K = 3" in einsum.reason, (equation, einsum)
        assert _error(module, gm, _atoms(100)) < 1e-4, equation


def test_an_einsum_of_learned_features_or_a_long_contraction_stays_low():
    """No over-pinning: K = 32 of raw values gains from Tensor Cores; K = 3 of a projection's output reads learned
    features (the projection itself, K = 3 of raw coordinates, is the rule's). The K = 32 values lie within 4-5 of
    the origin: 40-50 out, their squared norms (32 x 45^2) are past FP16's range, which the range rules see."""
    module = EinsumDistance().eval()
    gm = ampfx.convert(module, (_atoms(0, dim=32) / 10,), target="fp16")
    assert next(d for d in ampfx.report(gm).decisions if d.node == "einsum").precision == "fp16"

    class Projected(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(3, 3)

        def forward(self, pos: torch.Tensor) -> torch.Tensor:
            h = self.proj(pos)
            return torch.einsum("bnd,bmd->bnm", h, h)

    gm = ampfx.convert(Projected().eval(), (_atoms(0),), target="fp16")
    decisions = {d.node: d for d in ampfx.report(gm).decisions}
    assert decisions["einsum"].precision == "fp16", decisions["einsum"]
    assert (decisions["linear"].precision, decisions["linear"].rule) == ("fp32", RULE)


class PlaneDistance(torch.nn.Module):
    """Signed point-to-plane distances n.p - d of LiDAR points ~1000 m out, by a matrix-vector product or dot."""

    def __init__(self, form: str):
        super().__init__()
        self.form = form
        self.register_buffer("n", torch.nn.functional.normalize(torch.tensor([0.3, -0.5, 0.81]), dim=0))

    def forward(self, pts: torch.Tensor) -> torch.Tensor:
        if self.form == "mv":
            sd = torch.mv(pts, self.n)
        elif self.form == "addmv":
            sd = torch.addmv(torch.zeros_like(pts[:, 0]), pts, self.n)
        elif self.form == "vecdot":
            sd = torch.linalg.vecdot(pts, self.n.expand_as(pts))
        elif self.form == "vecdot0":
            sd = torch.linalg.vecdot(pts.t(), self.n[:, None].expand_as(pts.t()), dim=0)
        else:
            sd = torch.stack([torch.dot(p, self.n) for p in pts.unbind(0)])
        return sd - 1234.5


def _points(seed: int, count: int = 256) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = torch.nn.functional.normalize(torch.tensor([0.3, -0.5, 0.81]), dim=0)
    base = torch.randn(count, 3, generator=g) * 800 + 1000
    return base - ((base @ n) - 1234.5)[:, None] * n + torch.randn(count, 1, generator=g) * 15 * n  # near the plane


def test_matrix_vector_products_and_dots_of_raw_coordinates_stay_fp32():
    """mv, addmv, linalg_vecdot (its dim read) and dot have a product layout (no Tensor Core work): before, mv
    and vecdot went FP16 by policy.low, the distances 3-4% of their range off (15.6% and 17.1% of an RBF MLP's
    output after them); now FP32, as ``pts @ n`` and the ONNX wing."""
    for form in ("mv", "addmv", "vecdot", "vecdot0", "dot"):
        module = PlaneDistance(form).eval()
        count = 8 if form == "dot" else 256
        gm = ampfx.convert(module, (_points(0, count),), target="fp16")
        ops = {"vecdot0": "linalg_vecdot", "vecdot": "linalg_vecdot"}.get(form, form)
        products = [d for d in ampfx.report(gm).decisions if d.op_type.split(".")[1:2] == [ops]]
        assert products and all(d.precision == "fp32" and d.rule == RULE for d in products), (form, products)
        assert all("K = 3" in d.reason and "no Tensor Core work" in d.reason for d in products), products
        assert _error(module, gm, _points(100, count)) < 1e-4, form


def test_a_matrix_vector_product_of_learned_features_stays_low():
    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(32, 32)
            self.register_buffer("v", torch.randn(32))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.mv(torch.relu(self.proj(x)), self.v)

    gm = ampfx.convert(Head().eval(), (torch.randn(64, 32),), target="fp16")
    assert next(d for d in ampfx.report(gm).decisions if d.node == "mv").precision == "fp16"
