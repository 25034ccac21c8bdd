"""Byte sizes for people: one way to print them (decimal units, 3 significant digits) and to read them.

Every size the tool prints (model sizes in the summary line, FX parameter memory, memory budgets)
goes through :func:`format_bytes`: ``512 B``, ``1.50 kB``, ``45.3 MB``, ``2.10 GB`` (kB = 1000 B,
as file managers and ``ls -h --si`` count). :func:`parse_bytes` reads what people type: a number
with an optional unit, decimal (``k``, ``M``, ``G``, ``T``, with or without ``B``) or binary
(``Ki``, ``Mi``, ``Gi``, ``Ti``, with or without ``B``).
"""

from __future__ import annotations

import re

__all__ = ["format_bytes", "parse_bytes"]

_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
_FACTORS = {
    "": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)


def format_bytes(n: float) -> str:
    """``n`` bytes with a decimal unit and 3 significant digits (bytes below 1 kB as a whole number)."""
    for unit, size in _UNITS:
        if abs(n) >= size * 0.9995:  # 999.6 kB reads as 1.00 MB, not 1e+03 kB
            value = n / size
            digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
            return f"{value:.{digits}f} {unit}"
    return f"{int(n)} B"


def parse_bytes(text: str) -> int:
    """``"4G"`` -> 4000000000, ``"512MiB"`` -> 536870912, ``"1000"`` -> 1000. Raises ValueError."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (e.g. 4G, 512M, 8GiB)")
    return int(float(m.group(1)) * _FACTORS[(m.group(2) or "").lower()])
