"""Trained models that ship inside PyPI wheels.

Each entry pins a wheel (name and version) and the ``.onnx`` member inside it. The builder downloads
the wheel with ``pip download --no-deps --only-binary :all:`` into ``<cache>/wheels`` (once), extracts
the member, checks its SHA-256 and caches it as ``<cache>/<name>.<sha8>.onnx``. These are real trained
weights, so activations have real ranges; inputs are synthetic but follow each model's real
preprocessing (value ranges, dtypes, shapes).

| entry              | wheel                       | licence    | model                               |
| ------------------ | --------------------------- | ---------- | ----------------------------------- |
| silero-vad         | silero-vad 6.2.3            | MIT        | voice activity detector (If, LSTM)  |
| magika             | magika 1.0.3 (manylinux)    | Apache-2.0 | file content-type classifier        |
| ppocr-v4-det       | rapidocr-onnxruntime 1.4.4  | Apache-2.0 | PP-OCRv4 mobile text detector (DB)  |
| ppocr-v4-rec       | rapidocr-onnxruntime 1.4.4  | Apache-2.0 | PP-OCRv4 mobile text recogniser     |
| ppocr-cls          | rapidocr-onnxruntime 1.4.4  | Apache-2.0 | PP-OCR text-line orientation        |
| ddddocr-det        | ddddocr 1.6.1               | MIT        | YOLOX-style character detector      |
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from models.entry import Tolerance, entries_from_specs


@dataclasses.dataclass(frozen=True)
class Wheel:
    package: str
    version: str

    @property
    def stem(self) -> str:
        """The wheel file name's prefix (PEP 427 normalises '-' to '_')."""
        return f"{self.package.replace('-', '_')}-{self.version}-"


SILERO = Wheel("silero-vad", "6.2.3")
MAGIKA = Wheel("magika", "1.0.3")
RAPIDOCR = Wheel("rapidocr-onnxruntime", "1.4.4")
DDDDOCR = Wheel("ddddocr", "1.6.1")


def download_wheel(wheel: Wheel, cache: Path) -> Path:
    """The pinned wheel's file under ``<cache>/wheels``, downloaded with pip if missing."""
    folder = Path(cache) / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(f"{wheel.stem}*.whl"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "--quiet", f"{wheel.package}=={wheel.version}", "-d", tmp,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        got = sorted(Path(tmp).glob(f"{wheel.stem}*.whl"))
        if proc.returncode != 0 or not got:
            raise RuntimeError(
                f"pip download {wheel.package}=={wheel.version} failed ({proc.returncode}):\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        target = folder / got[0].name
        os.replace(got[0], target)  # atomic: a concurrent builder sees the whole file or none
    return target


@dataclasses.dataclass(frozen=True)
class WheelModel:
    name: str
    size: str
    wheel: Wheel
    member: str  # path of the .onnx file inside the wheel
    sha256: str  # of the member
    make_inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    description: str
    weight_dominated: bool = True
    tolerance: Tolerance = Tolerance()
    bf16_tolerance: Tolerance | None = None

    def path(self, cache: Path) -> Path:
        return Path(cache) / f"{self.name}.{self.sha256[:8]}.onnx"

    def build(self, cache: Path) -> onnx.ModelProto:
        path = self.path(cache)
        if not path.exists():
            whl = download_wheel(self.wheel, cache)
            with zipfile.ZipFile(whl) as zf:
                data = zf.read(self.member)
            digest = hashlib.sha256(data).hexdigest()
            if digest != self.sha256:
                raise RuntimeError(
                    f"{self.member} in {whl.name} has SHA-256 {digest}, expected {self.sha256}"
                )
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return onnx.load(str(path))


# --------------------------------------------------------------------------------------------------
# Synthetic inputs
# --------------------------------------------------------------------------------------------------


def _text_image(rng: np.random.Generator, height: int, width: int, lines: int = 1) -> np.ndarray:
    """A uint8 HxWx3 image of dark glyph-like strokes on a light, slightly noisy background."""
    bg = rng.integers(190, 256, size=3)
    img = np.empty((height, width, 3), dtype=np.float32)
    img[:] = bg
    ink = rng.integers(0, 80, size=3)
    line_h = height // lines
    for line in range(lines):
        glyph_h = int(line_h * rng.uniform(0.45, 0.7))
        top = line * line_h + (line_h - glyph_h) // 2
        x = int(rng.integers(2, max(3, width // 10)))
        end = int(width * rng.uniform(0.6, 0.95))
        while x < end:
            glyph_w = int(glyph_h * rng.uniform(0.5, 0.9))
            for _ in range(int(rng.integers(2, 5))):  # strokes of one glyph
                t = int(rng.integers(1, max(2, glyph_h // 8) + 1))
                if rng.random() < 0.5:  # horizontal
                    y = top + int(rng.integers(0, glyph_h))
                    img[y : y + t, x : x + glyph_w] = ink
                else:  # vertical
                    xs = x + int(rng.integers(0, max(1, glyph_w)))
                    img[top : top + glyph_h, xs : xs + t] = ink
            x += glyph_w + int(rng.integers(1, max(2, glyph_h // 3)))
            if rng.random() < 0.12:  # a word gap
                x += glyph_h
    img += rng.normal(0.0, 6.0, size=img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _chw(images: list[np.ndarray], mean, std) -> np.ndarray:
    """Stack HxWx3 uint8 images into NCHW float32 with ``(x / 255 - mean) / std``."""
    x = np.stack(images).astype(np.float32) / 255.0
    x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def silero_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Four 16 kHz chunks (64 context + 512 new samples, as the silero wrapper feeds them): a voiced,
    speech-like harmonic signal, a louder one, background noise and near-silence; fresh LSTM state."""
    n, sr = 576, 16000
    t = np.arange(n) / sr
    chunks = []
    for kind in ("voiced", "loud", "noise", "silence"):
        if kind in ("voiced", "loud"):
            f0 = rng.uniform(100, 220)
            x = sum(
                rng.uniform(0.2, 1.0) / k * np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 2 * np.pi))
                for k in range(1, 12)
            )
            x = x * (0.6 + 0.4 * np.sin(2 * np.pi * rng.uniform(3, 6) * t))
            x = x / np.abs(x).max() * (0.3 if kind == "voiced" else 0.8)
            x = x + rng.normal(0, 0.005, n)
        elif kind == "noise":
            x = rng.normal(0, 0.05, n)
        else:
            x = rng.normal(0, 1e-3, n)
        chunks.append(x)
    return {
        "input": np.stack(chunks).astype(np.float32),
        "state": np.zeros((2, 4, 128), dtype=np.float32),
        "sr": np.array(16000, dtype=np.int64),
    }


_SOURCE_WORDS = (
    b"def", b"return", b"import", b"class", b"self", b"for", b"in", b"if", b"else:", b"None", b"x",
    b"value", b"(", b")", b":", b"=", b"+", b"[", b"]", b"0", b"1", b"print", b"data", b"#", b"'name'",
)  # fmt: skip


def magika_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Magika features for four files: the first and last 1024 bytes, padded with token 256.

    Files: Python-like source, JSON-like text, random binary with a PNG-like header, and a short
    text file (mostly padding)."""

    def source(n):
        out, indent = bytearray(), 0
        while len(out) < n:
            line = b" ".join(rng.choice(_SOURCE_WORDS, size=int(rng.integers(2, 9))))
            out += b" " * (4 * indent) + line + b"\n"
            indent = int(np.clip(indent + rng.integers(-1, 2), 0, 3))
        return bytes(out[:n])

    def json_text(n):
        out = bytearray(b"{\n")
        while len(out) < n:
            key = bytes(rng.integers(97, 123, size=int(rng.integers(3, 10))).astype(np.uint8))
            out += b'  "' + key + b'": ' + str(int(rng.integers(0, 10**6))).encode() + b",\n"
        return bytes(out[:n])

    def binary(n):
        return b"\x89PNG\r\n\x1a\n" + bytes(rng.integers(0, 256, size=n - 8).astype(np.uint8))

    files = [source(6000), json_text(5000), binary(8000), b"hello world\nthis is a short note\n"]
    rows = []
    for f in files:
        beg = list(f[:1024]) + [256] * max(0, 1024 - len(f))
        tail = f[-1024:] if len(f) >= 1024 else f
        end = [256] * (1024 - len(tail)) + list(tail)
        rows.append(beg + end)
    return {"bytes": np.asarray(rows, dtype=np.int32)}


_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def ppocr_det_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One 320x320 page with six text lines, ImageNet-normalised (the PP-OCR det preprocessing)."""
    return {"x": _chw([_text_image(rng, 320, 320, lines=6)], _IMAGENET_MEAN, _IMAGENET_STD)}


def ppocr_rec_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Two 48x320 text-line crops scaled to [-1, 1] (the PP-OCR rec preprocessing)."""
    return {"x": _chw([_text_image(rng, 48, 320) for _ in range(2)], 0.5, 0.5)}


def ppocr_cls_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Two 48x192 text-line crops scaled to [-1, 1]: one upright, one rotated by 180 degrees."""
    a, b = _text_image(rng, 48, 192), _text_image(rng, 48, 192)
    return {"x": _chw([a, b[::-1, ::-1]], 0.5, 0.5)}


def ddddocr_det_inputs(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A 416x416 image, raw 0..255 floats (YOLOX preprocessing): a 416x260 picture with text
    regions letterboxed on grey 114."""
    canvas = np.full((416, 416, 3), 114, dtype=np.uint8)
    canvas[:260] = _text_image(rng, 260, 416, lines=4)
    return {"images": np.ascontiguousarray(canvas.transpose(2, 0, 1)[None].astype(np.float32))}


WHEEL_MODELS = [
    WheelModel(
        "silero-vad", "small", SILERO, "silero_vad/data/silero_vad.onnx",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        silero_inputs,
        "Silero VAD v6 (16 kHz/8 kHz If branches, STFT conv, LSTM state), 4 chunks of 576 samples",
    ),
    WheelModel(
        "magika", "small", MAGIKA, "magika/models/standard_v3_3/model.onnx",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        magika_inputs,
        "Magika standard_v3_3 file content-type classifier (tf2onnx; byte embedding, dense, conv, "
        "global max-pool, 214-way softmax), 4 files",
    ),
    WheelModel(
        "ppocr-v4-det", "small", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        ppocr_det_inputs,
        "PP-OCRv4 mobile text detector (PPLCNetV3 + DB head), one 320x320 page",
        # FP16 storage error through 64 convolutions moves isolated pixels of the sigmoid map near
        # 0.5 by up to 0.078 (cosine 0.99999, exact FP16 storage emulation); every FP16 conversion
        # with these convolutions in FP16 does this. --tolerance (calibration) brings it under 2%.
        tolerance=Tolerance(max_error_of_range=0.10),
    ),
    WheelModel(
        "ppocr-v4-rec", "small", RAPIDOCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        ppocr_rec_inputs,
        "PP-OCRv4 mobile text recogniser (PPLCNetV3 + SVTR neck, 6625-way CTC softmax), two 48x320 lines",
        # Same cause: one character probability moves by up to 0.049 (cosine 0.9999);
        # onnxconverter-common's FP16 model is off by as much.
        tolerance=Tolerance(max_error_of_range=0.065),
        # BF16 (every convolution, its opset raised to 22): one character's probability moves by up to 0.59,
        # a top character changed (cosine 0.987); the conversion's own output error states it and warns.
        bf16_tolerance=Tolerance(min_cosine=0.98, max_error_of_range=0.65),
    ),
    WheelModel(
        "ppocr-cls", "small", RAPIDOCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        ppocr_cls_inputs,
        "PP-OCR mobile v2.0 text-line orientation classifier (MobileNetV3), two 48x192 lines",
    ),
    WheelModel(
        "ddddocr-det", "full", DDDDOCR, "ddddocr/common_det.onnx",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
        ddddocr_det_inputs,
        "ddddocr character/target detector (YOLOX-style, SiLU), one 416x416 image, raw 0..255 pixels",
    ),
]


ENTRIES = entries_from_specs(
    "wheel",
    WHEEL_MODELS,
    describe=lambda m: f"{m.description} [{m.wheel.package}=={m.wheel.version}: {m.member}]",
)
