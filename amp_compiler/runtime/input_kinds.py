"""What is known of a model's inputs before any data: which it must be fed, and what values generated
ones should take (:func:`input_kinds`): images and their pixel range, waveforms, token ids below the
vocabulary, positions, sample rates, a generation's length limit. Read from the graph (names, shapes,
the ops that read each input), never from data; :mod:`amp_compiler.runtime.samples` draws the values.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping

import numpy as np
import onnx

from amp_compiler.runtime.diffusion_inputs import SIGMAS, diffusion_kinds
from amp_compiler.runtime.input_uses import (
    INDEX_INPUTS,
    GraphUses,
    IndexInput,
    added_to_logits,
    constant_nodes,
    graph_uses,
    index_size,
    integer_views,
    positive_reader,
    reaches_softmax_anyhow,
    vocabulary,
)
from amp_compiler.runtime.string_inputs import StringVocabulary, string_vocabularies

__all__ = [
    "GENERATED_TOKENS", "IMAGE_NORMALIZATIONS", "INDEX_INPUTS", "INTEGER_TYPES", "IndexInput", "InputKind",
    "NORMALIZED_IMAGE", "POSITIVE", "constant_nodes", "image_channels", "image_inputs", "image_like", "input_kinds",
    "model_inputs", "rank", "waveform_inputs",
]


def model_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs that must be fed (initializers listed as inputs are optional)."""
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


@dataclasses.dataclass(frozen=True)
class InputKind:
    """What generated values an input takes: ``range`` (uniform floats in ``bounds``), ``normal`` (floats
    N(``bounds[0]``, ``bounds[1]``): diffusion latents), ``ids`` (token ids)
    or ``index`` (indices into a dim, :data:`INDEX_INPUTS`) (integers in ``[0, bounds[1])``), ``positions``
    (consecutive along the last dim: 0, 1, 2..., or the last ones up to ``bounds[1]`` when a range is stated),
    ``value`` (``bounds[0]`` everywhere), ``beyond`` (the longest token
    input's length plus ``bounds[0]``: a generation's length limit), ``words`` (strings of ``vocabulary``),
    ``positive`` (floats log-spaced over ``bounds``), ``additive`` (an additive attention mask: 0 and
    ``bounds[0]``, causal and left-padded) or ``padded`` (a bool mask, a True tail per row: see
    :mod:`~amp_compiler.runtime.value_patterns`), and why (``stated``, ``image 0..1``,
    ``vocabulary``...). ``others``: other ranges its real values may span (an image the graph does not
    normalize: :data:`IMAGE_NORMALIZATIONS`), where ``bounds`` is the widest."""

    kind: str
    bounds: tuple[float, float]
    why: str
    vocabulary: StringVocabulary | None = None  # kind ``words``: the strings a string input takes
    others: tuple[tuple[float, float], ...] = ()


#: Ops that normalize an image input; a constant operand above this says pixels are 0..255.
_NORMALIZE_OPS = frozenset({"Sub", "Div", "Mul", "Add"})
_PIXEL_SCALE = 2.0
#: An image the graph does not normalize spans ImageNet's mean/std range, the widest common one
#: (torchvision, DETR, ConvNeXt, Swin, DINOv2, SegFormer, PP-OCR det; CLIP's -1.79..2.15 and 0.5/0.5's
#: -1..1 lie inside). At -1..1 OWL-ViT's boxes were stated 1.46% of range, unwarned, 5.1% on real inputs
#: (4.33% stated here): a probe too small misses overflows, one too large at most scales a few ops.
NORMALIZED_IMAGE = (-2.12, 2.64)
#: The ranges an image the graph does not normalize may span, as its preprocessing normalized it: ImageNet's
#: mean/std (the widest: the generated noise's), 0.5/0.5's (PP-OCR rec and cls, ViT, SigLIP) and x / 255
#: (YOLO). Where values lie inside the range decides what a trained model computes: PP-OCRv6's recogniser,
#: stated 0.84% of range on ImageNet-range images (its CTC head says "blank" at every step there), missed
#: 47% on dead leaves at -1..1, its real range; OWL-ViT the other way (1.46% stated at -1..1, 5.1% real at
#: ImageNet's). The probe draws dead leaves in each and states the worst.
IMAGE_NORMALIZATIONS = (NORMALIZED_IMAGE, (-1.0, 1.0), (0.0, 1.0))
#: A scalar integer input named like an audio sample rate takes 16 kHz (speech models: Silero VAD
#: refuses any other rate but 8 kHz).
_SAMPLE_RATE = re.compile(r"sr|sample_?rate|sampling_?rate", re.IGNORECASE)
#: An integer input named like bytes, or a float one the graph casts to integers, takes byte values 0..255 (a
#: file-type classifier's input: Magika).
_BYTES = re.compile(r"bytes?|byte_ids|input_bytes", re.IGNORECASE)
#: An integer input named like position ids counts 0, 1, 2... (a prompt's positions; a random id
#: would put tokens at arbitrary places, ones all at the same one).
_POSITIONS = re.compile(r"(\w*_)?pos(ition)?_?ids?", re.IGNORECASE)
#: A float waveform (``[batch, samples]`` or ``[samples]``) in a model with a sample-rate input, or named
#: like audio, is audio scaled to -1..1 (what decoders and speech front ends produce).
_AUDIO = re.compile(r"audio|wave(form)?|speech|pcm|input_values|samples", re.IGNORECASE)
#: An integer scalar named like a generation's length limit (onnxruntime's GreedySearch/BeamSearch
#: ``max_length``) is the prompt's length plus :data:`GENERATED_TOKENS`: ones (a limit of 1, below any
#: prompt) made every run refuse; floats named like penalties or a temperature are 1, neutral.
_MAX_LENGTH = re.compile(r"max_(length|new_tokens)", re.IGNORECASE)
_NEUTRAL = re.compile(r"(repetition_|length_)?penalty|temperature", re.IGNORECASE)
#: A float input named like a mask is ones, as an integer mask is (a time-series model's
#: ``past_observed_mask``: N(0, 1) marked values observed at random, and negative), unless it is added to
#: a softmax's logits (:func:`~amp_compiler.runtime.input_uses.added_to_logits`, rank 2 at least: a rank-1 or
#: scalar one is a bias or a temperature): an additive mask, 0 or ``finfo.min``. A bool input named so, or
#: reaching a Softmax, is a padded mask (False, a True tail).
_MASK = re.compile(r"mask", re.IGNORECASE)
#: A float input added to logits but named like a bias (T5's ``position_bias``, ALiBi's) holds learned or
#: position values, no mask: it keeps N(0, 1).
_BIAS = re.compile(r"bias|alibi|position", re.IGNORECASE)
#: A float input that an op needing positive values reads (Log, Sqrt, Reciprocal, a fractional Pow:
#: :func:`~amp_compiler.runtime.input_uses.positive_reader`) is log-spaced over 0.002..80: EDM/Karras noise
#: levels (sigma_min 0.002, sigma_max 80), the widest positive range common inputs take (variances, scales,
#: temperatures sit inside); log 6.2..4.4, a reciprocal up to 500, a root 0.045..8.9. N(0, 1) put NaN in every
#: FP32 output (``log(sigma)``): the probe saw nothing and stated 0.00% where real sigmas gave 90% error.
POSITIVE = SIGMAS
GENERATED_TOKENS = 16
INTEGER_TYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64})
#: A KV cache, by its name or its dims' (not an image whatever its dim 1: its heads).
_CACHE = re.compile(r"past|present|cache|key_?values?", re.IGNORECASE)
_CACHE_DIM = re.compile(r"past|seq|length|total", re.IGNORECASE)
_CHANNELS = re.compile(r"channel", re.IGNORECASE)

def input_kinds(
    model: onnx.ModelProto, input_ranges: Mapping[str, tuple[float, float]] | None = None
) -> dict[str, InputKind]:
    """What is known of each graph input's values, from the options and the graph: a stated range
    (``--input-range``); a diffusion model's latents and timesteps
    (:func:`~amp_compiler.runtime.diffusion_inputs.diffusion_kinds`: a VAE decoder's ``latent_sample``
    N(0, 7.7), a denoiser's ``sample`` N(0, 1) and ``timestep`` 0..999), before images (a 4-channel
    latent is no RGBA image); a float input added to a softmax's logits an additive mask (0 and ``finfo.min``,
    causal, left-padded), before images too (HF's 4-D mask ``[batch, 1, queries, keys]`` has one channel);
    a float input the graph casts to an integer type (:func:`~amp_compiler.runtime.input_uses.integer_views`:
    through reshapes, selections, Floor/Ceil/Round) whose integers index a table or a dim, or named like bytes,
    takes an integer input's ids, indices or byte values below (:func:`_index_kind`), as integral floats
    (magika's ``bytes``, floats 0..256 cast for a OneHot of depth 257: N(0, 1) cast to -3..3 hit 7 of its 257
    rows, and the probe saw none of the others); one cast to another float type stays a float;
    a 4-D float input with 1, 3 or 4 channels is an image: when an op that reads it
    normalizes it (Sub, Div, Mul, Add), 0..255 if a constant operand is above 2 (a mean of 127.5 or
    123.7, a scale of 255), else 0..1; when none does, the model takes normalized images (the
    normalization lives in its preprocessing: PP-OCR, torchvision exports): ImageNet's mean/std range
    -2.12..2.64 (:data:`NORMALIZED_IMAGE`, the widest common one: CLIP's and 0.5/0.5's lie inside); a float waveform
    (:func:`waveform_inputs`) is -1..1; an integer input named like position ids counts 0, 1, 2...;
    one read (through Casts, reshapes and selections) as the indices of a Gather on an initializer table is
    token ids below the table's first dim; one read as an index into another input's dim
    (:data:`INDEX_INPUTS`: RoiAlign's batch_indices, Gather's, Scatter's, OneHot's indices) is below that
    dim's size where the graph states it, else 0; one named like bytes takes 0..255; any other 8-bit integer
    input (not named like a mask) spans its type, uint8 0..255 and int8 -128..127 (a uint8 image: ones hid an
    FP16 overflow at 4.8e5 that every real image reached); a scalar integer named
    like a sample rate (``sr``) is 16000; a generation's length limit (``max_length``) the prompt's length
    plus :data:`GENERATED_TOKENS`; a float penalty or temperature 1; a bool input named like a mask or reaching
    a Softmax both values, a True tail per row; a float input an op needing positive values reads log-spaced
    over :data:`POSITIVE`; another float mask ones; a string input read by an op with a vocabulary
    (:func:`~amp_compiler.runtime.string_inputs.string_vocabularies`) its words. Other inputs are not in the result
    (:func:`random_samples` gives floats N(0, 1), integers 1: masks of ones, booleans True)."""
    stated = dict(input_ranges or {})
    uses = graph_uses(model)
    consumers, inits = uses.consumers, uses.inits
    kinds: dict[str, InputKind] = {
        name: InputKind("words", (0.0, 0.0), vocabulary.describe(), vocabulary)
        for name, vocabulary in string_vocabularies(model).items() if name not in stated
    }
    waveforms = waveform_inputs(model)
    diffusion = diffusion_kinds(model_inputs(model))
    for info in model_inputs(model):
        tt = info.type.tensor_type
        if not info.type.HasField("tensor_type") or not tt.elem_type or info.name in kinds:  # no tensor; words
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if info.name in stated and np.issubdtype(dtype, np.integer) and _POSITIONS.fullmatch(info.name) and rank(info):
            lo, hi = stated[info.name]
            kinds[info.name] = InputKind("positions", (float(lo), float(hi)), f"positions up to {hi:g} (stated)")
        elif info.name in stated:
            kinds[info.name] = InputKind("range", tuple(stated[info.name]), "stated")  # type: ignore[arg-type]
        elif info.name in diffusion:
            kinds[info.name] = InputKind(*diffusion[info.name])
        elif (np.issubdtype(dtype, np.floating) and rank(info) >= 2 and not _BIAS.search(info.name)
              and added_to_logits(info.name, uses)):  # before images: HF's [batch, 1, queries, keys] mask has 1 channel
            lowest = float(np.finfo(dtype).min)
            kinds[info.name] = InputKind("additive", (lowest, 0.0),
                                         f"additive mask 0 / {lowest:.3g}, causal, left-padded")
        elif np.issubdtype(dtype, np.floating) and (
                indices := _index_kind(info.name, integer_views(info.name, consumers), uses)):  # before images
            kinds[info.name] = dataclasses.replace(indices, why=f"{indices.why}, integral floats")
        elif np.issubdtype(dtype, np.floating) and image_like(info):
            readers = consumers.get(info.name, ())
            top = max((_constant_absmax(n, info.name, inits) for n in readers), default=0.0)
            if not any(n.op_type in _NORMALIZE_OPS for n in readers):
                kinds[info.name] = InputKind("range", NORMALIZED_IMAGE, "normalized image -2.12..2.64",
                                             others=IMAGE_NORMALIZATIONS[1:])
            elif top > _PIXEL_SCALE:
                kinds[info.name] = InputKind("range", (0.0, 255.0), "image 0..255")
            else:
                kinds[info.name] = InputKind("range", (0.0, 1.0), "image 0..1")
        elif info.name in waveforms:
            kinds[info.name] = InputKind("range", (-1.0, 1.0), "waveform -1..1")
        elif np.issubdtype(dtype, np.integer):
            if _POSITIONS.fullmatch(info.name) and rank(info) >= 1:
                kinds[info.name] = InputKind("positions", (0.0, 0.0), "positions 0, 1, 2...")
            elif indices := _index_kind(info.name, [info.name], uses):
                kinds[info.name] = indices
            elif _SAMPLE_RATE.fullmatch(info.name) and not (tt.HasField("shape") and tt.shape.dim):
                kinds[info.name] = InputKind("value", (16000.0, 16000.0), "sample rate 16000")
            elif _MAX_LENGTH.fullmatch(info.name) and rank(info) <= 1:
                kinds[info.name] = InputKind(
                    "beyond", (GENERATED_TOKENS, GENERATED_TOKENS), f"the prompt's length + {GENERATED_TOKENS}")
            elif dtype.itemsize == 1 and not _MASK.search(info.name):
                low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
                what = "image" if image_like(info) else f"{dtype.name} values"
                kinds[info.name] = InputKind("range", (float(low), float(high)), f"{what} {low}..{high}")
        elif dtype == np.bool_ and rank(info) >= 1 and (
                _MASK.search(info.name) or reaches_softmax_anyhow(info.name, uses)):
            kinds[info.name] = InputKind("padded", (0.0, 0.0), "False, each row's last quarter True (a padded tail)")
        elif _NEUTRAL.fullmatch(info.name) and rank(info) <= 1:
            kinds[info.name] = InputKind("value", (1.0, 1.0), "1 (no penalty, no scaling)")
        elif np.issubdtype(dtype, np.floating) and (reader := positive_reader(info.name, uses)):
            kinds[info.name] = InputKind("positive", POSITIVE, f"positive {POSITIVE[0]:g}..{POSITIVE[1]:g}, log-spaced "
                                         f"({reader} reads it)")
        elif _MASK.search(info.name):
            kinds[info.name] = InputKind("value", (1.0, 1.0), "mask of ones")
    return kinds


def _index_kind(name: str, values: list[str], uses: GraphUses) -> InputKind | None:
    """What an input read as the integers ``values`` (itself, or its Casts to integers) takes: token ids below the
    smallest table they index (:func:`~amp_compiler.runtime.input_uses.vocabulary`), else indices below the
    smallest dim (:func:`~amp_compiler.runtime.input_uses.index_size`), else byte values where ``name`` is
    named like bytes; None: none of these."""
    vocab = min((v for v in (vocabulary(x, uses.consumers, uses.inits, uses.producers) for x in values) if v),
                default=0)
    indexed = [i for i in (index_size(x, uses.consumers, uses.inits, uses.producers, uses.shapes) for x in values)
               if i is not None]
    index = min(indexed) if indexed else None
    if vocab and (index is None or vocab <= index[0]):
        return InputKind("ids", (0.0, float(vocab)), "vocabulary")
    if index is not None:
        size, where = index
        return InputKind("index", (0.0, float(size)), f"below {size} ({where})" if size > 1 else f"0 ({where})")
    if values and _BYTES.fullmatch(name):
        return InputKind("ids", (0.0, 256.0), "byte values")
    return None


def image_inputs(
    model: onnx.ModelProto, input_ranges: Mapping[str, tuple[float, float]] | None = None
) -> dict[str, tuple[tuple[float, float], ...]]:
    """The inputs :func:`input_kinds` takes for images (4-D floats or 8-bit integers of 1, 3 or 4 channels),
    with the pixel ranges real images may take there: the range an option states or the graph's
    normalization implies, or for an image the graph does not normalize each of
    :data:`IMAGE_NORMALIZATIONS`."""
    kinds = input_kinds(model, input_ranges)
    return {
        info.name: (kinds[info.name].bounds, *kinds[info.name].others)
        for info in model_inputs(model)
        if info.name in kinds and image_like(info) and kinds[info.name].kind == "range"
        and (np.issubdtype(dtype := onnx.helper.tensor_dtype_to_np_dtype(info.type.tensor_type.elem_type), np.floating)
             or dtype.itemsize == 1)
    }


def waveform_inputs(model: onnx.ModelProto) -> set[str]:
    """The float inputs of a waveform's layout (``[samples]``, ``[batch, samples]``, or ``[batch, channels,
    samples]`` with 1 or 2 channels, or a channel dim named so: EnCodec's mono ``input_values [batch, 1,
    samples]``) that are audio: the model has a scalar sample-rate input (``sr``), or the input or its last
    dim is named like audio (``waveform``, ``speech``; openWakeWord's melspectrogram: ``input [batch_size,
    samples]``)."""
    inputs = model_inputs(model)
    rate = any(_SAMPLE_RATE.fullmatch(i.name) and rank(i) == 0 for i in inputs)
    return {
        i.name for i in inputs
        if _waveform_layout(i) and np.issubdtype(onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type),
                                                 np.floating)
        and (rate or _AUDIO.search(i.name) or _AUDIO.search(i.type.tensor_type.shape.dim[-1].dim_param))
    }


def _waveform_layout(info: onnx.ValueInfoProto) -> bool:
    """Rank 1 or 2, or rank 3 whose dim 1 is a few channels (1 or 2, or named like channels)."""
    if 1 <= rank(info) <= 2:
        return True
    if rank(info) != 3:
        return False
    channels = info.type.tensor_type.shape.dim[1]
    if channels.HasField("dim_value"):
        return channels.dim_value in (1, 2)
    return bool(_CHANNELS.search(channels.dim_param))


def rank(info: onnx.ValueInfoProto) -> int:
    """The input's rank; -1 where it declares no shape."""
    tt = info.type.tensor_type
    return len(tt.shape.dim) if tt.HasField("shape") else -1


def image_channels(info: onnx.ValueInfoProto) -> int | None:
    """The channels of an image input: a 4-D input whose dim 1 is 1, 3 or 4 (3 where it is named like
    channels: Optimum's ``num_channels``), and that is not a KV cache, whose dim 1 is its heads (GPT-2's
    and T5's 4) and which is named like one (``past_key_values.0.key``) or has a dim named like a
    sequence (``past_sequence_length``); None for any other input."""
    tt = info.type.tensor_type
    dims = tt.shape.dim if tt.HasField("shape") else []
    if len(dims) != 4 or _CACHE.search(info.name) or any(_CACHE_DIM.search(d.dim_param) for d in dims if d.dim_param):
        return None
    if dims[1].HasField("dim_value") and dims[1].dim_value in (1, 3, 4):
        return int(dims[1].dim_value)
    return 3 if _CHANNELS.search(dims[1].dim_param) else None


def image_like(info: onnx.ValueInfoProto) -> bool:
    """An image input (:func:`image_channels`)."""
    return image_channels(info) is not None




def _constant_absmax(node: onnx.NodeProto, name: str, inits: Mapping[str, onnx.TensorProto]) -> float:
    """The largest |x| of a constant operand (an initializer, a Constant node) of a normalizing ``node``
    that reads ``name`` (0: none)."""
    if node.op_type not in _NORMALIZE_OPS:
        return 0.0
    top = 0.0
    for other in node.input:
        init = inits.get(other)
        if other != name and init is not None and math.prod(init.dims) <= 64:
            array = onnx.numpy_helper.to_array(init)
            if array.size and np.issubdtype(array.dtype, np.floating):
                top = max(top, float(np.max(np.abs(array))))
    return top
