"""Dead-leaves images (amp_compiler.onnx.measure.images): the shape and range asked for, the same images
for the same seed, flat regions with sharp edges between them (not noise), and each pixel the colour of
the last disc dropped over it."""

from __future__ import annotations

import numpy as np
import pytest

from amp_compiler.onnx.measure import images
from amp_compiler.onnx.measure.images import dead_leaves


@pytest.mark.parametrize("shape, low, high", [((2, 3, 48, 320), -1.0, 1.0), ((1, 1, 64, 64), 0.0, 255.0)])
def test_images_fill_the_shape_and_the_range(shape, low, high):
    x = dead_leaves(np.random.default_rng(0), shape, low, high)
    assert x.shape == shape and x.dtype == np.float32
    for image in x:  # each image stretched to the whole range
        assert image.min() == pytest.approx(low, abs=1e-4 * (high - low))
        assert image.max() == pytest.approx(high, abs=1e-4 * (high - low))


def test_the_same_seed_gives_the_same_images_and_another_seed_others():
    first, again = (dead_leaves(np.random.default_rng(7), (1, 3, 40, 60), 0.0, 1.0) for _ in range(2))
    other = dead_leaves(np.random.default_rng(8), (1, 3, 40, 60), 0.0, 1.0)
    assert np.array_equal(first, again) and not np.allclose(first, other)


def test_neighbouring_pixels_are_mostly_equal_but_for_grain_with_sharp_edges_between_regions():
    x = dead_leaves(np.random.default_rng(0), (1, 3, 128, 128), 0.0, 1.0)
    steps = np.abs(np.diff(x, axis=-1)).ravel()
    # uniform noise: 80% of neighbours differ by more than 0.1 of the range; grain alone (2%) by less
    assert np.mean(steps < 0.1) > 0.8
    assert np.mean(steps > 0.25) > 0.005  # edges between discs


@pytest.mark.parametrize("chunk", [images._CHUNK_PIXELS, 64])  # 64: discs wider than 8 px each on its own
def test_each_pixel_shows_the_last_disc_dropped_over_it(monkeypatch, chunk):
    monkeypatch.setattr(images, "_CHUNK_PIXELS", chunk)
    rng = np.random.default_rng(3)
    h, w, count = 30, 40, 200
    radii = rng.uniform(0.5, 12.0, count)
    cy, cx = rng.uniform(-5, h + 5, count), rng.uniform(-5, w + 5, count)
    expected = np.full((h, w), -1)
    ys, xs = np.mgrid[0:h, 0:w]
    for k in range(count):  # drawn one over the other
        expected[(ys - cy[k]) ** 2 + (xs - cx[k]) ** 2 <= radii[k] ** 2] = k
    assert np.array_equal(images._top_disc(radii, cy, cx, h, w).reshape(h, w), expected)
