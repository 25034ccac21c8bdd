"""Structured values for generated inputs whose independent draws would show nothing real: an attention mask's
padding and causality (:func:`additive_mask`, :func:`padded_tail`) and a positive scale spread over decades
(:func:`log_spaced`). :func:`~amp_compiler.runtime.samples.random_samples` draws them for the kinds
:func:`~amp_compiler.runtime.input_kinds.input_kinds` gives (``additive``, ``padded``, ``positive``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["additive_mask", "log_spaced", "padded_tail"]


def _padding(keys: int) -> int:
    """How many keys a padded sequence's padding takes: a quarter of them, one at least (none of a single key)."""
    return max(1, keys // 4) if keys > 1 else 0


def additive_mask(shape: tuple[int, ...], masked: float, dtype: np.dtype) -> np.ndarray:
    """An additive attention mask (0 where a query attends a key, ``masked`` where not: HF's
    ``torch.finfo(dtype).min``) as batched generation feeds it: causal where its last two dims are square
    (a self-attention's queries x keys), and the last batch item (the first dim; the whole mask of a 2-D square
    one) left-padded by a quarter of the keys. Causal + left padding masks every key of the padding's own
    queries: those rows are what real masks hold and iid or all-zero draws never do (FP32 softmaxes them to
    uniform; an FP16 mask of -inf to NaN)."""
    out = np.zeros(shape, dtype)
    if not shape:
        return out
    keys = shape[-1]
    square = len(shape) >= 2 and shape[-2] == keys and keys > 1
    if square:
        out[..., np.triu(np.ones((keys, keys), bool), 1)] = masked
    pad = _padding(keys)
    if pad and (len(shape) == 1 or (len(shape) == 2 and square)):
        out[..., :pad] = masked
    elif pad:
        out[-1, ..., :pad] = masked
    return out


def padded_tail(shape: tuple[int, ...]) -> np.ndarray:
    """A boolean mask of both values in every row: False, then the last quarter of the keys (the last dim)
    True, a padded tail. A bool mask's polarity is not in the graph (PyTorch's ``key_padding_mask``: True is
    padding; ``scaled_dot_product_attention``'s: True takes part): under either, every row keeps keys (all
    True masked every key: FP32 NaN, the probe blind)."""
    out = np.zeros(shape, np.bool_)
    if shape:
        out[..., shape[-1] - _padding(shape[-1]):] = True
    return out


def log_spaced(bounds: tuple[float, float], shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Positive values from ``bounds[0]`` to ``bounds[1]``, evenly spaced in their logarithm (both ends
    included) and shuffled; a single value takes the upper bound (the scale itself: what multiplies)."""
    n = int(np.prod(shape))
    if n == 1:
        return np.full(shape, bounds[1])
    values = np.geomspace(bounds[0], bounds[1], n)
    rng.shuffle(values)
    return values.reshape(shape)
