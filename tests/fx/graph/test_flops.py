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


class VectorProducts(torch.nn.Module):
    def forward(self, m, v, x):
        return (torch.mv(m, v).sum() + torch.linalg.vecdot(x, x, dim=0).sum() + torch.dot(v, v)
                + torch.einsum("...nd,...md->...nm", x, x).sum())


def test_matrix_vector_products_dots_and_ellipsis_einsums_count_their_k():
    """mv, linalg_vecdot (K along its dim), dot: 2 * output elements * K from their layouts (before: one FLOP
    per output element); an einsum with an ellipsis: every index, its ellipsis dims included (before: one per
    output element)."""
    gm = ampfx.capture(VectorProducts().eval(), (torch.randn(7, 5), torch.randn(5), torch.randn(2, 6, 4)))
    flops = graph_flops(gm, default_policy())
    by_op = {op_name(n.target) or "": flops[n.name] for n in gm.graph.nodes if n.op == "call_function"}
    assert by_op["mv"] == 2 * 7 * 5
    assert by_op["linalg_vecdot"] == 2 * (6 * 4) * 2
    assert by_op["dot"] == 2 * 5
    assert by_op["einsum"] == 2 * 2 * 6 * 6 * 4
