"""Calibration: observed value ranges of every tensor, from runs of the FP32 model on sample inputs.

Samples come from ``--calibration-data`` (:mod:`amp_compiler.runtime.samples` reads them safely and checks
them against the model's inputs before anything runs). Statistics are computed where the model runs
(the runner's child process): the model, every main-graph float tensor exposed, is cut into a chain
of pieces (:mod:`amp_compiler.onnx.measure.chain`) run one after the other; each piece's tensors are
folded into running min/max/counts (:func:`amp_compiler.runtime.child_folds.fold_array`) and dropped, and only
the statistics come back. Memory holds two pieces' tensors (one folded while the next runs) and the
values between pieces, not every activation of a run; time is one run of the model per sample plus the folding.

:class:`IntermediateRunner` runs a model with every float tensor of its main graph exposed as an
output and returns them all; ``compare`` uses it to compare converted and FP32 tensors.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator

import numpy as np
import onnx
from onnx import numpy_helper

from amp_compiler.core.measures import ChannelPeaks, TensorRange, shift_rooms
from amp_compiler.errors import OptionError
from amp_compiler.onnx.measure.chain import ModelChain, exposed_model, session_feeds
from amp_compiler.policy.kernels import ORT_NAMES
from amp_compiler.runtime import child as runner_child
from amp_compiler.runtime import child_folds
from amp_compiler.runtime.input_uses import constant_nodes
from amp_compiler.runtime.runner import Runner, default_runner
from amp_compiler.targets import Provider

__all__ = ["IntermediateRunner", "collect_ranges", "ranges_of"]

#: Calibration's pieces are cut at this fraction of the model's live bytes. Two pieces' outputs are
#: held at once (:func:`runner_child.run_chain` folds one while the next runs); at a sixth each (not a
#: half), onnxruntime's arena, which keeps what it allocated for reuse, holds less: the child of
#: ppocr-v4-det's calibration (77 MB of live activations; ``benchmarks.calibration_cost``) peaks at
#: 222 MB, against 237 MB at a quarter and 255 MB at a half (an eighth: no less), in the same time (43
#: -> 113 pieces: 1.66-1.83 s against 1.82-1.94 s at a quarter, interleaved); resnet50-768 at 303 MB
#: from a quarter on (353 MB at a half).
_PIECES_AT_ONCE = 6
#: Calibration's pieces prepack their weights (:class:`ModelChain`'s ``prepack``) from this many samples on.
#: Prepacking copies every MatMul weight into the kernel's layout once, at the load; without, each run
#: packs what it multiplies. ViT-B (346 MB of weights; ``benchmarks.calibration_cost``): the pieces load in
#: 0.04 s against 0.35 s, and each sample runs 10 ms longer (0.44 s against 0.41 s for 4), so the
#: load's 0.3 s pay back after some 30 samples; a range probe's 1 or 2 and a calibration's few do not.
#: A few bits of difference in the products' last places move no range.
_PREPACK_FROM = 32
FP16_SMALLEST_SUBNORMAL = 2.0**-24
FP16_SMALLEST_NORMAL = 2.0**-14


class IntermediateRunner:
    """Runs a model on onnxruntime with every main-graph float tensor exposed, through ``runner``
    (:mod:`amp_compiler.runtime.runner`: a child process with a budget, or this process for trusted models),
    on the CPU provider or (``provider=Provider.CUDA``) on the CUDA provider, whose real FP16/BF16
    kernels then run; a provider onnxruntime does not start is an :class:`OptionError`."""

    def __init__(self, model: onnx.ModelProto, runner: Runner, provider: Provider = Provider.CPU):
        name = ORT_NAMES[provider]
        if name not in runner_child.PROVIDERS:
            raise OptionError(f"models run on the cpu or cuda execution provider, not {provider.value}",
                              option="provider")
        exposed, self.names = exposed_model(model)
        self.session = runner.load(exposed, provider=name, basic=True)  # see runner_child.session_options
        if self.session.providers[:1] != [name]:
            self.session.close()
            raise OptionError(
                f"onnxruntime here did not start the {provider.value} execution provider "
                f"(it started: {', '.join(self.session.providers)})", option="provider",
            )
        self.feeds = dict(zip(self.session.input_names, self.session.input_types, strict=True))
        self.runs = 0

    def run(self, sample: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.runs += 1
        feeds = session_feeds(sample, self.feeds)
        return dict(zip(self.names, self.session.run(feeds), strict=True))

    def close(self) -> None:
        self.session.close()


def _range(stats: list[float], room: int) -> TensorRange:
    """A tensor's :class:`TensorRange` from its running statistics (:data:`child_folds.STAT_FIELDS`) and the
    :func:`~amp_compiler.core.measures.shift_room` of their histogram."""
    lo, hi, absmax, nonzero, flushed, subnormal, count, energy, lost = stats[:child_folds.SCALARS]
    return TensorRange(
        min=lo if count else 0.0,
        max=hi if count else 0.0,
        absmax=absmax,
        underflow_share=flushed / nonzero if nonzero else 0.0,
        subnormal_share=subnormal / nonzero if nonzero else 0.0,
        count=int(count),
        underflow_error=_underflow_error(energy, lost, flushed),
        shift_room=room,
        binades=tuple(int(n) for n in stats[child_folds.HISTOGRAM]),
        channel_peaks=_peaks(stats[child_folds.PEAKS_AT:]),
    )


def _peaks(fields: list[float]) -> ChannelPeaks | None:
    """A tensor's :class:`ChannelPeaks` from its :data:`child_folds.PEAK_FIELDS` (None where not recorded,
    or where its last axis's size differed between samples)."""
    channels, rest = int(fields[0]), float(fields[1])
    if channels <= 0:
        return None
    indices, values = fields[2:2 + child_folds.PEAKS], fields[2 + child_folds.PEAKS:]
    listed = tuple((int(i), float(m)) for i, m in zip(indices, values, strict=True) if i >= 0)
    return ChannelPeaks(channels, listed, rest)


def _underflow_error(energy: float, lost: float, flushed: float) -> float:
    """``sqrt(lost / energy)`` (:data:`child_folds.STAT_FIELDS`); a tensor whose every value is so
    small that its float32 squares are zero (below 1e-19) is all lost when any flushes; a tensor whose
    squares reach inf (beyond 1.8e19) overflows FP16 instead."""
    if energy > 0:
        return math.sqrt(lost / energy) if math.isfinite(energy) else 0.0
    return 1.0 if lost > 0 or flushed > 0 else 0.0


def _progress(items: list, label: str) -> Iterator:
    """Yield items, drawing a progress bar on stderr when it is a terminal."""
    tty = sys.stderr.isatty()
    n = len(items)
    for i, item in enumerate(items, 1):
        yield item
        if tty:
            filled = int(30 * i / n)
            sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (30 - filled)}] {i}/{n}")
            sys.stderr.flush()
    if tty and n:
        sys.stderr.write("\n")


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The float values of the main graph's Constant nodes (:func:`~amp_compiler.runtime.input_uses.constant_nodes`),
    by output name: the same in every run, so calibration folds them once, not in every run of every sample
    (ppocr-v4-det's 342 of its 672 tensors: 8 ms of each sample's 120 ms of folding). A value that cannot be
    read here (external data) is left to the runs."""
    out = {}
    for name, tensor in constant_nodes(model.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        value = numpy_helper.to_array(tensor)
        if value.dtype in (np.float16, np.float32, np.float64):
            out[name] = value
    return out


def collect_ranges(
    model: onnx.ModelProto, samples: Iterable[dict[str, np.ndarray]], *, runner: Runner | None = None
) -> dict[str, TensorRange]:
    """Observed range of every main-graph float tensor of the FP32 model over the samples.
    ``runner``: where the model runs (default: a child process with the default budget)."""
    runner, owned = default_runner(runner)
    try:
        return _collect(model, samples, runner)
    finally:
        if owned:
            runner.close()


def _collect(
    model: onnx.ModelProto, samples: Iterable[dict[str, np.ndarray]], runner: Runner
) -> dict[str, TensorRange]:
    samples = list(samples)
    constants = _constants(model)
    chain = ModelChain(model, runner, samples[0] if samples else {}, at_once=_PIECES_AT_ONCE,
                       prepack=len(samples) >= _PREPACK_FROM, unexposed=set(constants))
    try:
        key = id(chain)  # this collection's running statistics in the runner (which others may share)
        inputs: dict[str, list] = {}
        for sample in _progress(samples, "calibrating"):
            runner.fold(chain.sessions, chain.feeds(sample), key)
            for name, value in sample.items():
                if np.issubdtype(value.dtype, np.floating):
                    child_folds.fold_array(np, inputs, name, np.asarray(value))
        observed = runner.statistics(key)
    finally:
        chain.close()
    for name, value in constants.items():  # the same in every run: folded here once (unless a piece gave it)
        if name not in observed and samples:
            observed[name] = child_folds.repeated_stats(child_folds.array_stats(np, value), len(samples))
    return ranges_of({**observed, **inputs})


def ranges_of(seen: dict[str, list]) -> dict[str, TensorRange]:
    """Each tensor's :class:`TensorRange` from its running statistics (:func:`child_folds.fold_array`'s),
    with the shift rooms of all of them (:func:`~amp_compiler.core.measures.shift_rooms`); the FX
    conversion's observed ranges (:mod:`amp_compiler.fx.graph.ranges`) come from here too."""
    rooms = shift_rooms([stats[child_folds.HISTOGRAM] for stats in seen.values()])
    return {name: _range(stats, int(room)) for (name, stats), room in zip(seen.items(), rooms, strict=True)}
