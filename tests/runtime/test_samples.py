"""Calibration data is untrusted input: every array's size is known, and checked, before it is read.

Each hostile case is built here, small: a FIFO, empty files, a header declaring 40 GB, a zip bomb,
members that are not arrays, pickled objects. Each is refused with one line, quickly, and nothing
is decompressed or allocated beyond what the budget allows.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from amp_compiler.cli import main
from amp_compiler.runtime.samples import CalibrationDataError, load_samples
from tests.support.onnx_builders import F32, model, vi


@pytest.fixture
def relu():
    """x [batch, 4] -> Relu -> y."""
    return model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", F32, ["batch", 4])], [vi("y", F32, ["batch", 4])])


def _npy_header(shape, descr="<f4") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def _zip(path: Path, members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def _refused(path, m, needle, **kwargs):
    with pytest.raises(CalibrationDataError) as info:
        load_samples(path, m, **kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)
    return str(info.value)


def test_a_fifo_is_refused_without_blocking(tmp_path, relu):
    fifo = tmp_path / "x.npz"
    os.mkfifo(fifo)  # nobody writes to it: a plain open() would wait for ever
    _refused(fifo, relu, "is not a regular file")


def test_empty_files_and_empty_zips(tmp_path, relu):
    (tmp_path / "zero.npz").write_bytes(b"")
    _refused(tmp_path / "zero.npz", relu, "is empty")
    _refused(_zip(tmp_path / "none.npz", {}), relu, "holds no arrays")
    (tmp_path / "text.npz").write_bytes(b"not a zip at all")
    _refused(tmp_path / "text.npz", relu, "not a readable .npz file")


def test_a_huge_declared_shape_is_refused_from_its_header(tmp_path, relu):
    bad = _zip(tmp_path / "huge.npz", {"x.npy": _npy_header((10**10, 4)) + b"\0" * 16})  # 160 GB declared
    _refused(bad, relu, "has shape 10000000000x4 (160 GB), more than the 4.29 GB left of what calibration data may take")
    short = _zip(tmp_path / "short.npz", {"x.npy": _npy_header((1000, 4)) + b"\0" * 16})
    _refused(short, relu, "'x' is truncated (16 of 16000 bytes)")
    wrong = _zip(tmp_path / "wrong.npz", {"x.npy": _npy_header((10**10, 3)) + b"\0" * 16})
    _refused(wrong, relu, "has shape 10000000000x3, the model expects ?x4")  # before any size matters


def test_a_zip_bomb_is_refused_before_it_is_decompressed(tmp_path, relu):
    n = 1 << 24  # 16 MB of zeros deflate to 16 kB
    bomb = _zip(tmp_path / "bomb.npz", {"x.npy": _npy_header((n // 16, 4)) + bytes(n)}, zipfile.ZIP_DEFLATED)
    assert bomb.stat().st_size < 100_000
    _refused(bomb, relu, "its arrays take 16.8 MB uncompressed, more than the 1.00 MB left", max_bytes=10**6)
    assert load_samples(bomb, relu)[0]["x"].shape == (n // 16, 4)  # within the default budget it is data


def test_the_budget_covers_all_samples_of_a_folder(tmp_path, relu):
    folder = tmp_path / "samples"
    folder.mkdir()
    for i in range(3):
        np.savez(folder / f"{i}.npz", x=np.ones((1000, 4), np.float32))  # 16 kB each
    assert len(load_samples(folder, relu, max_bytes=48_000)) == 3
    _refused(folder, relu, "2.npz: its arrays take 16.1 kB uncompressed, more than the 8.00 kB left", max_bytes=40_000)
    _refused(folder, relu, "2.npz: 'x' has shape 1000x4 (16.0 kB), more than the 15.9 kB left", max_bytes=47_900)


@pytest.mark.parametrize("members, needle", [
    ({"x": b"hello"}, "holds 'x', which is not an .npy array"),
    ({"x.npy": b"\x93NUMPY\x03\x00" + b"\0" * 20}, "'x' is not a readable .npy array"),
    ({"x.npy": _npy_header((1, 4), "<U4") + b"\0" * 64}, "input 'x' is <U4, the model expects float32"),
    ({"x.npy": _npy_header((1, 4), "<c8") + b"\0" * 32}, "'x' holds complex64, not numbers or strings"),
])
def test_members_that_are_not_numeric_arrays(tmp_path, relu, members, needle):
    _refused(_zip(tmp_path / "bad.npz", members), relu, needle)


def test_pickled_objects_are_refused_from_the_header(tmp_path, relu):
    np.savez(tmp_path / "p.npz", x=np.array([{"a": 1}], dtype=object))
    _refused(tmp_path / "p.npz", relu, "'x' holds Python objects (a pickle: save strings as a str array")


def test_good_files_read_back_exactly(tmp_path, relu):
    x = np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4))
    np.savez_compressed(tmp_path / "s.npz", x=x)
    (sample,) = load_samples(tmp_path / "s.npz", relu)
    np.testing.assert_array_equal(sample["x"], x)


def test_the_cli_says_it_in_one_line(tmp_path, relu):
    import onnx

    onnx.save(relu, tmp_path / "m.onnx")
    os.mkfifo(tmp_path / "f.npz")
    err = io.StringIO()
    import contextlib

    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["report", str(tmp_path / "m.onnx"), "--calibration-data", str(tmp_path / "f.npz")])
    assert code == 2 and err.getvalue().count("\n") == 1 and "is not a regular file" in err.getvalue()
