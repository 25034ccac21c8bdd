"""Integer graph inputs that hold positions (``position_ids``, ``cache_position``): counts as a Range's are.

A decoder given its positions as an input (Hugging Face's ``position_ids`` and ``cache_position``, an ALiBi
or relative-position model exported with them explicit) casts them to float and builds from them what
a Range or CumSum would have built: a relative distance ``p_i - p_j`` scaled by slopes into the attention
logits, an angle. FP16 holds integers exactly only up to 2048 (spacing 2 from 2048, 4 from 4096): at the
positions of a long prompt or a KV-cache decoding step (thousands) the distance is off by up to 4, and
the probe, which draws positions 0..127, cannot see it. An integer input whose values are positions
therefore starts the count walk (:func:`~amp_compiler.core.graph.count_readers`) as a count does, in both
frontends (each walks its own graph: ``onnx/graph/integer_flow.py``, ``fx/graph/integer_flow.py``), so the
passes reading ``PrecisionGraph.counted`` (the position-bias pass) see its float casts as positions.

Which integer inputs: decided by what the graph does with them, the name as a hint. An input whose values
reach both operands of a subtraction (``i - j`` of the input with itself, through casts, unsqueezes and
other linear ops or integer arithmetic: a relative distance) holds positions whatever its name; so does
one named like positions (:data:`POSITION_NAME`: ``position_ids``, ``pos_ids``, ``cache_position``,
``positions``, ``pos``). Never one named like a mask (:data:`MASK_NAME`): a 0/1 attention mask cast to
float (BERT's ``(1 - mask) * -10000``) is exact in FP16, and pinning its path saves nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from amp_compiler.core.graph import OpT, StartT, integer_uses_from

__all__ = ["MASK_NAME", "POSITION_NAME", "is_position_input"]

#: A graph input named like positions (full match, case-insensitive): position_ids, pos_ids, cache_position,
#: positions, pos, key_positions.
POSITION_NAME = re.compile(r"(\w*_)?pos(ition)?s?(_?ids?)?", re.IGNORECASE)
#: A graph input named like a mask is no position, whatever it feeds.
MASK_NAME = re.compile(r"mask", re.IGNORECASE)


def is_position_input(
    name: str, start: StartT, uses: Callable[[StartT | OpT], Iterable[tuple[OpT, int]]],
    through: Callable[[OpT], bool], is_difference: Callable[[OpT], bool],
) -> bool:
    """Whether the integer graph input ``name`` (``start``: what ``uses`` takes for it) holds positions: not
    named like a mask, and named like positions or read, through the ops ``through`` accepts (ops whose results
    carry its values: integer arithmetic, casts, data movement, ops linear in their input), at two operands of
    one op that ``is_difference`` (a Sub: a relative distance ``p_i - p_j``). ``uses(x)``: (reader, operand
    index) per use of ``x``'s results."""
    if MASK_NAME.search(name):
        return False
    if POSITION_NAME.fullmatch(name):
        return True
    operands: dict[OpT, set[int]] = {}
    for reader, index in integer_uses_from([start], uses, through):
        read = operands.setdefault(reader, set())
        read.add(index)
        if len(read) > 1 and is_difference(reader):
            return True
    return False
