"""Where models sit on disk (amp_compiler.onnx.load.locations): a model path is read wherever its symlink
points; external data in a Hugging Face hub cache entry (``snapshots/<rev>/x -> ../../blobs/<sha>``) and
in an optimum-style export folder converts; every other link out of the model's folder stays refused.

The cache layouts are built here with real symlinks, as huggingface_hub lays them out (no network).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import numpy_helper

from amp_compiler import convert
from amp_compiler.cli import main
from amp_compiler.errors import ModelLoadError
from amp_compiler.onnx.load import files
from amp_compiler.onnx.load.deferred import DeferredTensor
from amp_compiler.onnx.load.files import load_model, load_model_deferred
from amp_compiler.onnx.load.locations import hub_blobs
from benchmarks.generate import transformer_model

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")


def _cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def _model() -> onnx.ModelProto:
    return transformer_model(blocks=2, hidden=256)  # weights of 256 KiB: left on disk (>= 64 KiB)


def _same_conversion(out: Path, model: onnx.ModelProto) -> None:
    """The converted file holds what converting ``model`` in memory gives: the same nodes and weights."""
    expected = convert(model, probe=False).model
    got = onnx.load(out)
    assert [n.SerializeToString() for n in got.graph.node] == [n.SerializeToString() for n in expected.graph.node]
    want = {t.name: numpy_helper.to_array(t) for t in expected.graph.initializer}
    assert {t.name for t in got.graph.initializer} == set(want)
    for t in got.graph.initializer:
        np.testing.assert_array_equal(numpy_helper.to_array(t), want[t.name])


def _hub_entry(tmp_path: Path) -> tuple[Path, Path]:
    """An empty hub cache entry ``models--org--name`` with ``blobs/`` and ``snapshots/<rev>/``."""
    entry = tmp_path / "hub" / "models--org--name"
    (entry / "blobs").mkdir(parents=True)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("0123abcd")
    snapshot = entry / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    return entry, snapshot


def _blob(entry: Path, data: bytes) -> str:
    """Store ``data`` as a blob named by its hash (huggingface_hub names blobs by sha256 or git sha1)."""
    import hashlib

    name = hashlib.sha256(data).hexdigest()
    (entry / "blobs" / name).write_bytes(data)
    return name


def _link_file(snapshot: Path, relative: str, entry: Path, blob: str) -> Path:
    """``snapshot/relative -> ../../blobs/<blob>`` (one ``..`` more per folder level), as the hub links it."""
    link = snapshot / relative
    link.parent.mkdir(parents=True, exist_ok=True)
    up = "../" * (len(Path(relative).parts) + 1)
    link.symlink_to(f"{up}blobs/{blob}")
    assert link.resolve() == (entry / "blobs" / blob).resolve()
    return link


# ------------------------------------------------------------------------ a model path is the user's


def test_a_large_model_file_symlinked_from_the_hub_cache_converts(tmp_path, monkeypatch):
    """Weights inside the file, read lazily (skimmed): the file's own bytes are read through its link
    (before: "external data location 'model.onnx' resolves (through a symlink) outside the model's folder")."""
    monkeypatch.setattr(files, "SKIM_MIN_FILE_BYTES", 1024)
    model = _model()
    entry, snapshot = _hub_entry(tmp_path)
    path = _link_file(snapshot, "model.onnx", entry, _blob(entry, model.SerializeToString()))
    loaded = load_model_deferred(path, check=False)
    assert loaded.inline and loaded.files == [path]  # weights left in the file, which is the blob
    out = tmp_path / "out.onnx"
    code, _, err = _cli("convert", path, "-o", out, "-q")
    assert code == 0, err
    assert out.read_bytes() == convert(model, probe=False).model.SerializeToString()
    assert sorted(p.name for p in (entry / "blobs").iterdir()) == [path.resolve().name]  # nothing written there


@pytest.mark.parametrize("how", ["absolute", "relative", "chain"])
def test_a_model_file_symlinked_anywhere_converts(tmp_path, monkeypatch, how):
    """An evaluation folder of links to models kept elsewhere (the issue's 12 of 12 architectures)."""
    monkeypatch.setattr(files, "SKIM_MIN_FILE_BYTES", 1024)
    model = _model()
    store = tmp_path / "store" / "deep"
    store.mkdir(parents=True)
    onnx.save(model, store / "real.onnx")
    evaluation = tmp_path / "eval"
    evaluation.mkdir()
    link = evaluation / "model.onnx"
    if how == "absolute":
        link.symlink_to(store / "real.onnx")
    elif how == "relative":
        link.symlink_to("../store/deep/real.onnx")
    else:
        (evaluation / "hop.onnx").symlink_to(store / "real.onnx")
        link.symlink_to("hop.onnx")
    result = convert(link, probe=False)
    assert result.output is not None and result.output.inline
    assert result.model.SerializeToString() == convert(model, probe=False).model.SerializeToString()
    np.testing.assert_array_equal(
        numpy_helper.to_array(load_model(link).graph.initializer[-1]), numpy_helper.to_array(model.graph.initializer[-1])
    )


def test_a_model_that_names_itself_through_its_link_reads_its_own_bytes_only(tmp_path, monkeypatch):
    """A location naming the model file is the model file, not whatever a file of that name beside
    the link's target would be."""
    monkeypatch.setattr(files, "SKIM_MIN_FILE_BYTES", 1024)
    model = _model()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    onnx.save(model, elsewhere / "target.onnx")
    (elsewhere / "model.onnx").write_bytes(b"\xff" * 100)  # same name as the link, beside the target
    folder = tmp_path / "models"
    folder.mkdir()
    (folder / "model.onnx").symlink_to(elsewhere / "target.onnx")
    loaded = load_model_deferred(folder / "model.onnx", check=False)
    assert set(loaded.locations.values()) == {(elsewhere / "target.onnx").resolve()}


def test_a_model_file_that_shrinks_names_the_model_file_not_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "SKIM_MIN_FILE_BYTES", 1024)
    path = tmp_path / "m.onnx"
    onnx.save(_model(), path)
    loaded = load_model_deferred(path, check=False)
    file = next(iter(loaded.locations.values()))
    tensor = next(t for t in loaded.model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    deferred = DeferredTensor(ir.serde.deserialize_tensor(tensor, str(tmp_path)), file, inline=True)
    os.truncate(path, 10)
    with pytest.raises(ModelLoadError, match="the model file shrank") as caught:
        deferred.tobytes()
    assert "external data" not in str(caught.value)


# --------------------------------------------------------------------- external data in cache layouts


def _external_files(tmp_path: Path, model: onnx.ModelProto) -> tuple[bytes, bytes]:
    """``model`` saved as model.onnx + model.onnx_data (optimum's export layout): both files' bytes."""
    folder = tmp_path / "export"
    folder.mkdir()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # onnx.save moves the weights of the model it saves to external data
    onnx.save(copy, folder / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx_data", size_threshold=1024)
    return (folder / "model.onnx").read_bytes(), (folder / "model.onnx_data").read_bytes()


def test_an_optimum_style_export_folder_converts(tmp_path):
    model = _model()
    _external_files(tmp_path, model)
    path = tmp_path / "export" / "model.onnx"
    loaded = load_model_deferred(path)
    assert loaded.deferred and loaded.files == [path, path.with_name("model.onnx_data")]
    out = tmp_path / "out" / "model.onnx"
    out.parent.mkdir()
    code, _, err = _cli("convert", path, "-o", out, "-q")
    assert code == 0, err
    _same_conversion(out, model)


@pytest.mark.parametrize("folder", ["", "onnx/"], ids=["top", "subfolder"])
def test_external_data_in_the_hub_cache_layout_converts(tmp_path, folder):
    """``snapshots/<rev>/[onnx/]model.onnx`` and ``model.onnx_data`` both links into ``blobs/``."""
    model = _model()
    graph_bytes, data_bytes = _external_files(tmp_path, model)
    entry, snapshot = _hub_entry(tmp_path)
    path = _link_file(snapshot, f"{folder}model.onnx", entry, _blob(entry, graph_bytes))
    _link_file(snapshot, f"{folder}model.onnx_data", entry, _blob(entry, data_bytes))
    assert hub_blobs(path.parent.resolve()) == (entry / "blobs").resolve()
    out = tmp_path / "out.onnx"
    code, _, err = _cli("convert", path, "-o", out, "-q")
    assert code == 0, err
    _same_conversion(out, model)
    # read whole too (report, the API's load_model), and the blob counts as the file read
    loaded, read = files.load_model_and_files(path)
    assert read[1] == (entry / "blobs").resolve() / os.path.basename(os.readlink(path.with_name("model.onnx_data")))
    assert len(loaded.graph.initializer) == len(model.graph.initializer)


# ------------------------------------------------------------------------ what stays refused in them


def _hub_with(tmp_path: Path, data_link) -> Path:
    """A hub entry whose model.onnx (a blob) names model.onnx_data, which ``data_link(snapshot, entry,
    data)`` makes (the weights' bytes: reading them would 'work')."""
    model = _model()
    graph_bytes, data_bytes = _external_files(tmp_path, model)
    entry, snapshot = _hub_entry(tmp_path)
    path = _link_file(snapshot, "model.onnx", entry, _blob(entry, graph_bytes))
    data_link(snapshot, entry, data_bytes)
    return path


def _refused(path: Path, *needles: str) -> None:
    out = path.parent.parent.parent.parent / "out.onnx"
    code, stdout, err = _cli("convert", path, "-o", out)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and stdout == "", err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert not out.exists()


def _secret(tmp_path: Path, data: bytes) -> Path:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(data)
    return secret


@pytest.mark.parametrize("how", ["absolute", "relative-out", "into-refs", "blob-links-out", "blobs-folder-linked"])
def test_hub_links_that_leave_the_blobs_are_refused(tmp_path, how):
    def make(snapshot: Path, entry: Path, data: bytes) -> None:
        secret = _secret(tmp_path, data)
        link = snapshot / "model.onnx_data"
        if how == "absolute":
            link.symlink_to(secret)
        elif how == "relative-out":
            link.symlink_to("../../../../secret.bin")
        elif how == "into-refs":
            (entry / "refs" / "weights").write_bytes(data)
            link.symlink_to("../../refs/weights")
        elif how == "blob-links-out":  # a blob that is itself a link out of the cache
            (entry / "blobs" / "f00d").symlink_to(secret)
            link.symlink_to("../../blobs/f00d")
        else:  # blobs/ itself a link to the secret's folder: not a cache entry
            os.rename(entry / "blobs", entry / "real-blobs")
            (entry / "blobs").symlink_to(tmp_path)
            for blob in (entry / "real-blobs").iterdir():
                os.rename(blob, tmp_path / blob.name)
            link.symlink_to("../../blobs/secret.bin")

    _refused(_hub_with(tmp_path, make), "'model.onnx_data'", "outside the model's folder", "refused")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_hub_link_to_a_fifo_in_the_blobs_is_refused_without_blocking(tmp_path):
    def make(snapshot: Path, entry: Path, data: bytes) -> None:
        os.mkfifo(entry / "blobs" / "fifo")
        (snapshot / "model.onnx_data").symlink_to("../../blobs/fifo")

    _refused(_hub_with(tmp_path, make), "'model.onnx_data'", "not a regular file")


@pytest.mark.parametrize("location", ["../../blobs/BLOB", "ABSOLUTE"])
def test_locations_written_through_the_cache_are_refused_before_the_file_system(tmp_path, location):
    """The rule admits links the cache made, never a location spelled with '..' or an absolute path."""
    model = _model()
    graph_bytes, data_bytes = _external_files(tmp_path, model)
    entry, snapshot = _hub_entry(tmp_path)
    blob = _blob(entry, data_bytes)
    spelled = location.replace("BLOB", blob).replace("ABSOLUTE", str((entry / "blobs" / blob).resolve()))
    graph = onnx.load_from_string(graph_bytes)
    for t in graph.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = spelled
    path = _link_file(snapshot, "model.onnx", entry, _blob(entry, graph.SerializeToString()))
    _refused(path, "refused")


def test_a_folder_that_merely_looks_like_a_snapshot_admits_nothing_more(tmp_path):
    """``snapshots/<rev>/`` without a real ``blobs/`` beside it is an ordinary folder."""
    folder = tmp_path / "x" / "snapshots" / "rev"
    folder.mkdir(parents=True)
    assert hub_blobs(folder) is None
    (tmp_path / "x" / "blobs").write_text("a file, not a folder")
    assert hub_blobs(folder) is None
    (tmp_path / "x" / "blobs").unlink()
    (tmp_path / "x" / "blobs").mkdir()
    assert hub_blobs(folder) == tmp_path / "x" / "blobs"
    assert hub_blobs(folder / "onnx" / "deeper") == tmp_path / "x" / "blobs"
    assert hub_blobs(tmp_path / "x") is None
