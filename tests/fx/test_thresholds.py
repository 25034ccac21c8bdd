"""Threshold readers on torch.fx graphs: the aten comparisons' ``thresholds_operand`` drives the shared pass
(passes/analysis/thresholds.py). A tree compiled to tensor ops (a one-hot feature selection, ``lt`` against a
buffer of split thresholds, leaf values) keeps its selection FP32; the same model gated by a scalar (``f > 0``)
keeps it FP16."""

from __future__ import annotations

import torch

import amp_compiler.fx as ampfx
from tests.support.fx_helpers import one_thread  # noqa: F401 - autouse: torch on one thread


class CompiledTree(torch.nn.Module):
    def __init__(self, gate: bool = False):
        super().__init__()
        self.gate = gate
        self.select = torch.nn.Linear(4, 3, bias=False)
        self.leaves = torch.nn.Linear(3, 1, bias=False)
        with torch.no_grad():
            self.select.weight.copy_(torch.tensor([[1.0, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]))
            self.leaves.weight.copy_(torch.tensor([[100.0, 10.0, 1.0]]))
        self.register_buffer("thresholds", torch.tensor([1000.3, 0.7, 52.1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the gated model's product reads x through a relu, so that its K = 4 over the raw input is not
        # policy.high.raw-small-product's FP32 and the gate's own effect on the decision shows
        f = self.select(torch.relu(x) if self.gate else x)
        return self.leaves(((f > 0.0) if self.gate else (f < self.thresholds)).float())


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(100)
    return torch.stack([999 + 3 * torch.rand(301, generator=g), torch.randn(301, generator=g),
                        1.4 * torch.rand(301, generator=g), 40 + 20 * torch.rand(301, generator=g)], 1)


def test_a_comparison_with_a_buffer_of_thresholds_keeps_what_it_compares_fp32():
    module, x = CompiledTree().eval(), _x()
    gm = ampfx.convert(module, (x,), target="fp16")
    by_node = {d.node: d for d in ampfx.report(gm).decisions}
    assert (by_node["linear"].precision, by_node["linear"].rule) == ("fp32", "threshold.input")
    assert "lt" in by_node["linear"].reason
    assert by_node["linear_1"].precision == "fp16"
    with torch.no_grad():
        assert int((gm(x) != module(x)).sum()) == 0


def test_a_comparison_with_a_scalar_is_a_gate_and_leaves_the_product_fp16():
    gm = ampfx.convert(CompiledTree(gate=True).eval(), (_x()[:8],), target="fp16")
    by_node = {d.node: d for d in ampfx.report(gm).decisions}
    assert (by_node["linear"].precision, by_node["linear"].rule) == ("fp16", "policy.low")
