"""Einsum equations read with their operands' shapes (amp_compiler/core/einsum.py), as torch and ONNX define them."""

from __future__ import annotations

import pytest
import torch

from amp_compiler.core.einsum import contraction_size, einsum_indices

CASES = [
    ("bnd,bmd->bnm", [(2, 64, 3), (2, 64, 3)], 3),
    ("...d,d->...", [(64, 3), (3,)], 3),  # an ellipsis spans the dims the letters leave
    ("...nd,...md", [(2, 5, 3), (2, 5, 3)], 3),  # implicit output: ellipsis dims, then letters seen once
    ("bnd,bmd", [(2, 5, 3), (2, 5, 3)], 6),  # implicit: b occurs twice, so it is summed too
    ("...d,...d->", [(2, 5, 3), (2, 5, 3)], 30),  # an explicit output without the ellipsis sums its dims
    ("i j , j -> i", [(3, 4), (4,)], 4),  # spaces
    ("bij,bjk->bik", [(2, 1, 4), (1, 4, 5)], 4),  # a size-1 dim broadcasts
    ("ij->ij", [(2, 3)], None),  # sums nothing
    ("bij,bjk->bik", [(2, 3, None), (2, None, 5)], None),  # a symbolic K
    ("a..b,b", [(3, 4), (4,)], None),  # malformed
    ("ab,bc->ac", [(3, 4)], None),  # fewer operands than terms
]


@pytest.mark.parametrize(("equation", "shapes", "k"), CASES)
def test_contraction_size(equation, shapes, k):
    assert contraction_size(equation, shapes) == k


@pytest.mark.parametrize(("equation", "shapes", "k"), [c for c in CASES if c[2] is not None])
def test_the_output_is_torchs(equation, shapes, k):
    """The output indices read are the dims torch.einsum returns."""
    tensors = [torch.ones(s) for s in shapes]
    indices = einsum_indices(equation, [len(s) for s in shapes])
    assert indices is not None
    sizes = indices.sizes(shapes)
    assert tuple(sizes[i] for i in indices.output) == tuple(torch.einsum(equation, *tensors).shape)
