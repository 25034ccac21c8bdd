"""Statistics folded where the model runs: exact (as folding in float64 in the parent was), only
statistics cross the pipe, and a chain of sessions drops each value once no later session needs it."""

from __future__ import annotations

import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

from amp_compiler.core.measures import binade_counts
from amp_compiler.errors import ModelCrashError
from amp_compiler.runtime import child, child_folds
from amp_compiler.runtime.runner import ChildRunner, InProcessRunner, _checked_statistics


def _reference(arrays: list[np.ndarray]) -> list[float]:
    """The statistics as the parent computed them before (every value in float64)."""
    lo, hi, absmax, nonzero, flushed, subnormal, count = np.inf, -np.inf, 0.0, 0, 0, 0, 0
    energy = lost = 0.0
    for a in arrays:
        a = np.asarray(a, dtype=np.float64).ravel()
        if not a.size:
            continue
        count += a.size
        finite = a[np.isfinite(a)]
        if finite.size:
            lo, hi = min(lo, float(finite.min())), max(hi, float(finite.max()))
        mag = np.abs(a[~np.isnan(a)])
        absmax = max(absmax, float(mag.max()) if mag.size else 0.0)
        nz = mag[mag > 0]
        nonzero += nz.size
        flushed += int(np.count_nonzero(nz < 2.0**-25))
        subnormal += int(np.count_nonzero(nz < 2.0**-14))
        energy += float(np.sum(mag[np.isfinite(mag)] ** 2))
        small = nz[nz < 2.0**-14]
        lost += float(np.sum((small.astype(np.float16).astype(np.float64) - small) ** 2))
    return [lo, hi, absmax, nonzero, flushed, subnormal, count, energy, lost]


def _assert_matches(got: list[float], ref: list[float]) -> None:
    """Counts and extremes exact, the two sums of squares to float32 dot products' precision."""
    assert got[:7] == ref[:7]
    np.testing.assert_allclose(got[7:9], ref[7:9], rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("special", ["none", "inf", "nan", "all-nan", "empty"])
def test_fold_array_is_exact(dtype, special):
    rng = np.random.default_rng(7)
    arrays = []
    for scale in (1e-9, 1e-6, 1e-3, 1e3):
        a = (rng.standard_normal((5, 33)) * scale).astype(dtype)
        a[0, :4] = 0
        arrays.append(a)
    if special == "inf":
        arrays[1][2, 3], arrays[2][1, 1] = np.inf, -np.inf
    elif special == "nan":
        arrays[3][4, 4] = np.nan
    elif special == "all-nan":
        arrays.append(np.full((3,), np.nan, dtype))
    elif special == "empty":
        arrays.append(np.zeros((0, 4), dtype))
    stats: dict[str, list] = {}
    for a in arrays:
        child_folds.fold_array(np, stats, "t", a)
    _assert_matches(stats["t"], _reference(arrays))
    assert stats["t"][5] > stats["t"][4] > (0 if dtype != np.float16 else -1)  # flushed, subnormal values seen
    assert (stats["t"][8] > 0) is (dtype != np.float16)  # FP16 storage loses what FP16 values do not have


def _chain_models():
    """x -> Sin -> a -> Cos -> b ; b, a -> Add -> y: as two sessions (the second takes a and b)."""
    f = TensorProto.FLOAT
    first = helper.make_model(helper.make_graph(
        [helper.make_node("Sin", ["x"], ["a"]), helper.make_node("Cos", ["a"], ["b"])], "first",
        [helper.make_tensor_value_info("x", f, None)],
        [helper.make_tensor_value_info("a", f, None), helper.make_tensor_value_info("b", f, None)],
    ), opset_imports=[helper.make_opsetid("", 17)])
    second = helper.make_model(helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "second",
        [helper.make_tensor_value_info("a", f, None), helper.make_tensor_value_info("b", f, None)],
        [helper.make_tensor_value_info("y", f, None)],
    ), opset_imports=[helper.make_opsetid("", 17)])
    return first, second


@pytest.mark.parametrize("runner_type", [InProcessRunner, ChildRunner])
def test_fold_returns_statistics_only(runner_type):
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(8, 8)
    with runner_type() as runner:
        sessions = [runner.load(m, basic=True, chained=True) for m in _chain_models()]
        assert runner.fold(sessions, {"x": x}, 5) is None
        runner.fold(sessions, {"x": 2 * x}, 5)
        stats = runner.statistics(5)
        assert runner.statistics(5) == {}  # answered once, then forgotten
    a = [np.sin(x), np.sin(2 * x)]
    b = [np.cos(v) for v in a]
    y = [u + v for u, v in zip(a, b, strict=True)]
    assert set(stats) == {"a", "b", "y"}
    for name, values in (("a", a), ("b", b), ("y", y)):
        ref = _reference(values)
        assert stats[name][3:7] == ref[3:7]
        np.testing.assert_allclose(stats[name][:3] + stats[name][7:9], ref[:3] + ref[7:9], rtol=1e-6, atol=1e-30)


class _FakeSession:
    """A session whose outputs are tracked by weak references: how many are alive during each run."""

    def __init__(self, inputs, outputs, alive, log):
        self.inputs, self.outputs, self.alive, self.log = inputs, outputs, alive, log

    def get_inputs(self):
        return [type("I", (), {"name": n})() for n in self.inputs]

    def get_outputs(self):
        return [type("O", (), {"name": n})() for n in self.outputs]

    def run(self, _names, feeds, _options):
        self.log.append(sum(r() is not None for r in self.alive))
        out = [np.full(1000, float(len(self.alive)), np.float32) for _ in self.outputs]
        self.alive.extend(weakref.ref(o) for o in out)
        return out


def test_run_chain_drops_values_no_later_session_needs():
    alive: list = []
    log: list[int] = []
    # ten sessions in a line: each takes the previous one's "out" only; "side" outputs are never taken
    sessions = [_FakeSession([f"out{i - 1}" if i else "x"], [f"out{i}", f"side{i}"], alive, log) for i in range(10)]
    stats: dict[str, list] = {}
    child.run_chain(np, sessions, {"x": np.ones(3, np.float32)}, None, stats)
    assert len(stats) == 20  # every output folded
    # while a session runs, only the outputs of the one before are alive (the value it takes among them),
    # folded meanwhile
    assert max(log) <= 2
    assert all(r() is None for r in alive)  # and nothing is held once the chain ran


@pytest.mark.parametrize("raw", [None, [], {"t": [1, 2]}, {"t": ["a", 1, 2, 3, 4, 5, 6]}, {"t": [True] * 7}])
def test_statistics_outside_the_protocol_are_a_crash(raw):
    with pytest.raises(ModelCrashError):
        _checked_statistics(raw)


def _chunked_energy(a: np.ndarray) -> float:
    """The sum of squares as array_stats has always added it: float64 sums of float32 dot products of
    chunks of 2^16 values, in order."""
    total = 0.0
    for start in range(0, a.size, 1 << 16):
        chunk = a[start:start + (1 << 16)]
        total += float(np.dot(chunk, chunk))
    return total


def _block_sample(a: np.ndarray) -> list[np.ndarray]:
    """Each of array_stats' blocks' sample: every sample_stride-th value of the block."""
    stride = child_folds.sample_stride(a.size)
    return [a[i:i + 2**17][::stride] for i in range(0, a.size, 2**17)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_array_stats_over_many_blocks(dtype):
    """Regression guard: values spread over several of array_stats' blocks (extremes at a block's
    first and last value, zeros in some blocks only) give the whole array's extremes and count and the
    same sum of squares bit for bit (the same chunks, in the same order); the counts are the blocks'
    samples'."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal(700_001).astype(dtype)
    a[200_000:200_050] = 0
    a[::61 * 5] = 2.0**-26  # in the sample: flushed
    a[61::61 * 7] = -(2.0**-20)  # in the sample: subnormal
    a[[1, 131_071, 131_072, 400_001]] = [-9.0, 8.0, -7.5, 9.5]
    stats = child_folds.array_stats(np, a)
    assert stats[:3] == [-9.0, 9.5, 9.5] and stats[6] == a.size
    sample = np.abs(np.concatenate(_block_sample(a)).astype(np.float64))
    nonzero = sample[sample > 0]
    assert stats[3:6] == [nonzero.size, np.count_nonzero(nonzero < 2.0**-25), np.count_nonzero(nonzero < 2.0**-14)]
    assert stats[4] > 100 and stats[5] > stats[4] + 100
    assert stats[7] == _chunked_energy(a)
    lost = 0.0  # each block's sample's storage error, scaled by the block's size over its sample's
    for k, part in enumerate(_block_sample(a)):
        m = np.abs(part.astype(np.float64))
        small = m[(m > 0) & (m < 2.0**-14)]
        lost += float(np.sum((small.astype(np.float16).astype(np.float64) - small) ** 2)) * (
            min(2**17, a.size - k * 2**17) / part.size)
    np.testing.assert_allclose(stats[8], lost, rtol=1e-5)


def test_sampled_shares_and_storage_error_estimate_the_whole_arrays():
    """Where small values lie at random, the sample's shares and the scaled storage error are within a
    few percent of the whole array's."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal(2_000_000).astype(np.float32)
    tiny = rng.random(a.size) < 0.03
    a[tiny] = (rng.standard_normal(int(tiny.sum())) * 1e-7).astype(np.float32)
    a[rng.random(a.size) < 0.2] = 0
    stats: dict[str, list] = {}
    child_folds.fold_array(np, stats, "t", a)
    ref = _reference([a])
    got = stats["t"]
    assert got[:3] == ref[:3] and got[6] == ref[6]
    np.testing.assert_allclose(got[7], ref[7], rtol=1e-5)
    np.testing.assert_allclose(got[5] / got[3], ref[5] / ref[3], rtol=0.05)  # subnormal share
    np.testing.assert_allclose(got[4] / got[3], ref[4] / ref[3], rtol=0.15)  # flushed share (0.7% of values)
    np.testing.assert_allclose(got[8], ref[8], rtol=0.1)
    assert got[3] < ref[3] / 50  # counted on a sample of every 61st value


@pytest.mark.parametrize("zeros", [(0.0, 0.0), (-0.0, -0.0), (0.0, -0.0), (-0.0, 0.0)])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_array_stats_zero_extremes_are_positive(zeros, nonfinite):
    """Where the smallest (or largest) value is zero, it is +0.0, whatever the signs of the zeros and the
    blocks they lie in (numpy's min would give either)."""
    a = np.full(300_000, 1.5, np.float32)
    a[:100_000:1000], a[100_000::1000] = zeros
    if nonfinite:
        a[-1] = np.inf
    lo, hi = child_folds.array_stats(np, a)[0], child_folds.array_stats(np, -a)[1]
    assert lo == 0 and hi == 0
    assert not np.signbit(lo) and not np.signbit(hi)


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_array_stats_see_a_non_finite_value_in_a_later_block(special):
    """Regression guard: one NaN or inf after the first block sends the whole array down the non-finite
    path (a NaN must not be lost comparing the blocks' extremes)."""
    a = np.linspace(-2, 3, 400_000, dtype=np.float32)
    a[-5] = special
    stats = child_folds.array_stats(np, a)
    finite = a[np.isfinite(a)]
    assert stats[:3] == [float(finite.min()), float(finite.max()), 3.0 if np.isnan(special) else np.inf]
    assert stats[6] == a.size


def test_array_stats_temporaries_are_a_blocks_not_the_arrays():
    """Memory: folding a large finite tensor allocates block-sized temporaries, not a copy of the
    array's size (which was 5 bytes a value: its magnitudes' bits and a mask)."""
    import tracemalloc

    a = np.random.default_rng(2).standard_normal(4_000_000).astype(np.float32)  # 16 MB
    a[::3] = 0
    a[::1000] = 1e-6
    tracemalloc.start()
    try:
        child_folds.array_stats(np, a)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < a.nbytes // 8


def test_the_binades_count_a_sample_of_the_non_zero_magnitudes():
    """Every sample_stride-th value of each block, zeros and non-finite values left out, by binade; the
    first and last bins hold everything beyond them."""
    assert child_folds.sample_stride(100) == 1 and child_folds.sample_stride(10**7) == 61
    assert child_folds.sample_stride(2048 * 17) == 17  # a prime: never a channel count's divisor
    a = np.array([3.0, -0.75, 2.0**-30, 2.0**40, 0.0, 1.0, 5e-5, -0.0], np.float32)
    binades = child_folds.array_stats(np, a)[child_folds.HISTOGRAM]
    assert len(binades) == len(child_folds.EXPONENT_FIELDS)
    low = child_folds.EXPONENT_LOW
    expected = {1 - low: 1, -1 - low: 1, 0: 1, len(binades) - 1: 1, 0 - low: 1, -15 - low: 1}
    assert {i: n for i, n in enumerate(binades) if n} == expected
    # a non-finite array goes the other way, to the same bins
    with_inf = np.append(a, np.float32(np.inf))
    assert child_folds.array_stats(np, with_inf)[child_folds.HISTOGRAM] == binades
    # a large one: every 61st value of each block
    x = np.random.default_rng(1).standard_normal(300_000).astype(np.float32) * 100
    x[::7] = 0
    got = child_folds.array_stats(np, x)[child_folds.HISTOGRAM]
    blocks = [x[i:i + 2**17][::61] for i in range(0, x.size, 2**17)]
    sample = np.abs(np.concatenate(blocks))
    assert got == binade_counts(sample[sample > 0])


def _peaks(stats: list) -> tuple[int, float, dict[int, float]]:
    fields = stats[child_folds.PEAKS_AT:]
    listed = zip(fields[2:2 + child_folds.PEAKS], fields[2 + child_folds.PEAKS:], strict=True)
    return int(fields[0]), fields[1], {int(i): m for i, m in listed if i >= 0}


def test_channel_peaks_list_the_largest_channels_of_the_last_axis():
    """A tensor reaching 1024 records its channels' peaks along its last axis: the 8 largest listed,
    every other channel below ``rest``; a tensor below 1024 records none."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 50, 64)).astype(np.float32)
    x[1, 7, 5], x[2, :, 40] = -3e5, 2e4
    x[0, 0, 9] = np.nan  # ignored
    size, rest, listed = _peaks(child_folds.array_stats(np, x))
    assert size == 64 and list(listed)[:2] == [5, 40] and listed[5] == 3e5 and listed[40] == 2e4
    assert len(listed) == child_folds.PEAKS
    others = np.delete(np.abs(x), list(listed), axis=-1)
    assert rest == float(np.nanmax(others))
    assert _peaks(child_folds.array_stats(np, x / 1000))[0] == 0


def test_merged_channel_peaks_bound_every_channel_over_all_arrays():
    """Over two arrays a channel's peak is the larger of its two, one an array did not list being its
    rest, or its absmax where it recorded none; sizes that differ leave the peaks unknown (-1)."""
    a = np.ones((4, 16), np.float32)
    a[:, 3] = 5e4
    b = np.ones((4, 16), np.float32) * 2
    b[:, 9] = 7e4
    c = np.full((4, 16), 900.0, np.float32)  # below 1024: no peaks, every channel within 900
    stats: dict[str, list] = {}
    for x in (a, b, c):
        child_folds.fold_array(np, stats, "t", x)
    size, rest, listed = _peaks(stats["t"])
    assert size == 16 and listed[9] == 7e4 and listed[3] == 5e4 and rest == 900.0
    assert all(m == 900.0 for i, m in listed.items() if i not in (3, 9))
    child_folds.fold_array(np, stats, "t", np.full((2, 8), 3e3, np.float32))
    assert _peaks(stats["t"])[0] == -1


def test_the_childs_pipes_are_widened_on_linux():
    """The child's pipes hold 1 MiB (not Linux's 64 KiB): a model's bytes cross in fewer round trips."""
    import sys

    from amp_compiler.runtime.pipes import PIPE_BYTES

    if not sys.platform.startswith("linux"):
        pytest.skip("expected: pipe sizes are Linux's")
    with open("/proc/sys/fs/pipe-max-size") as f:
        if int(f.read()) < PIPE_BYTES:
            pytest.skip("expected: this system lets a process widen its pipes less")
    import fcntl

    with ChildRunner() as runner:
        proc = runner._proc
        sizes = [fcntl.fcntl(s.fileno(), getattr(fcntl, "F_GETPIPE_SZ", 1032)) for s in (proc.stdin, proc.stdout)]
    assert sizes == [PIPE_BYTES, PIPE_BYTES]


def test_repeated_statistics_are_those_of_the_copies_folded():
    """A constant folded once stands for its every run: its statistics as if each copy had been folded."""
    a = np.array([[0.5, -3.0, 1e-9, 0.0], [2000.0, 7.0, -1e-6, 4.0]], np.float32)
    folded: dict[str, list] = {}
    for _ in range(3):
        child_folds.fold_array(np, folded, "c", a)
    assert child_folds.repeated_stats(child_folds.array_stats(np, a), 3) == pytest.approx(folded["c"])
