"""benchmarks.gpu_setup's logic on small files: cutting and packing wheels, receiving and joining
them, installing one with --target, the environment and the checks' parsing, a background run."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from benchmarks import gpu_setup


def _wheel(folder: Path, name: str = "ampgpu_probe", version: str = "1.0") -> Path:
    """A minimal valid wheel with one module, ``name``, whose ``VALUE`` is 42."""
    files = {
        f"{name}.py": b"VALUE = 42\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{name}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = f"{name}-{version}.dist-info/RECORD"
    lines = [f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
             for path, data in files.items()]
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name_, data in files.items():
            z.writestr(name_, data)
        z.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    return path


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_setup, "STATE", tmp_path / "state")
    return tmp_path / "state"


def test_pack_cuts_large_files_into_loads_that_join_back(tmp_path, state):
    """Files over a part are cut, pieces packed into loads of at most a part; every load received
    (checked against the manifest) and the wheels joined give the same bytes; a piece that changed
    on the way is refused."""
    src = tmp_path / "wheels"
    src.mkdir()
    sizes = {"big-1.whl": 2500, "mid-1.whl": 700, "small-1.whl": 300}
    for name, size in sizes.items():
        (src / name).write_bytes(os.urandom(size))
    manifest = gpu_setup.pack(sorted(src.glob("*.whl")), tmp_path / "gpu", 1024)
    big = next(w for w in manifest["wheels"] if w["file"] == "big-1.whl")
    assert [p["size"] for p in big["parts"]] == [1024, 1024, 452]
    assert all(load["size"] <= 1024 for load in manifest["loads"])
    assert sum(len(load["files"]) for load in manifest["loads"]) == 5 and len(manifest["loads"]) == 4
    for load in manifest["loads"]:
        gpu_setup.receive(tmp_path / "gpu" / load["folder"])
    joined = gpu_setup.join()
    assert {p.name: p.read_bytes() for p in joined} == {n: (src / n).read_bytes() for n in sizes}
    bad = tmp_path / "gpu" / manifest["loads"][0]["folder"]
    victim = next(p for p in bad.iterdir() if p.name != "manifest.json")
    data = victim.read_bytes()
    victim.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # a changed first byte (b"x" may be the same one)
    with pytest.raises(SystemExit, match="not the piece the manifest describes"):
        gpu_setup.receive(bad)


def test_join_names_the_pieces_still_missing(tmp_path, state):
    src = tmp_path / "wheels"
    src.mkdir()
    (src / "big-1.whl").write_bytes(os.urandom(3000))
    manifest = gpu_setup.pack([src / "big-1.whl"], tmp_path / "gpu", 1024)
    gpu_setup.receive(tmp_path / "gpu" / manifest["loads"][0]["folder"])
    with pytest.raises(SystemExit, match="pieces not received yet: big-1.whl.part"):
        gpu_setup.join()


def test_a_carried_wheel_installs_with_target_and_imports(tmp_path, state):
    src = tmp_path / "wheels"
    src.mkdir()
    _wheel(src)
    manifest = gpu_setup.pack(sorted(src.glob("*.whl")), tmp_path / "gpu", 1 << 20)
    gpu_setup.receive(tmp_path / "gpu" / manifest["loads"][0]["folder"])
    gpu_setup.install_wheels(gpu_setup.join(), state / "site")
    out = subprocess.run([sys.executable, "-c", "import ampgpu_probe; print(ampgpu_probe.VALUE)"],
                         env={**os.environ, "PYTHONPATH": str(state / "site")}, capture_output=True, text=True)
    assert out.stdout.strip() == "42", out.stderr


def test_call_plan_carries_one_load_per_call_then_installs_and_runs():
    manifest = {"loads": [{"folder": "load-01"}, {"folder": "load-02"}]}
    calls = gpu_setup.call_plan(manifest, ".gpu")
    assert calls[0].startswith("run(carry=['.gpu/load-01']") and "prebuild" in calls[0]
    assert "receive .gpu/load-02 && python3 -m benchmarks.gpu_setup device install" in calls[1]
    assert "check && " in calls[2] and "start -- --provider cuda" in calls[2]
    assert "wait --seconds 560" in calls[3]


def test_missing_libraries_are_read_from_ldd():
    ldd = ("\tlinux-vdso.so.1 (0x00007ffd)\n\tlibcublasLt.so.13 => not found\n"
           "\tlibcudnn.so.9 => /x/nvidia/cudnn/lib/libcudnn.so.9 (0x7f)\n\tlibcufft.so.12 => not found\n")
    assert gpu_setup.missing_libraries(ldd) == ["libcublasLt.so.13", "libcufft.so.12"]


def test_library_folders_are_the_nvidia_packages_lib_folders(tmp_path):
    for rel in ("nvidia/cublas/lib/libcublasLt.so.13", "nvidia/cu13/lib/libcudart.so.13", "nvidia/cudnn/include/cudnn.h",
                "tensorrt_libs/libnvinfer.so.10"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    folders = gpu_setup.library_folders([tmp_path, tmp_path / "absent"])
    assert folders == [str(tmp_path / "nvidia/cu13/lib"), str(tmp_path / "nvidia/cublas/lib"), str(tmp_path / "tensorrt_libs")]


def test_a_background_run_is_waited_for_and_its_files_collected(tmp_path, state):
    state.mkdir()
    (state / "out").mkdir()
    (state / "out" / "gpu.json").write_text(json.dumps({"rows": []}))
    gpu_setup.start([sys.executable, "-c", "print('measured')"], dict(os.environ), state / "run.pid", state / "run.log")
    assert gpu_setup.wait_for(state / "run.pid", 60)
    gpu_setup.collect(tmp_path / "OUT")
    assert sorted(p.name for p in (tmp_path / "OUT").iterdir()) == ["gpu.json", "run.log"]
    assert (tmp_path / "OUT" / "run.log").read_text().strip() == "measured"
