"""The statistics the model-running child folds its tensors into: one tensor's running range and
underflow statistics (:func:`fold_array`, :data:`STAT_FIELDS`: calibration and the range probe) and
one tensor pair's running error sums against the FP32 reference (:func:`error_sums`,
:data:`ERROR_FIELDS`: ``--tolerance``'s per-node errors). Only these cross the pipe.

Like :mod:`amp_compiler.runtime.child`, which loads this file by its path when it runs as a script,
it imports nothing (numpy is passed in as ``np``): the child has nothing of amp_compiler on its path.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ERROR_FIELDS", "STAT_FIELDS", "add_sums", "array_stats", "channel_peaks", "error_sums", "fold_array",
    "merge_peaks", "merge_stats", "repeated_stats",
]

#: The running statistics of one tensor (:func:`fold_array`), in this order: its smallest and largest
#: finite value, its largest magnitude (inf included, NaN ignored), then, in a sample of its values
#: (every :func:`sample_stride`-th value of each block, a small tensor whole, NaN left out), the
#: non-zero values, those of them below half FP16's smallest subnormal (2^-25: flushed to zero) and
#: below FP16's smallest normal (2^-14): their ratios are the shares that flush and that lose precision;
#: then all its values, the sum of its finite values' squares (its energy), and the sum of the squared
#: errors FP16 storage gives its values below 2^-14 (flushed or subnormal: the error FP16's exponent
#: range adds to its rounding), estimated from the sample's (each block's scaled by its size over its
#: sample's). ``sqrt(lost / energy)`` is what flushing moves the tensor by, relative to its own L2 norm.
#: Extremes, count and energy are exact; the rest comes from the sample because counting every value
#: took two thirds of the fold's time (six passes over each block), and what they decide (a share of a
#: tensor's values, an error relative to its norm) a few thousand values a block measure to a percent
#: or so: a value too rare to be sampled is too rare to move either.
#: Then a histogram of the magnitudes of the sample's non-zero finite values: per binade
#: 2^e <= |x| < 2^(e+1) for e in :data:`EXPONENT_LOW` ... :data:`EXPONENT_HIGH`, the first bin also
#: counting every smaller value and the last every larger one. It says where a tensor's bulk lies,
#: which its extremes and its energy (both a few outliers' when it has them) do not: what a
#: power-of-two scaling pushes below FP16's normals.
#: Last, where its largest magnitude reaches :data:`CHANNEL_LEAST`, its channels' peaks along its last
#: axis: the axis's size (0: not recorded, every channel within the tensor's absmax; -1: the size
#: differed between arrays), the largest magnitude of every channel not listed, then the
#: :data:`PEAKS` channels of the largest magnitudes, indices (-1: none) and magnitudes, largest first.
#: Massive activations lie in a few channels (a decoder's residual stream, its MLP's down projection):
#: a matrix product may then be scaled per channel (:mod:`amp_compiler.passes.analysis.range_scaling`).
EXPONENT_LOW, EXPONENT_HIGH = -24, 23
EXPONENT_FIELDS = tuple(f"binade{e}" for e in range(EXPONENT_LOW, EXPONENT_HIGH + 1))
PEAKS = 8
PEAK_FIELDS = ("channels", "rest", *(f"peak{i}_index" for i in range(PEAKS)), *(f"peak{i}" for i in range(PEAKS)))
#: A tensor below this magnitude gets no channel peaks (a power of two: FP16's largest finite value over
#: 64): its every channel is then known to lie below it, where no scaling by a margin up to 64 shifts it.
CHANNEL_LEAST = 1024.0
STAT_FIELDS = ("min", "max", "absmax", "nonzero", "flushed", "subnormal", "count", "energy", "lost", *EXPONENT_FIELDS,
               *PEAK_FIELDS)
#: The strides a sample may take: primes, which a tensor's dims (channels, heads, hidden sizes: multiples
#: of 8 and 16) never align with, so that the sample passes through every channel, not always the same
#: ones. A tensor is sampled at the largest that leaves its first block :data:`SAMPLE_LEAST` values,
#: 61 for a full block of 128K: 2K values a block place a histogram's shares to a percent or so, and
#: every 61st value costs the fold a few percent of its time where every 17th cost it 25%; a tensor
#: of fewer than twice :data:`SAMPLE_LEAST` values is taken whole.
SAMPLE_STRIDES = (1, 2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61)
SAMPLE_LEAST = 2048
#: How many of :data:`STAT_FIELDS` come before the histogram; where the histogram lies; where the peaks start.
SCALARS = STAT_FIELDS.index(EXPONENT_FIELDS[0])
HISTOGRAM = slice(SCALARS, SCALARS + len(EXPONENT_FIELDS))
PEAKS_AT = HISTOGRAM.stop
_NO_PEAKS = [0, 0.0, *[-1] * PEAKS, *[0.0] * PEAKS]
_MANTISSA_BITS = {4: 23, 8: 52}  # per float itemsize: the exponent field starts above these bits


def sample_stride(size: int) -> int:
    """The stride of the sample of an array of ``size`` values (see :data:`SAMPLE_STRIDES`)."""
    most = max(1, min(size, _BLOCK) // SAMPLE_LEAST)
    return max(s for s in SAMPLE_STRIDES if s <= most)


_FLUSHED, _SUBNORMAL = 2.0**-25, 2.0**-14
_INF = float("inf")

#: The running error sums of a tensor against its FP32 reference (:func:`error_sums`), in this order:
#: the sums of squared errors, of squared finite reference values, of squared converted and of the
#: products where both are finite, the largest absolute error, the reference's smallest and largest
#: finite value, the values not finite where the reference is, those other than the reference's where
#: it is not finite (a NaN matches nothing), all its values. The fields of
#: :class:`amp_compiler.core.tensor_error.ErrorStats`, which computes them the same way.
ERROR_FIELDS = ("diff2", "ref2", "got2", "dot", "max_abs", "ref_min", "ref_max", "nonfinite", "unmatched", "count")
_ERROR_CHUNK = 1 << 15  # values per pass of error_sums: its float64 temporaries (768 kB) stay in the cache


def fold_array(np: Any, stats: dict[str, list], name: str, a: Any) -> None:
    """Fold the float array ``a`` into ``stats[name]`` (:data:`STAT_FIELDS`; created on first use). Exact:
    min/max/absmax are values of ``a`` and the thresholds are powers of two, so folding in ``a``'s
    own type (float16 in float32) gives what folding in float64 gives; the two sums of squares are
    float64 sums of float32 dot products of chunks (relative error below 1e-6 a chunk)."""
    merge_stats(stats, name, array_stats(np, a))


def array_stats(np: Any, a: Any) -> list:
    """One array's :data:`STAT_FIELDS` (see :func:`fold_array`): a block at a time while its values are
    finite (:func:`_finite_stats`), else over the whole array."""
    if a.size == 0:  # seen, no values
        return [float("inf"), float("-inf"), 0.0, 0, 0, 0, 0, 0.0, 0.0, *[0] * len(EXPONENT_FIELDS), *_NO_PEAKS]
    if a.dtype.itemsize < 4:
        a = a.astype(np.float32)
    flat = a.ravel()
    stats = _finite_stats(np, flat)
    if stats is None:
        stats = _nonfinite_stats(np, flat)
    peaks = channel_peaks(np, a) if stats[2] >= CHANNEL_LEAST and a.ndim else _NO_PEAKS
    return [*stats, *peaks]


def channel_peaks(np: Any, a: Any) -> list:
    """The array ``a``'s channel peaks (:data:`PEAK_FIELDS`) along its last axis: each channel's largest
    magnitude (NaN ignored), a block of rows at a time."""
    channels = a.shape[-1]
    rows = a.reshape(-1, channels)
    step = max(1, _BLOCK // max(channels, 1))
    peak = np.zeros(channels, np.float64)
    for start in range(0, rows.shape[0], step):
        np.fmax(peak, np.fmax.reduce(np.abs(rows[start:start + step]), axis=0), out=peak)
    order = np.argsort(-peak, kind="stable")
    top, others = order[:PEAKS], order[PEAKS:]
    indices = [int(i) for i in top] + [-1] * (PEAKS - top.size)
    values = [float(peak[i]) for i in top] + [0.0] * (PEAKS - top.size)
    return [channels, float(peak[others].max()) if others.size else 0.0, *indices, *values]


def merge_peaks(old: list, old_absmax: float, new: list, new_absmax: float) -> list:
    """Two arrays' channel peaks (:data:`PEAK_FIELDS`) as one: a channel's peak is the larger of its two,
    an array's peak of a channel it does not list being its ``rest`` (or its absmax where it recorded no
    peaks); the :data:`PEAKS` largest are listed, the others go to ``rest``."""
    def parts(peaks: list, absmax: float) -> tuple[int, float, dict[int, float]]:
        if peaks[0] == 0:
            return 0, absmax, {}
        listed = peaks[2:2 + PEAKS], peaks[2 + PEAKS:2 + 2 * PEAKS]
        return int(peaks[0]), float(peaks[1]), {int(i): float(m) for i, m in zip(*listed, strict=True) if i >= 0}

    (size_a, rest_a, a), (size_b, rest_b, b) = parts(old, old_absmax), parts(new, new_absmax)
    if size_a == 0 and size_b == 0:
        return list(_NO_PEAKS)
    size = -1 if size_a < 0 or size_b < 0 or (size_a and size_b and size_a != size_b) else size_a or size_b
    merged = {i: max(a.get(i, rest_a), b.get(i, rest_b)) for i in a.keys() | b.keys()}
    order = sorted(merged, key=lambda i: (-merged[i], i))
    rest = max([rest_a, rest_b, *(merged[i] for i in order[PEAKS:])])
    top = order[:PEAKS]
    return [size, rest, *top, *[-1] * (PEAKS - len(top)), *(merged[i] for i in top), *[0.0] * (PEAKS - len(top))]


#: Values per float32 dot product in :func:`_sum_squares`.
_SQUARES_CHUNK = 1 << 16
#: Values per block of :func:`_finite_stats` (a multiple of :data:`_SQUARES_CHUNK`): a float32 block, its
#: magnitudes' bits and their mask (1.1 MB) stay in the CPU's cache across the block's passes.
_BLOCK = 2 * _SQUARES_CHUNK


def _finite_stats(np: Any, a: Any) -> list | None:
    """The flat float32 or float64 array ``a``'s :data:`STAT_FIELDS`, or None once a block holds NaN or inf.
    Per block: three passes over all its values, in the cache (its min, its max, its chunks' dot
    products), and its sample (:func:`sample_stride`) gathered as its magnitudes' bits (sign cleared)
    into one buffer; then, once over the whole sample: its binades, its non-zero count, and those below
    2^-14 (bits minus one, below 2^-14's bits minus one: positive floats order as their bits, a zero
    wraps around to the largest), the flushed among them and their storage error, each value's scaled
    up by its block's size over its block's sample's. Extremes and energy are the whole array's (its
    blocks' extremes' extremes; the energy's chunks the same, in the same order, as one pass gives); a
    zero extreme is +0.0. The array is read from memory once (the fold is bound by memory, not by
    arithmetic: a block's later passes find it in the cache); the sample's passes, done once, cost
    a few numpy calls per array, not per block."""
    uint = np.dtype(f"u{a.dtype.itemsize}")
    magnitude = uint.type(np.iinfo(uint).max >> 1)
    bits = a.view(uint)
    stride = sample_stride(a.size)
    full = -(-min(_BLOCK, a.size) // stride)  # a full block's sample
    blocks = -(-a.size // _BLOCK)
    sample = np.empty(full * blocks, uint)
    lows, highs = np.empty(blocks, a.dtype), np.empty(blocks, a.dtype)
    taken, energy = 0, 0.0
    low, high, dot, bitwise_and = np.minimum.reduce, np.maximum.reduce, np.dot, np.bitwise_and  # looked up once
    with np.errstate(over="ignore"):
        for b, start in enumerate(range(0, a.size, _BLOCK)):
            block = a[start:start + _BLOCK]
            lows[b] = lo = low(block)
            highs[b] = hi = high(block)
            if not -_INF < lo <= hi < _INF:  # NaN (it propagates, and fails every comparison) or inf
                return None
            for chunk in range(0, block.size, _SQUARES_CHUNK):  # _sum_squares inline: no call, no errstate
                part = block[chunk:chunk + _SQUARES_CHUNK]
                energy += float(dot(part, part))
            part = bits[start:start + block.size:stride]
            bitwise_and(part, magnitude, out=sample[taken:taken + part.size])
            taken += part.size
    nonzero, flushed, subnormal, lost, exponents = _sample_counts(np, a, sample[:taken], full)
    lo, hi = float(lows.min()) + 0.0, float(highs.max()) + 0.0  # + 0.0: a zero extreme is +0.0 whatever its sign
    return [lo, hi, max(-lo, hi), nonzero, flushed, subnormal, int(a.size), energy, lost,
            *_binades_of_exponents(exponents)]


def _sample_counts(np: Any, a: Any, m: Any, full: int) -> tuple[int, int, int, float, Any]:
    """From the magnitudes' bits ``m`` of the flat array ``a``'s sample (:func:`_finite_stats`; ``full`` values
    from each full block, then the last block's): the non-zero count, the flushed and subnormal ones,
    their storage error scaled up to the array (each block's by its size over its sample's: the last
    block's may differ) and the biased exponents' counts (``m`` is overwritten)."""
    uint = m.dtype
    one = uint.type(1)
    subnormal_bits, flushed_bits = (np.array(t, a.dtype).view(uint) - one for t in (_SUBNORMAL, _FLUSHED))
    mantissa_bits = _MANTISSA_BITS[a.dtype.itemsize]
    exponents = np.bincount(m >> uint.type(mantissa_bits), minlength=1 << (8 * a.dtype.itemsize - 1 - mantissa_bits))
    exponents = exponents.astype(np.int64)
    nonzero = int(np.count_nonzero(m))
    exponents[0] -= m.size - nonzero  # a zero's biased exponent is 0, as a subnormal's
    m -= one
    where = np.flatnonzero(m < subnormal_bits)
    if not where.size:  # the flushed are among the subnormal (most arrays have none)
        return nonzero, 0, 0, 0.0, exponents
    flushed = int(np.count_nonzero(m[where] < flushed_bits))
    small = (m[where] + one).view(a.dtype)
    whole = (a.size // _BLOCK) * full  # the sample's values from full blocks
    lost = 0.0
    for part, block, taken in ((small[where < whole], _BLOCK, full), (small[where >= whole], a.size % _BLOCK, 0)):
        if part.size:
            lost += _storage_error(np, part) * (block / (taken or m.size - whole))
    return nonzero, flushed, where.size, lost, exponents


def _binades_of_exponents(counts: Any) -> list[int]:
    """Biased exponent counts (a float's exponent field, as many as the field has values) as
    :data:`EXPONENT_FIELDS`' bins: subnormals (field 0) and every binade below the first bin go to it,
    every one above the last to it."""
    bias = (counts.size >> 1) - 1
    last = len(EXPONENT_FIELDS) - 1
    # field f's binade is f - bias (a subnormal, field 0, lies below its type's smallest normal: as field 1)
    first, top = EXPONENT_LOW + bias, EXPONENT_LOW + bias + last  # the fields of the first and last bins
    below, above = int(counts[:first + 1].sum()), int(counts[top:].sum())
    middle = counts[first + 1:top].tolist()
    return [below, *middle, above]


def _nonfinite_stats(np: Any, a: Any) -> list:
    """The flat float array ``a``'s :data:`STAT_FIELDS` when it holds NaN or inf: extremes and energy over
    its finite values, its absmax over those not NaN, the counts, the storage error and the histogram
    from the same sample as :func:`_finite_stats` takes (NaN left out). Temporaries: its finite values
    and a mask of a quarter of its size (a float32 array's)."""
    finite = a[np.isfinite(a)]
    lo, hi = (float(finite.min()) + 0.0, float(finite.max()) + 0.0) if finite.size else (np.inf, -np.inf)
    energy = _sum_squares(np, finite)
    del finite
    magnitudes = np.abs(a[~np.isnan(a)])
    absmax = float(magnitudes.max()) if magnitudes.size else 0.0
    del magnitudes
    uint, mantissa_bits = np.dtype(f"u{a.dtype.itemsize}"), _MANTISSA_BITS[a.dtype.itemsize]
    exponents = np.zeros(1 << (8 * a.dtype.itemsize - 1 - mantissa_bits), np.int64)
    stride = sample_stride(a.size)
    nonzero = flushed = subnormal = 0
    lost = 0.0
    for start in range(0, a.size, _BLOCK):
        block = a[start:start + _BLOCK]
        sample = block[::stride]
        mag = np.abs(sample[~np.isnan(sample)])
        mag = mag[mag > 0]
        nonzero += mag.size
        small = mag[mag < _SUBNORMAL]
        subnormal += small.size
        flushed += int(np.count_nonzero(small < _FLUSHED))
        if small.size:
            lost += _storage_error(np, small) * (block.size / sample.size)
        finite = mag[np.isfinite(mag)]
        exponents += np.bincount(finite.view(uint) >> uint.type(mantissa_bits), minlength=exponents.size)
    return [lo, hi, absmax, nonzero, flushed, subnormal, int(a.size), energy, lost, *_binades_of_exponents(exponents)]


def _storage_error(np: Any, small: Any) -> float:
    """The sum of the squared errors FP16 storage gives ``small`` (values below 2^-14): FP16 holds them
    on the grid of multiples of 2^-24, rounding to nearest even, as ``rint`` does on ``small * 2^24``
    (exact: a power of two; numpy's own float16 cast takes 0.5 us a subnormal)."""
    scaled = small * small.dtype.type(2.0**24)
    scaled -= np.rint(scaled)
    return _sum_squares(np, scaled) * 2.0**-48


def _sum_squares(np: Any, a: Any, total: float = 0.0) -> float:
    """``total`` plus the sum of the squares of the flat float array ``a``: float64 sums of dot products of
    chunks (no copy of ``a``; float64 arrays are dotted in float64). A square beyond float32's range is inf."""
    with np.errstate(over="ignore"):
        for start in range(0, a.size, _SQUARES_CHUNK):
            chunk = a[start:start + _SQUARES_CHUNK]
            total += float(np.dot(chunk, chunk))
    return total


def merge_stats(stats: dict[str, list], name: str, new: list) -> None:
    old = stats.get(name)
    if old is None:
        stats[name] = new
    elif new[6]:
        stats[name] = [min(old[0], new[0]), max(old[1], new[1]), max(old[2], new[2]), old[3] + new[3],
                       old[4] + new[4], old[5] + new[5], old[6] + new[6], old[7] + new[7], old[8] + new[8],
                       *[x + y for x, y in zip(old[HISTOGRAM], new[HISTOGRAM], strict=True)],
                       *merge_peaks(old[PEAKS_AT:], old[2], new[PEAKS_AT:], new[2])]


def repeated_stats(stats: list, n: int) -> list:
    """The statistics of ``n`` copies of the arrays whose statistics ``stats`` are (as :func:`merge_stats`
    of them would give, up to the order of the energies' sums): a constant's over ``n`` runs."""
    extremes, sums = stats[:3], stats[3:SCALARS]
    return [*extremes, *(x * n for x in sums), *(x * n for x in stats[HISTOGRAM]), *stats[PEAKS_AT:]]


def error_sums(np: Any, reference: Any, got: Any) -> list | None:
    """One (reference, converted) pair's :data:`ERROR_FIELDS` (None when their shapes differ), in float64
    as ``ErrorStats.add`` computes them, a chunk at a time (equal up to the order of the sums). The
    chunks stay in the CPU's cache across their passes; the sums are einsum's, not a BLAS dot (whose
    threads, on a loaded machine, made each of them 8x slower)."""
    if reference.shape != got.shape:
        return None
    r_all, g_all = reference.ravel(), got.ravel()
    out = [0.0, 0.0, 0.0, 0.0, 0.0, float("inf"), float("-inf"), 0, 0, int(r_all.size)]
    with np.errstate(over="ignore", invalid="ignore"):
        for lo in range(0, r_all.size, _ERROR_CHUNK):
            r_own = r_all[lo:lo + _ERROR_CHUNK]
            r, g = r_own.astype(np.float64), g_all[lo:lo + _ERROR_CHUNK].astype(np.float64)
            d = g - r
            ref2, diff2 = float(np.einsum("i,i->", r, r)), float(np.einsum("i,i->", d, d))
            if ref2 < float("inf") and diff2 < float("inf"):  # all finite (float32 squares cannot overflow)
                part = [diff2, ref2, float(np.einsum("i,i->", g, g)), float(np.einsum("i,i->", r, g)),
                        max(float(d.max()), -float(d.min())), float(r_own.min()), float(r_own.max()), 0, 0]
            else:
                finite = np.isfinite(r)
                kept = (r == g) | (np.isnan(r) & np.isnan(g))  # FP32's own NaN, or its inf of the same sign
                d = np.where(finite, np.where(np.isfinite(g), d, np.inf), np.where(kept, 0.0, np.inf))
                both = finite & np.isfinite(g)
                fin = r[finite]
                part = [float(np.sum(d * d)), float(np.sum(np.where(finite, r * r, 0.0))),
                        float(np.sum(np.where(both, g * g, 0.0))), float(np.sum(np.where(both, r * g, 0.0))),
                        float(np.max(np.abs(d))), float(fin.min()) if fin.size else float("inf"),
                        float(fin.max()) if fin.size else float("-inf"),
                        int(np.count_nonzero(finite & ~np.isfinite(g))), int(np.count_nonzero(~finite & ~kept))]
            out = add_sums(out, [*part, 0])
    return out


def add_sums(old: list, new: list) -> list:
    """Two :data:`ERROR_FIELDS` lists as one."""
    return [old[0] + new[0], old[1] + new[1], old[2] + new[2], old[3] + new[3], max(old[4], new[4]),
            min(old[5], new[5]), max(old[6], new[6]), old[7] + new[7], old[8] + new[8], old[9] + new[9]]
