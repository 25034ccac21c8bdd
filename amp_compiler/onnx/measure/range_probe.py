"""The range probe: observed value ranges of the FP32 model on generated inputs, when no data is given.

    generated inputs (following what is known: --input-range, --input-shape, images, token ids, latents) ->
    one run of the FP32 model (its outputs kept: the reference the written model is measured against)
    [-> for a model with an image input, a second sample: the same with dead-leaves images, run too]
    -> one run per sample with every tensor observed (:func:`~amp_compiler.onnx.measure.calibrate.collect_ranges`)
    -> ranges for the calibration rules, as ``probe.overflow``/``probe.underflow``

A default conversion decides with these ranges what a calibration would decide with real data: a
hidden activation that overflows FP16 on image-range inputs is seen, without data. Generated inputs are
not real ones: what they show is evidence, not a bound, so the graph inputs' ranges they give never
feed the static range analysis (which treats input ranges as proven), and the reasons say where the
ranges came from. The margin is calibration's (2x, :class:`~amp_compiler.passes.analysis.calibration.
CalibrationRangePass`): see ``docs/converting.md`` for the catalog figures that chose it.

An image input takes uniform noise in its range, and the model runs a second time on the same sample
with dead-leaves images instead (:mod:`~amp_compiler.onnx.measure.images`: flat regions, edges, a 1/f
spectrum): ranges come from both, and the written model's error is the worst per output. Neither kind
alone shows every model that misses 2% of range on real images; the worse of the two does, on the
catalog (``docs/converting.md``). An image the graph does not normalize may have been normalized
otherwise than its range says (:data:`~amp_compiler.runtime.input_kinds.IMAGE_NORMALIZATIONS`): dead
leaves at each of the others run too, for the written model's error only (the noise at the widest range
bounds the ranges): a model fed values outside its own range may compute something degenerate there
(an OCR recogniser saying "blank" everywhere) whose error says nothing of its real one.

Whatever stops the run (the run budget, a crash, onnxruntime refusing the model or generated inputs that
do not fit) leaves the conversion without the probe and one warning line (:class:`ProbeSkipped`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import onnx

from amp_compiler.core.measures import TensorRange
from amp_compiler.errors import (
    ModelCrashError,
    ModelRefusedError,
    ModelRunError,
    ModelUnsupportedError,
    RunBudgetError,
)
from amp_compiler.onnx.load.text import first_line, shown
from amp_compiler.onnx.measure.calibrate import collect_ranges
from amp_compiler.onnx.measure.generated_inputs import Generated, dynamic_dims, runnable_inputs
from amp_compiler.onnx.measure.images import dead_leaves
from amp_compiler.onnx.measure.probe_dims import probe_dims, probe_shapes
from amp_compiler.runtime.input_kinds import image_channels, image_inputs, input_kinds, model_inputs
from amp_compiler.runtime.runner import Runner
from amp_compiler.runtime.samples import SampleSizeError, tensors_only

__all__ = [
    "IMAGE_SAMPLES", "LEAVES_PER_NORMALIZATION", "MANY_PIXELS", "MOSTLY_NONFINITE", "PROBE_MAX_NODES",
    "PROBE_MAX_WEIGHT_BYTES", "ProbeSamples", "ProbeSkipped",
    "RangeProbe", "probe_ranges", "probe_samples",
]

#: Models whose weights take more than this are converted without the probe (one warning): their
#: weights stay on disk for the conversion, and running them would read all of them into the child.
PROBE_MAX_WEIGHT_BYTES = 1 << 30
#: Graphs of more nodes are converted without the probe (one warning). Its cost grows a little faster
#: than the node count: onnxruntime sessions of the FP32 model (the dims search's run), of its pieces with
#: every tensor exposed, and of the emulated written model (3x the nodes: a rounding Cast pair per FP16
#: tensor), and the emulation's rewrite. Whole ``convert`` processes on a shared 2-core machine
#: (``benchmarks.probe_cost``, generated transformers), with the probe against ``--no-probe``: 3,000 nodes
#: 4.3 s / 2.0 s, 10,000 20 s / 3.3 s, 20,000 56 s / 13 s; 50,000 did not finish in 5 min (20.6 s without);
#: a 64-layer Llama's TorchScript export (14,576 nodes) 36 s / 7.6 s, peak RSS 368 MB / 232 MB. Up to
#: 25,000 nodes the probe stays near a minute: every 64-80-layer decoder export is probed (the old limit,
#: 3,000, left a 64-layer one, logits 22-86% off, with no error stated); past it, minutes.
PROBE_MAX_NODES = 25_000


@dataclasses.dataclass
class RangeProbe:
    """What the probe observed: the generated samples, the FP32 model's outputs on them (graph output
    order), every float tensor's range, the model runs it took, and how the inputs were made."""

    samples: list[dict[str, np.ndarray]]
    outputs: list[list[np.ndarray]]
    ranges: dict[str, TensorRange]
    runs: int
    inputs: str  # "x: image 0..1; batch=1" (what each input's values followed, dynamic dims, mostly NaN outputs)
    dims: dict[str, int] = dataclasses.field(default_factory=dict)  # the dynamic dims' values (the search's)
    kinds: list[str] = dataclasses.field(default_factory=list)  # per sample, what its images are (image models)


#: When more than this share of the FP32 model's float output values on the generated samples are NaN or
#: infinite (log(x + 1) of an N(0, 1) feature: NaN below -1), the probe's description says so: its ranges
#: and the written model's error on them say little (a reference of NaN compares as a match, range 0).
MOSTLY_NONFINITE = 0.5


#: What the samples of a model with an image input hold there, in order: the generated sample's
#: uniform noise, then dead leaves (:func:`~amp_compiler.onnx.measure.images.dead_leaves`).
IMAGE_SAMPLES = ("uniform noise", "dead-leaves image")
#: Dead-leaves images drawn at each of an image's other normalizations (measured, not observed). OCR
#: recognisers err in a few images of many (PP-OCRv6's: 5 of 16 past 2% of range at -1..1, up to 47%;
#: PP-OCRv3's 3.1% at most): more draws find more of their tail (stated for v6 at one draw each 1.5%, at
#: two 1.5% or 2.6% as the draws fall, at four 35%), each a run of the FP32 model and one of the written one.
LEAVES_PER_NORMALIZATION = 2
#: Above this many pixels an image takes one draw at each other normalization: at 1024x1024 each is seconds of
#: runs (a 3-node model's conversion: 4.4 s with none, 7.0 s with two each; IS-Net small 15.6 s -> 33.8 s).
MANY_PIXELS = 512 * 512


#: The sizes (height, width) an image input's dynamic spatial dims take first, in turn: a photo at
#: ImageNet's size, a text line at OCR's (48 high). Dims at 1 (the generic search's start) show
#: nothing of a vision model's activations (a 1x1 image is all border).
IMAGE_SIZES = ((224, 224), (48, 320))
#: Failures that end the search for an image size (bigger or other inputs would not help).
_STOPS = (RunBudgetError, ModelCrashError, ModelRefusedError, ModelUnsupportedError)


def _generated(
    model: onnx.ModelProto, runner: Runner, input_shapes: Mapping[str, tuple[int, ...]] | None,
    input_ranges: Mapping[str, tuple[float, float]] | None, seed: int,
) -> Generated:
    """One runnable generated sample: image inputs with dynamic spatial dims at :data:`IMAGE_SIZES` in
    turn (a diffusion model's latents at :data:`LATENT_SIZE`), each with the other inputs sized by
    :func:`_sized` (a CLIP-like model's token ids at its position table's length beside its image); then,
    if no image size runs, the other inputs sized alone."""
    given = dict(input_shapes or {})
    latents = {info.name: _latent_shape(model, info) for info in model_inputs(model)
               if info.name not in given and _dynamic_latent(model, info, input_ranges)}
    given.update((name, shape) for name, shape in latents.items() if shape is not None)
    images = [info for info in model_inputs(model)
              if info.name not in given and info.name not in latents and _dynamic_image(info)]
    for height, width in IMAGE_SIZES if images else ():
        fixed = dict(given)
        for info in images:
            dims = info.type.tensor_type.shape.dim
            fixed[info.name] = (
                _static(dims[0], 1), image_channels(info) or 3, _static(dims[2], height), _static(dims[3], width)
            )
        try:
            return _sized(model, runner, fixed, input_ranges, seed)
        except _STOPS:
            raise
        except (ModelRunError, SampleSizeError):
            continue
    return _sized(model, runner, given, input_ranges, seed)


#: A diffusion model's latents' dynamic height and width (:mod:`~amp_compiler.runtime.diffusion_inputs`):
#: a 256-pixel image's at a VAE's 8x (SD's 512 pixels are 64x64; 32x32 keeps a full-size SD VAE decoder's
#: probe runs near a minute on a CPU, sweep L's 256-pixel decoder 54 s in all), wide enough for a denoiser's
#: three downsamplings and attention over 64 positions.
LATENT_SIZE = (32, 32)


def _dynamic_latent(
    model: onnx.ModelProto, info: onnx.ValueInfoProto, input_ranges: Mapping[str, tuple[float, float]] | None,
) -> bool:
    """A 4-D input :func:`~amp_compiler.runtime.input_kinds.input_kinds` takes for a diffusion model's latents
    (kind ``normal``) whose channels, height or width are dynamic."""
    kind = input_kinds(model, input_ranges).get(info.name)
    dims = info.type.tensor_type.shape.dim if info.type.tensor_type.HasField("shape") else []
    return (kind is not None and kind.kind == "normal" and len(dims) == 4
            and not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims[1:]))


def _latent_shape(model: onnx.ModelProto, info: onnx.ValueInfoProto) -> tuple[int, ...] | None:
    """A dynamic latent's shape: batch 1, its channels (stated, or the input channels of the Conv that reads
    it: a VAE's ``post_quant_conv``, a UNet's ``conv_in``), :data:`LATENT_SIZE`; None where its channels are
    not known (the generic search sizes it)."""
    dims = info.type.tensor_type.shape.dim
    channels = _static(dims[1], 0) or _conv_channels(model, info.name)
    if not channels:
        return None
    return (_static(dims[0], 1), channels, _static(dims[2], LATENT_SIZE[0]), _static(dims[3], LATENT_SIZE[1]))


def _conv_channels(model: onnx.ModelProto, name: str) -> int:
    """The input channels of a Conv of the main graph that reads ``name`` with an initializer weight (0: none)."""
    weights = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Conv" and node.input and node.input[0] == name and len(node.input) > 1:
            weight = weights.get(node.input[1])
            group = next((a.i for a in node.attribute if a.name == "group"), 1)
            if weight is not None and len(weight.dims) >= 2:
                return int(weight.dims[1] * group)
    return 0


def _sized(
    model: onnx.ModelProto, runner: Runner, fixed: Mapping[str, tuple[int, ...]],
    input_ranges: Mapping[str, tuple[float, float]] | None, seed: int,
) -> Generated:
    """One runnable sample with ``fixed``'s shapes: token sequences, KV caches, waveforms and set dims
    (points, atoms, pairs) at the sizes the graph says real inputs have
    (:func:`~amp_compiler.onnx.measure.probe_dims.probe_dims`; refused
    or over the memory budget, they fall back; over the time budget, the probe stops as for any run),
    then the generic search (:func:`~amp_compiler.onnx.measure.generated_inputs.runnable_inputs`)."""
    refused: list[tuple[int, str]] = []  # (a waveform's or sequence's size, onnxruntime's refusal)
    for sized in probe_dims(model, fixed):
        try:
            generated = runnable_inputs(model, runner, probe_shapes(model, sized, fixed), seed=seed, informed=True,
                                        input_ranges=input_ranges)
        except (ModelCrashError, ModelRefusedError, ModelUnsupportedError):
            raise
        except RunBudgetError as exc:
            if exc.option != "run_memory":
                raise  # over the time budget: the runner's child was stopped, nothing more runs in it
            refused.append((max(sized.values()), first_line(exc)))
            continue  # over the memory budget at these sizes: shorter ones, then the generic search's smallest
        except (ModelRunError, SampleSizeError) as exc:
            refused.append((max(sized.values()), first_line(exc)))
            continue
        generated.refused[:0] = refused
        generated.dims = {**{k: v for k, v in sized.items() if k not in generated.dims}, **generated.dims}
        return generated
    generated = runnable_inputs(model, runner, fixed or None, seed=seed, informed=True, input_ranges=input_ranges)
    generated.refused[:0] = refused
    return generated


def _dynamic_image(info: onnx.ValueInfoProto) -> bool:
    """A float image input (:func:`~amp_compiler.runtime.input_kinds.image_channels`) whose channels, height or
    width are dynamic (a diffusion model's latents, which :func:`_generated` sizes first, aside)."""
    dims = info.type.tensor_type.shape.dim if info.type.tensor_type.HasField("shape") else []
    return (
        info.type.tensor_type.elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
        and image_channels(info) is not None
        and not all(d.HasField("dim_value") and d.dim_value > 0 for d in dims[1:])
    )


def _static(dim: onnx.TensorShapeProto.Dimension, default: int) -> int:
    return dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else default


class ProbeSkipped(Exception):
    """The probe did not run; the message is the warning line's reason."""


@dataclasses.dataclass
class ProbeSamples:
    """The range probe's generated samples (:func:`probe_samples`), the FP32 model's outputs on them, the
    runs their search took (refused sizes and the one kept), how they were made and the dynamic dims'
    values; ``observed``: how many of the samples, the first ones, the probe observes ranges on (the
    others, an image's dead leaves at the other normalizations, only measure the written model)."""

    samples: list[dict[str, np.ndarray]]
    outputs: list[list[np.ndarray]]
    runs: int
    inputs: str
    dims: dict[str, int]
    kinds: list[str]
    observed: int


def probe_samples(
    model: onnx.ModelProto, runner: Runner, *, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    input_ranges: Mapping[str, tuple[float, float]] | None = None, seed: int = 0,
) -> ProbeSamples:
    """The samples the range probe runs the FP32 ``model`` on (the module doc: one generated sample the
    model runs, sized as the graph says real inputs are; for a model with an image input a second, with
    dead-leaves images) and its outputs on them: what ``compare`` takes without data, so that its
    numbers are the ones ``convert``'s summary line stated. Raises the :class:`ModelRunError` or
    :class:`SampleSizeError` that ended the search."""
    tensors_only(model)  # an UngeneratedInputError (a SampleSizeError) for an input that is not a tensor
    images = image_inputs(model, input_ranges)
    generated = _generated(model, runner, input_shapes, input_ranges, seed)
    kinds = input_kinds(model, input_ranges)
    negated, retried = _negated_masks(model, runner, generated, [n for n, k in kinds.items() if k.kind == "padded"])
    samples, outputs = list(generated.samples), list(generated.outputs)
    labels = [""]
    if images:
        samples.append(_with_leaves(samples[0], {name: ranges[0] for name, ranges in images.items()}, seed))
        outputs.append(_run(model, runner, samples[-1]))
        labels = list(IMAGE_SAMPLES)
    switches = _branch_switches(model, samples[0])
    flipped = _add_other_branches(model, runner, samples, outputs, switches) if switches else 0
    if flipped:  # each sample labelled with its kind and its branches (a flipped one has its original's kind)
        kinds_of = labels + labels[:flipped]
        labels = [_label(kind, sample, switches) for kind, sample in zip(kinds_of, samples, strict=True)]
    observed = len(samples)
    for k in range(1, max((len(ranges) for ranges in images.values()), default=1)):  # the other normalizations
        bounds = {name: ranges[min(k, len(ranges) - 1)] for name, ranges in images.items()}
        for draw in range(_draws(samples[0], images)):
            samples.append(_with_leaves(samples[0], bounds, seed + k + 100 * draw))
            outputs.append(_run(model, runner, samples[-1]))
            labels.append(f"{IMAGE_SAMPLES[1]} {_span(next(iter(bounds.values())))}")
    described = [f"{shown(name)}: {kind.why}" + (_image_samples(images[name]) if name in images else "")
                 + (", negated (FP32 outputs mostly NaN/Inf the other way)" if name in negated else "")
                 for name, kind in kinds.items()]
    described += [f"{shown(name)}: " + ("True and False" if name in switches and flipped else _default_values(array))
                  for name, array in samples[0].items() if name not in kinds]
    if generated.dims:
        described.append(generated.describe())
    given = input_shapes or {}
    sized = {info.name for info in model_inputs(model) if info.name not in given
             and (_dynamic_image(info) or _dynamic_latent(model, info, input_ranges))}
    described += [f"{shown(name)}: {'x'.join(map(str, array.shape))}"
                  for name, array in generated.samples[0].items() if name in sized]
    share = _nonfinite_share(outputs)
    if share > MOSTLY_NONFINITE:
        described.append(f"FP32 outputs {share:.0%} NaN/Inf on them")
    return ProbeSamples(
        samples, outputs, runs=len(generated.refused) + len(samples) + retried,
        inputs="; ".join(described) or "N(0, 1) floats, integers 1", dims=dict(generated.dims),
        kinds=labels if len(samples) > 1 else [], observed=observed,
    )


def _draws(sample: Mapping[str, np.ndarray], images: Mapping[str, tuple]) -> int:
    """Dead-leaves draws at each other normalization: :data:`LEAVES_PER_NORMALIZATION`, one for an image of
    more than :data:`MANY_PIXELS` pixels."""
    pixels = max((int(np.prod(sample[name].shape[-2:])) for name in images if np.ndim(sample[name]) >= 2), default=0)
    return 1 if pixels > MANY_PIXELS else LEAVES_PER_NORMALIZATION


def _span(bounds: tuple[float, float]) -> str:
    """``-1..1``."""
    return f"{bounds[0]:g}..{bounds[1]:g}"


def _image_samples(ranges: tuple[tuple[float, float], ...]) -> str:
    """How an image input's samples were drawn, after its kind: noise and dead leaves in its range, and
    dead leaves in its other ranges (:data:`~amp_compiler.runtime.input_kinds.IMAGE_NORMALIZATIONS`)."""
    others = f" (also at {', '.join(_span(r) for r in ranges[1:])})" if len(ranges) > 1 else ""
    return f", uniform noise and dead leaves{others}"


def _negated_masks(
    model: onnx.ModelProto, runner: Runner, generated: Generated, masks: list[str]
) -> tuple[list[str], int]:
    """When the FP32 outputs on ``generated``'s sample are mostly NaN/Inf (:data:`MOSTLY_NONFINITE`) and it
    holds bool masks (kind ``padded``: a bool mask's polarity is not in the graph), the sample with those
    ``masks`` negated, run once: kept in its place (with its outputs) where fewer outputs are NaN/Inf.
    Returns the masks negated (none: kept as drawn) and the runs taken (0 or 1)."""
    masks = [name for name in masks if name in generated.samples[0]]
    if not masks or _nonfinite_share(generated.outputs[:1]) <= MOSTLY_NONFINITE:
        return [], 0
    other = {**generated.samples[0], **{name: np.logical_not(generated.samples[0][name]) for name in masks}}
    try:
        outputs = _run(model, runner, other)
    except (RunBudgetError, ModelCrashError):
        raise
    except ModelRunError:  # the negated masks do not run: the probe keeps the masks as drawn
        return [], 0
    if _nonfinite_share([outputs]) >= _nonfinite_share(generated.outputs[:1]):
        return [], 1
    generated.samples[0], generated.outputs[0] = other, outputs
    return masks, 1


def _add_other_branches(
    model: onnx.ModelProto, runner: Runner, samples: list[dict[str, np.ndarray]], outputs: list[list[np.ndarray]],
    switches: list[str],
) -> int:
    """Append to ``samples`` (and their FP32 ``outputs``) each sample with its ``switches`` the other way,
    as long as the model runs them (the other branch may want what these inputs are not); how many."""
    originals = list(samples)
    for sample in originals:
        other = {**sample, **{name: np.logical_not(sample[name]) for name in switches}}
        try:
            outputs.append(_run(model, runner, other))
        except (RunBudgetError, ModelCrashError):
            raise
        except ModelRunError:  # the other branch does not run on these inputs: the probe keeps to its own
            break
        samples.append(other)
    return len(samples) - len(originals)


def _label(kind: str, sample: Mapping[str, np.ndarray], switches: list[str]) -> str:
    """A sample's label: its kind (an image model's noise or dead leaves), then its switches' values."""
    return ", ".join(filter(None, (kind, *(f"{shown(n)}={bool(sample[n].all())}" for n in switches))))


def _branch_switches(model: onnx.ModelProto, sample: Mapping[str, np.ndarray]) -> list[str]:
    """The bool graph inputs an If of the main graph takes for its condition (Optimum's merged decoders:
    ``use_cache_branch``): the probe runs both values, so that both branches run (a merged decoder's
    first step, without a cache, is the other branch)."""
    conditions = {node.input[0] for node in model.graph.node if node.op_type == "If" and node.input}
    return [name for name, array in sample.items() if name in conditions and array.dtype == np.bool_]


def probe_ranges(
    model: onnx.ModelProto, runner: Runner, *, input_shapes: Mapping[str, tuple[int, ...]] | None = None,
    input_ranges: Mapping[str, tuple[float, float]] | None = None, seed: int = 0,
) -> RangeProbe:
    """Run the FP32 ``model`` (weights in memory) on one generated sample through ``runner`` (two for a
    model with an image input: :data:`IMAGE_SAMPLES`) and observe every float tensor. Raises
    :class:`ProbeSkipped` when the model cannot be run on generated inputs (over the run budget,
    crashed, refused, inputs too large)."""
    try:
        found = probe_samples(model, runner, input_shapes=input_shapes, input_ranges=input_ranges, seed=seed)
        ranges = collect_ranges(model, found.samples[:found.observed], runner=runner)
    except RunBudgetError as exc:
        raise ProbeSkipped(f"its run exceeds the run budget ({first_line(exc)})") from None
    except SampleSizeError as exc:
        raise ProbeSkipped(first_line(exc)) from None
    except ModelRunError as exc:  # the model refused the generated sizes
        unsized = dynamic_dims(model, input_shapes)
        hint = f" (its dynamic dims {', '.join(unsized[:4])}: --input-shape NAME:DIMS gives them)" if unsized else ""
        raise ProbeSkipped(first_line(exc) + hint) from None
    return RangeProbe(
        found.samples, found.outputs, ranges, runs=found.runs + found.observed,  # outputs, then observed
        inputs=found.inputs, dims=found.dims, kinds=found.kinds,
    )


def _nonfinite_share(outputs: list[list[np.ndarray]]) -> float:
    """The share of the float output values, over all samples, that are NaN or infinite (0: none)."""
    floats = [np.asarray(a) for sample in outputs for a in sample if np.issubdtype(np.asarray(a).dtype, np.floating)]
    total = sum(a.size for a in floats)
    return sum(int(np.count_nonzero(~np.isfinite(a))) for a in floats) / total if total else 0.0


def _default_values(array: np.ndarray) -> str:
    """What :func:`~amp_compiler.runtime.samples.random_samples` gives an input it knows nothing of."""
    return "N(0, 1)" if np.issubdtype(array.dtype, np.floating) else "True" if array.dtype == bool else "1"


def _with_leaves(
    sample: Mapping[str, np.ndarray], images: Mapping[str, tuple[float, float]], seed: int
) -> dict[str, np.ndarray]:
    """``sample`` with each image input drawn as dead leaves in its range (same shape and type; an 8-bit
    image's values rounded to its integers)."""
    rng = np.random.default_rng(seed)
    out = dict(sample)
    for name, (low, high) in images.items():
        leaves = dead_leaves(rng, sample[name].shape, low, high)
        if np.issubdtype(sample[name].dtype, np.integer):
            leaves = np.rint(leaves)
        out[name] = leaves.astype(sample[name].dtype)
    return out


def _run(model: onnx.ModelProto, runner: Runner, sample: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """The FP32 model's outputs on one sample (graph output order)."""
    session = runner.load(model, basic=True)
    try:
        return session.run(sample)
    finally:
        session.close()
