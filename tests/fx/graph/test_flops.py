"""The FX path's FLOPs: which ops are matrix products or convolutions, and which argument holds K or
the weight, is read from the ATen table's ``gemm`` layouts (the ONNX cost model's definitions)."""

import dataclasses

import torch

import amp_compiler.fx as ampfx
from amp_compiler.fx.graph.flops import graph_flops
from amp_compiler.fx.graph.policy import AtenPolicy, default_policy, op_name
from amp_compiler.policy import PolicyTable
from tests.support.fx_helpers import one_thread  # noqa: F401 - autouse: torch on one thread


class Products(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 24)
        self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2)
        self.conv = torch.nn.Conv1d(4, 8, 3)

    def forward(self, x, img, seq, a, b):
        return self.fc(x).sum() + self.up(img).sum() + self.conv(seq).sum() + torch.baddbmm(a, a, b).sum()


def _flops_by_op(policy: AtenPolicy) -> dict[str, int]:
    inputs = (torch.randn(5, 16), torch.randn(1, 4, 6, 6), torch.randn(2, 4, 10), torch.randn(3, 8, 8),
              torch.randn(3, 8, 8))
    gm = ampfx.capture(Products().eval(), inputs)
    flops = graph_flops(gm, policy)
    return {op_name(n.target) or "": flops[n.name] for n in gm.graph.nodes if n.op == "call_function"}


def test_products_and_convolutions_are_costed_from_their_layouts():
    flops = _flops_by_op(default_policy())
    assert flops["linear"] == 2 * 5 * 24 * 16  # 2 * output elements * K (input's last dim)
    assert flops["conv_transpose2d"] == 2 * (4 * 6 * 6) * 6 * 9  # 2 * input elements * C_out * kernel
    assert flops["conv1d"] == 2 * (2 * 8 * 8) * 4 * 3  # 2 * output elements * C_in * kernel
    assert flops["baddbmm"] == 2 * (3 * 8 * 8) * 8


def test_without_its_layout_an_op_counts_one_flop_per_output_element():
    default = default_policy()
    table = PolicyTable([dataclasses.replace(e, gemm=None) if e.op == "linear" else e for e in default.table])
    flops = _flops_by_op(AtenPolicy(table, default.info))
    assert flops["linear"] == 5 * 24
    assert flops["conv1d"] == 2 * (2 * 8 * 8) * 4 * 3
