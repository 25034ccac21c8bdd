"""A first ``nn.Linear`` / ``nn.Conv1d`` over raw-unit features with their standardisation folded in, converted
with ``amp_compiler.fx`` (sweep Y, Y-1's FX face: 8.8% of range and 12% of labels off in BF16 on the example
inputs): its bias says where the features are centred (passes/analysis/raw_offsets.py)."""

from __future__ import annotations

import torch

import amp_compiler.fx as ampfx
from tests.support.fx_helpers import one_thread  # noqa: F401 - autouse: torch on one thread

MEAN = torch.tensor([293.0, 1500, 230, 50, 1013, 20, 300, 120] * 2)
STD = torch.tensor([3.0, 20, 1, 10, 8, 2, 5, 3] * 2)


def _sensor_mlp(hidden: int, folded: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 5)).eval()
    if folded:
        with torch.no_grad():
            first = net[0]
            weight = first.weight.clone()
            first.weight.copy_(weight / STD)
            first.bias.copy_(first.bias - (weight * (MEAN / STD)).sum(1))
    return net


def _first(report) -> tuple[str, str]:
    (decision,) = [d for d in report.decisions if d.node == "linear"]
    return decision.precision, decision.rule


def test_a_folded_standardisation_keeps_the_first_linear_fp32():
    x = MEAN + STD * torch.randn(128, 16)
    net = _sensor_mlp(64)
    gm = ampfx.convert(net, (x,), target="bf16")
    assert _first(ampfx.report(gm)) == ("fp32", "policy.high.raw-offset-product")
    with torch.no_grad():
        ref, got = net(x), gm(x)
    assert float((got - ref).abs().max() / (ref.max() - ref.min())) < 0.01


def test_a_bottleneck_warns_and_a_normalised_twin_stays_low():
    bottleneck = ampfx.report(ampfx.convert(_sensor_mlp(8), (MEAN + STD * torch.randn(128, 16),), target="bf16"))
    assert _first(bottleneck) == ("bf16", "policy.low")
    assert any("offset near" in w and "feature" in w for w in bottleneck.warnings)
    twin = ampfx.report(ampfx.convert(_sensor_mlp(64, folded=False), (torch.randn(128, 16),), target="bf16"))
    assert _first(twin) == ("bf16", "policy.low") and not any("offset" in w for w in twin.warnings)
