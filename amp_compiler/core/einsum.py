"""Einsum equations read with their operands' shapes: which indices a contraction sums, and their sizes.

One reading for both frontends (an ONNX ``Einsum``'s ``equation`` attribute, ``aten.einsum``'s ``equation``
argument), as numpy, ONNX and torch define it:

- spaces are ignored; ``->`` separates the operands' terms from the output's;
- an ellipsis ``...`` stands for the dims a term's letters leave (the operand's rank minus its letters),
  aligned from the right across operands (broadcast); it is named here by private indices, one per dim;
- implicit mode (no ``->``): the output is the ellipsis dims, then the letters that occur once, in
  alphabetical order; explicit mode: the output term says, and ellipsis dims it leaves out are summed;
- an index's size is the largest size it has in the operands (a size-1 dim broadcasts).

:func:`contraction_size` is K, what the Tensor Core rules read (``passes/analysis/raw_products.py``);
:func:`einsum_flops` the cost models' FLOPs (``onnx/costs/costs.py``, ``fx/graph/flops.py``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

__all__ = ["EinsumIndices", "contraction_size", "einsum_flops", "einsum_indices"]

Dims = Sequence[int | None] | None


@dataclasses.dataclass(frozen=True)
class EinsumIndices:
    """An equation with its ellipses spelled out: each operand's indices, one per dim, and the output's."""

    operands: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]

    @property
    def summed(self) -> tuple[str, ...]:
        """The indices the operands hold and the output does not, in order of first occurrence."""
        seen = dict.fromkeys(i for term in self.operands for i in term)
        return tuple(i for i in seen if i not in self.output)

    def sizes(self, shapes: Sequence[Dims]) -> dict[str, int]:
        """Each index's size, from the operands whose shape is known (the largest: size 1 broadcasts)."""
        found: dict[str, int] = {}
        for term, shape in zip(self.operands, shapes, strict=False):
            if shape is None or len(shape) != len(term):
                continue
            for index, d in zip(term, shape, strict=True):
                if d is not None:
                    found[index] = max(found.get(index, d), d)
        return found


def _ellipsis(k: int) -> str:
    """The private name of the k-th ellipsis dim counted from the right (no letter: letters are a-zA-Z)."""
    return f"...{k}"


def _letters(text: str) -> bool:
    return all(c.isalpha() for c in text)


def _term(text: str, rank: int | None) -> tuple[str, ...] | None:
    """A term's indices, its ellipsis spelled out for an operand of ``rank`` (None: malformed, or an ellipsis
    over an operand of unknown rank)."""
    head, dots, tail = text.partition("...")
    if not _letters(head + tail):
        return None
    if not dots:
        return tuple(text)
    if rank is None or rank < len(head) + len(tail):
        return None
    width = rank - len(head) - len(tail)
    return (*head, *(_ellipsis(k) for k in reversed(range(width))), *tail)


def einsum_indices(equation: str, ranks: Sequence[int | None]) -> EinsumIndices | None:
    """``equation``'s indices for operands of these ranks; None when it cannot be read (malformed, an
    ellipsis over an operand of unknown rank, or as many operands as terms missing)."""
    equation = equation.replace(" ", "")
    ins, arrow, out = equation.partition("->")
    texts = ins.split(",")
    if len(texts) != len(ranks):
        return None
    terms = [_term(t, r) for t, r in zip(texts, ranks, strict=True)]
    if any(t is None for t in terms):
        return None
    operands = tuple(t for t in terms if t is not None)
    width = max((sum(i.startswith("...") for i in t) for t in operands), default=0)
    if arrow:
        head, dots, tail = out.partition("...")
        if not _letters(head + tail):
            return None
        output = (*head, *((_ellipsis(k) for k in reversed(range(width))) if dots else ()), *tail)
    else:
        letters = [i for t in operands for i in t if not i.startswith("...")]
        once = sorted(i for i in set(letters) if letters.count(i) == 1)
        output = (*(_ellipsis(k) for k in reversed(range(width))), *once)
    return EinsumIndices(operands, tuple(output))


def contraction_size(equation: str, shapes: Sequence[Dims]) -> int | None:
    """K of an einsum: the product of the sizes of the indices it sums, where the operands' ``shapes``
    (None: unknown; a dim None: symbolic) give each one; None when the equation cannot be read, it sums
    nothing, or a summed index's size is unknown."""
    indices = einsum_indices(equation, [len(s) if s is not None else None for s in shapes])
    if indices is None or not indices.summed:
        return None
    sizes = indices.sizes(shapes)
    known = [sizes.get(i) for i in indices.summed]
    return math.prod(d for d in known if d is not None) if None not in known else None


def einsum_flops(equation: str, shapes: Sequence[Dims]) -> int | None:
    """An einsum's FLOPs: a multiply-add (2) per combination of its indices, the product of all their sizes;
    None when the equation cannot be read or an index's size is unknown."""
    indices = einsum_indices(equation, [len(s) if s is not None else None for s in shapes])
    if indices is None:
        return None
    sizes = indices.sizes(shapes)
    every = dict.fromkeys(i for term in indices.operands for i in term)
    return 2 * math.prod(sizes[i] for i in every) if every and all(i in sizes for i in every) else None
