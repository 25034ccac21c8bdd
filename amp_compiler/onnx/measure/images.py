"""Natural-looking generated images for the range probe: dead leaves, beside uniform noise.

Uniform noise is no image: every pixel independent, its spectrum flat. Natural images have most of
their energy at low spatial frequencies (an amplitude spectrum about 1/f), large flat regions and
sharp edges between them. The *dead leaves* model draws exactly that: opaque discs of random grey
level and tint, radii power-law distributed (density r^-3, which gives the 1/f spectrum), dropped one
over the other until the image is covered, a little grain on top; stretched to fill the input's range.

Neither kind stands for real inputs alone: measured on the catalog's image models
(``python -m benchmarks.probe_images``), dead leaves bring the probe's output error closer to the
real one on 2 of 7 models and further on 2 (a text detector's map is flat on text-free images), but
the worse of the two (noise, leaves) reaches 2% of range on every model that misses it on real
inputs. So the probe runs both (:mod:`amp_compiler.onnx.measure.range_probe`) and reports the worse.

A pixel shows the last disc dropped over it: the disc of highest index that covers it. Every disc's
pixels (its bounding box masked by the disc) are gathered at once, radii of one size class together
(the few discs too large for :data:`_CHUNK_PIXELS`, each on its own), and folded with ``np.maximum.at``
into one index per pixel: a 3x1024x736 image in 0.2 s (3000x3000: 1.5 s), where drawing the discs in
turn took 1.0 s (the same images, bit for bit; loaded 2-core machine).
"""

from __future__ import annotations

import numpy as np

__all__ = ["COVER", "dead_leaves"]

#: Discs dropped: enough that their areas add up to this many times the image's (a pixel is left
#: uncovered with probability e^-COVER: 0.7%), at most :data:`_MAX_LEAVES`.
COVER = 5.0
_MAX_LEAVES = 20_000
#: Radii, in pixels: from 2 px (a stroke, a texture's grain) to half the image's shorter side.
_MIN_RADIUS = 2.0
_MAX_RADIUS_SHARE = 0.5
#: Grain: Gaussian noise of this share of the range on every pixel.
_GRAIN = 0.02
#: Pixels (disc and bounding box) gathered per ``np.maximum.at`` call: bounds the memory of one step.
_CHUNK_PIXELS = 1 << 22


def dead_leaves(rng: np.random.Generator, shape: tuple[int, ...], low: float, high: float) -> np.ndarray:
    """Float32 images of ``shape`` (``(N, C, H, W)``) in ``[low, high]``: dead leaves (see the module
    doc), channels sharing each disc's grey level with a small tint of their own. The same ``rng``
    state gives the same images."""
    n, c, h, w = shape
    out = np.empty(shape, np.float32)
    if out.size == 0:  # nothing to draw (an empty batch)
        return out
    side = min(h, w)
    r_max = max(2 * _MIN_RADIUS, _MAX_RADIUS_SHARE * side)
    # E[r^2] of the density r^-3 on [r_min, r_max]: 2 r_min^2 ln(r_max / r_min) / (1 - (r_min / r_max)^2)
    mean_square = 2 * _MIN_RADIUS**2 * np.log(r_max / _MIN_RADIUS) / (1 - (_MIN_RADIUS / r_max) ** 2)
    count = int(min(_MAX_LEAVES, max(16, COVER * h * w / (np.pi * mean_square))))
    for i in range(n):
        background = rng.uniform(0, 1)
        # radius density r^-3 on [r_min, r_max]: inverse CDF of u (1/r^2 uniform between the bounds)
        u = rng.uniform(0, 1, count)
        radii = 1.0 / np.sqrt(1.0 / _MIN_RADIUS**2 - u * (1.0 / _MIN_RADIUS**2 - 1.0 / r_max**2))
        centres_y, centres_x = rng.uniform(0, h, count), rng.uniform(0, w, count)
        greys = rng.uniform(0, 1, count)
        tints = rng.normal(0, 0.1, (count, c))
        top = _top_disc(radii, centres_y, centres_x, h, w)
        # colours[0]: the background (no disc); colours[k + 1]: disc k
        colours = np.empty((count + 1, c), np.float32)
        colours[0] = background
        colours[1:] = np.clip(greys[:, None] + tints, 0, 1)
        canvas = np.ascontiguousarray(colours[top + 1].reshape(h, w, c).transpose(2, 0, 1))
        canvas += rng.normal(0, _GRAIN, canvas.shape).astype(np.float32)
        lo, hi = float(canvas.min()), float(canvas.max())
        canvas = (canvas - lo) / (hi - lo) if hi > lo else np.full_like(canvas, 0.5)
        out[i] = low + canvas * (high - low)
    return out


def _top_disc(radii: np.ndarray, cy: np.ndarray, cx: np.ndarray, h: int, w: int) -> np.ndarray:
    """Per pixel (flattened ``h * w``), the index of the last disc that covers it, -1 where none does:
    a pixel ``(y, x)`` is in disc ``k`` when ``(y - cy)^2 + (x - cx)^2 <= r^2``."""
    top = np.full(h * w, -1, np.int64)
    # a disc's bounding box: rows int(cy - r) .. int(cy + r) (int() truncates, as the bounds are clipped at 0)
    y0 = np.maximum(0, (cy - radii).astype(np.int64))
    x0 = np.maximum(0, (cx - radii).astype(np.int64))
    y1 = np.minimum(h, (cy + radii).astype(np.int64) + 1)
    x1 = np.minimum(w, (cx + radii).astype(np.int64) + 1)
    spans = np.maximum(y1 - y0, x1 - x0)
    # size classes: discs whose box fits a square of side 2^k, gathered on that square together
    classes = np.ceil(np.log2(np.maximum(spans, 1))).astype(np.int64)
    for k in np.unique(classes):
        box = 1 << int(k)
        members = np.flatnonzero((classes == k) & (y1 > y0) & (x1 > x0))
        if box * box > _CHUNK_PIXELS:  # the few largest discs (of a large image): each over its own box
            for i in members:
                rows, cols = np.arange(y0[i], y1[i])[:, None], np.arange(x0[i], x1[i])[None, :]
                view = top.reshape(h, w)[y0[i]:y1[i], x0[i]:x1[i]]
                disc = (rows - cy[i]) ** 2 + (cols - cx[i]) ** 2 <= radii[i] ** 2
                np.maximum(view, np.where(disc, i, -1), out=view)
            continue
        dy, dx = np.divmod(np.arange(box * box), box)
        step = max(1, _CHUNK_PIXELS // (box * box))
        for start in range(0, len(members), step):
            d = members[start:start + step]
            ys = y0[d, None] + dy[None, :]
            xs = x0[d, None] + dx[None, :]
            inside = (ys < y1[d, None]) & (xs < x1[d, None])
            inside &= (ys - cy[d, None]) ** 2 + (xs - cx[d, None]) ** 2 <= radii[d, None] ** 2
            np.maximum.at(top, (ys * w + xs)[inside], np.broadcast_to(d[:, None], ys.shape)[inside])
    return top
