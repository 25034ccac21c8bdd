"""Bring what the GPU benchmark needs to a lent GPU machine, and run it there.

Here (a machine with PyPI)::

    python -m benchmarks.gpu_setup prepare [--dir .gpu] [--part-mib 58] [--extra-wheels DIR]

downloads the wheels the GPU machine lacks (onnxruntime-gpu, whose CUDA 13 build is ~255 MB; the
peers' small pure-Python wheels; onnxruntime-genai for the catalog's genai decoder; any wheels in
``--extra-wheels``, e.g. TensorRT's, which PyPI only serves as a stub that downloads from NVIDIA's
own index), cuts every file larger than a part into parts, packs the pieces into *loads* of at most
``--part-mib`` MiB (each ``DIR/load-NN/``, with ``manifest.json``: every wheel's and piece's size
and SHA-256), checks that each load and this repository's tracked files fit one device call
(64 MiB), and prints the device calls in order. ``DIR`` must be ignored by git (``/.gpu/`` is).

There (the GPU machine; plain ``python3``, standard library only, state in ``/tmp/amp-gpu``)::

    python3 -m benchmarks.gpu_setup device receive .gpu/load-NN   # one call per load, back to back
    python3 -m benchmarks.gpu_setup device prebuild [NAME ...]    # full-size catalog exports, in the background
    python3 -m benchmarks.gpu_setup device install                # join, check, pip install --target (after prebuild)
    python3 -m benchmarks.gpu_setup device check                  # ldd, providers, a CUDA session
    python3 -m benchmarks.gpu_setup device start -- ARGS          # python -m benchmarks.gpu ARGS, in the background
    python3 -m benchmarks.gpu_setup device wait [--seconds 540]   # then copy its files to $OUT

``install`` joins each wheel from its parts and checks its SHA-256, removes the image's CPU
onnxruntime (two onnxruntime distributions would overwrite each other, and amp-compiler refuses
that), installs the wheels with ``pip install --no-deps --no-index --target /tmp/amp-gpu/site`` and
amp-compiler itself in editable mode. The environment of every later step puts that folder on
``PYTHONPATH`` and the ``lib`` folders of torch's ``nvidia-*`` packages (CUDA 13, cuDNN, cuBLAS)
and of any TensorRT wheel on ``LD_LIBRARY_PATH``; ``check`` runs ``ldd`` on onnxruntime's provider
libraries, lists ``get_available_providers()`` and fails unless a session's ``get_providers()``
starts with the CUDA provider. ``start`` runs the benchmark in a new session (it outlives the device
call; the machine stays lent while calls follow each other), ``wait`` returns when it ends or after
``--seconds`` and copies ``gpu.json``, ``gpu.md`` and the logs into ``$OUT``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("AMP_GPU_STATE", "/tmp/amp-gpu"))
MIB = 1 << 20
CALL_LIMIT = 64 * MIB  # what one device call may carry, the working tree included
ORT_GPU = "onnxruntime-gpu==1.31.1"  # links CUDA 13 (libcublasLt.so.13), as torch's nvidia-* packages there
#: Small wheels the GPU machine lacks or has at another version (versions: this repository's venv's).
SMALL = ("onnxconverter-common==1.16.0", "onnx-ir==1.1.0", "onnxruntime-genai==0.18.0", "nvidia-modelopt==0.47.0",
         "onnx-graphsurgeon==0.6.1", "onnxslim==0.1.98", "polygraphy==0.53.6", "lief==1.0.0")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "any")
ARCHITECTURES = ("bert-base", "gpt2", "vit-base", "resnet50", "whisper-tiny-encoder", "t5-small-encoder",
                 "t5-small-decoder")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------------------- here


def download(requirements: list[str], folder: Path) -> None:
    """``pip download --no-deps`` of each requirement for the GPU machine's Python 3.12 on x86-64."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(folder), *[a for p in PLATFORMS for a in ("--platform", p)], *requirements]
    subprocess.run(cmd, check=True)


def pack(wheels: list[Path], out: Path, part_bytes: int) -> dict:
    """Cut the wheels into pieces of at most ``part_bytes`` and pack them into loads (first fit,
    largest first) under ``out/load-NN``; returns the manifest, also written into every load."""
    shutil.rmtree(out / "pieces", ignore_errors=True)
    for old in out.glob("load-*"):
        shutil.rmtree(old)
    pieces_dir = out / "pieces"
    pieces_dir.mkdir(parents=True)
    manifest: dict = {"part_bytes": part_bytes, "wheels": [], "loads": []}
    pieces = []
    for wheel in wheels:
        size = wheel.stat().st_size
        parts = []
        with wheel.open("rb") as f:
            for index, chunk in enumerate(iter(lambda: f.read(part_bytes), b"")):
                name = wheel.name if size <= part_bytes else f"{wheel.name}.part{index:02d}"
                (pieces_dir / name).write_bytes(chunk)
                parts.append({"file": name, "size": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
                pieces.append((len(chunk), name))
        manifest["wheels"].append({"file": wheel.name, "size": size, "sha256": sha256(wheel), "parts": parts})
    loads: list[list[tuple[int, str]]] = []
    for size, name in sorted(pieces, reverse=True):
        load = next((ld for ld in loads if sum(s for s, _ in ld) + size <= part_bytes), None)
        if load is None:
            loads.append(load := [])
        load.append((size, name))
    for i, load in enumerate(loads, 1):
        folder = out / f"load-{i:02d}"
        folder.mkdir()
        for _, name in load:
            (pieces_dir / name).replace(folder / name)
        manifest["loads"].append({"folder": folder.name, "files": [n for _, n in load], "size": sum(s for s, _ in load)})
    pieces_dir.rmdir()
    for entry in manifest["loads"]:
        (out / entry["folder"] / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def tracked_bytes() -> int:
    """The size of this repository's tracked files (what every device call carries besides its load)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in names if n and (ROOT / n.decode()).is_file())


def call_plan(manifest: dict, folder: str, run_args: str = "--provider cuda") -> list[str]:
    """The device calls, in order (each a ``run`` with its carry and command)."""
    me = "python3 -m benchmarks.gpu_setup device"
    calls = []
    for i, load in enumerate(manifest["loads"]):
        path = f"{folder}/{load['folder']}"
        command = f"{me} receive {path}"
        if i == 0:
            command += f" && {me} prebuild"
        if i == len(manifest["loads"]) - 1:
            command += f" && {me} install"
        calls.append(f"run(carry=[{path!r}], command={command!r})")
    calls.append(f"run(command={f'{me} check && {me} start -- {run_args} && {me} wait --seconds 480'!r})")
    calls.append(f"run(command={me + ' wait --seconds 560'!r})  # again until it says the run ended")
    return calls


def prepare(args: argparse.Namespace) -> int:
    out = (ROOT / args.dir).resolve()
    wheels_dir = out / "wheels"
    if not args.no_download:
        download([args.ort, *SMALL], wheels_dir)
    wheels = sorted(wheels_dir.glob("*.whl"))
    for extra in args.extra_wheels or []:
        wheels += sorted(Path(extra).glob("*.whl"))
    manifest = pack(wheels, out, int(args.part_mib * MIB))
    tree = tracked_bytes()
    print(f"{len(manifest['wheels'])} wheels, {sum(w['size'] for w in manifest['wheels']) / MIB:.1f} MiB, "
          f"in {len(manifest['loads'])} loads; tracked files {tree / MIB:.1f} MiB")
    too_big = [ld for ld in manifest["loads"] if ld["size"] + tree > CALL_LIMIT]
    for ld in manifest["loads"]:
        print(f"  {ld['folder']}: {ld['size'] / MIB:.1f} MiB: {', '.join(ld['files'])}")
    if too_big:
        print(f"error: {', '.join(ld['folder'] for ld in too_big)} and the tracked files exceed one call's 64 MiB: "
              "lower --part-mib", file=sys.stderr)
        return 1
    print("\nDevice calls, back to back (the machine is kept while calls follow within ~30 s):")
    for i, call in enumerate(call_plan(manifest, args.dir), 1):
        print(f"{i}. {call}")
    return 0


# ---------------------------------------------------------------------------------------- there


def receive(load: Path) -> None:
    """Copy a carried load's pieces into the state folder, each checked against the manifest."""
    manifest = json.loads((load / "manifest.json").read_text())
    expected = {p["file"]: p for w in manifest["wheels"] for p in w["parts"]}
    pieces = STATE / "pieces"
    pieces.mkdir(parents=True, exist_ok=True)
    (STATE / "manifest.json").write_text(json.dumps(manifest))
    for path in sorted(load.iterdir()):
        if path.name == "manifest.json":
            continue
        want = expected.get(path.name)
        if want is None or path.stat().st_size != want["size"] or sha256(path) != want["sha256"]:
            raise SystemExit(f"{path.name}: not the piece the manifest describes (size or SHA-256 differs)")
        shutil.copyfile(path, pieces / path.name)
        print(f"received {path.name} ({want['size'] / MIB:.1f} MiB)")


def join() -> list[Path]:
    """Every wheel of the manifest, joined from its pieces and checked; the missing pieces raise."""
    manifest = json.loads((STATE / "manifest.json").read_text())
    wheels_dir = STATE / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    missing = [p["file"] for w in manifest["wheels"] for p in w["parts"] if not (STATE / "pieces" / p["file"]).exists()]
    if missing:
        raise SystemExit(f"pieces not received yet: {', '.join(missing)} (carry their loads first)")
    out = []
    for wheel in manifest["wheels"]:
        target = wheels_dir / wheel["file"]
        with target.open("wb") as f:
            for part in wheel["parts"]:
                f.write((STATE / "pieces" / part["file"]).read_bytes())
        if target.stat().st_size != wheel["size"] or sha256(target) != wheel["sha256"]:
            raise SystemExit(f"{wheel['file']}: the joined wheel's size or SHA-256 differs from the manifest's")
        out.append(target)
    return out


def library_folders(roots: list[Path]) -> list[str]:
    """The folders of shared libraries in ``roots``' ``nvidia`` and ``tensorrt_libs`` packages."""
    found = []
    for root in roots:
        for top in ("nvidia", "tensorrt_libs"):
            base = root / top
            if not base.is_dir():
                continue
            for path in sorted([base, *base.rglob("*")]):
                if path.is_dir() and any(p.name.startswith("lib") and ".so" in p.name for p in path.iterdir()):
                    found.append(str(path))
    return found


def environment() -> dict[str, str]:
    """The environment of every step after ``install``."""
    import site

    site_dir = STATE / "site"
    roots = [site_dir, *(Path(p) for p in site.getsitepackages())]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site_dir), str(ROOT)])
    # The image's driver and CUDA toolkit folders come after the wheels' libraries, as a fallback.
    system = [d for d in ("/usr/local/nvidia/lib64", "/usr/local/cuda/lib64") if Path(d).is_dir()]
    folders = [*library_folders(roots), *system, env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(f for f in folders if f)
    env["AMP_MODELS_CACHE"] = str(STATE / "models-cache")
    return env


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True, env=env)


def install_wheels(wheels: list[Path], target: Path) -> None:
    """``pip install`` the wheels into ``target``: no index, no dependencies (each one is carried)."""
    _pip("install", "--no-deps", "--no-index", "--no-compile", "--upgrade", "--target", str(target), *map(str, wheels))


def install(wheels: list[Path], target: Path) -> None:
    """Replace the image's CPU onnxruntime by the carried onnxruntime-gpu, install the other wheels
    into ``target`` and amp-compiler in editable mode. The exports ``prebuild`` runs with the CPU
    onnxruntime must have ended first."""
    if not wait_for(STATE / "prebuild.pid", 400):
        raise SystemExit("the prebuild still runs (its log: /tmp/amp-gpu/prebuild.log): call install again")
    if any(w.name.startswith("onnxruntime_gpu") for w in wheels):
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", "onnxruntime"], check=False)
    install_wheels(wheels, target)
    _pip("install", "--no-deps", "--no-index", "--no-build-isolation", "-e", str(ROOT))


def missing_libraries(ldd_output: str) -> list[str]:
    """The ``not found`` libraries of an ``ldd`` output."""
    return sorted({line.split("=>")[0].strip() for line in ldd_output.splitlines() if "not found" in line})


def check(env: dict[str, str]) -> int:
    """ldd on onnxruntime's provider libraries, then a CUDA session; non-zero unless CUDA leads."""
    code = ("import onnxruntime as ort, os; print(os.path.dirname(ort.__file__)); print(ort.__version__); "
            "print(','.join(ort.get_available_providers()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stderr[-2000:])
        return 1
    folder, version, providers = out.stdout.split("\n")[:3]
    print(f"onnxruntime {version} at {folder}; available providers: {providers}")
    for lib in sorted(Path(folder, "capi").glob("*.so")):
        ldd = subprocess.run(["ldd", str(lib)], env=env, capture_output=True, text=True).stdout
        missing = missing_libraries(ldd)
        print(f"ldd {lib.name}: " + (f"missing {', '.join(missing)}" if missing else "every library found"))
    probe = ("import onnx, onnxruntime as ort; from onnx import helper as h, TensorProto as T; "
             "g = h.make_graph([h.make_node('Relu', ['x'], ['y'])], 'g', [h.make_tensor_value_info('x', T.FLOAT, [4])], "
             "[h.make_tensor_value_info('y', T.FLOAT, [4])]); "
             "m = h.make_model(g, ir_version=10, opset_imports=[h.make_opsetid('', 17)]); "
             "s = ort.InferenceSession(m.SerializeToString(), providers=['CUDAExecutionProvider', "
             "'CPUExecutionProvider']); print(s.get_providers())")
    session = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    print(f"a session's providers: {session.stdout.strip() or session.stderr.strip()[-1000:]}")
    try:
        subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"], check=False)
    except OSError as exc:
        print(f"nvidia-smi: {exc}")
    return 0 if session.stdout.startswith("['CUDAExecutionProvider'") else 1


def start(command: list[str], env: dict[str, str], pid_file: Path, log: Path) -> int:
    """Run ``command`` in a new session (it outlives the device call), its output in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    pid_file.write_text(str(proc.pid))
    print(f"started {' '.join(command)} (pid {proc.pid}, log {log})")
    return proc.pid


def running(pid_file: Path) -> bool:
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it, if it is our child
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(") ")[-1].startswith("Z"))


def wait_for(pid_file: Path, seconds: float) -> bool:
    """Wait until the process in ``pid_file`` has ended, at most ``seconds``; whether it has."""
    end = time.monotonic() + seconds
    while running(pid_file) and time.monotonic() < end:
        time.sleep(2)
    return not running(pid_file)


def collect(out: Path) -> None:
    """The run's files into ``out`` (``$OUT``): at most 8 files, none over 16 MiB (its tail kept)."""
    out.mkdir(parents=True, exist_ok=True)
    for path in [STATE / "out" / "gpu.json", STATE / "out" / "gpu.md", STATE / "out" / "gpu.log",
                 STATE / "run.log", STATE / "prebuild.log"]:
        if path.exists():
            data = path.read_bytes()
            (out / path.name).write_bytes(data[-15 * MIB:])


def device(args: argparse.Namespace) -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    if args.action == "receive":
        if len(args.names) != 1:
            raise SystemExit("receive takes one load folder")
        receive(Path(args.names[0]))
    elif args.action == "prebuild":
        names = args.names or list(ARCHITECTURES)
        env = {**os.environ, "AMP_MODELS_CACHE": str(STATE / "models-cache")}
        start([sys.executable, "-m", "models.build", "--size", "full", *names], env, STATE / "prebuild.pid",
              STATE / "prebuild.log")
    elif args.action == "install":
        install(join(), STATE / "site")
    elif args.action == "check":
        return check(environment())
    elif args.action == "start":
        if running(STATE / "run.pid"):
            raise SystemExit("a run is still going (device wait, then start again)")
        command = [sys.executable, "-m", "benchmarks.gpu", *args.rest, "--out", str(STATE / "out"),
                   "--workdir", str(STATE / "work"), "--resume"]
        start(command, environment(), STATE / "run.pid", STATE / "run.log")
    elif args.action == "wait":
        ended = wait_for(STATE / "run.pid", args.seconds)
        collect(Path(os.environ.get("OUT", STATE / "collected")))
        tail = (STATE / "run.log").read_text(errors="replace").splitlines()[-15:] if (STATE / "run.log").exists() else []
        print("\n".join(tail))
        print("the run ended" if ended else f"the run goes on after {args.seconds:.0f} s: wait again")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_setup", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="where", required=True)
    here = sub.add_parser("prepare", help="here: download, cut and pack the wheels, print the device calls")
    here.add_argument("--dir", default=".gpu", help="an ignored folder of this repository")
    here.add_argument("--part-mib", type=float, default=58.0)
    here.add_argument("--ort", default=ORT_GPU, help="the onnxruntime-gpu requirement")
    here.add_argument("--extra-wheels", action="append", help="a folder of more wheels to bring (TensorRT's)")
    here.add_argument("--no-download", action="store_true", help="pack what DIR/wheels and --extra-wheels hold")
    there = sub.add_parser("device", help="there: receive, prebuild, install, check, start, wait")
    there.add_argument("action", choices=("receive", "prebuild", "install", "check", "start", "wait"))
    there.add_argument("names", nargs="*", help="receive: the load's folder; prebuild: catalog names")
    there.add_argument("--seconds", type=float, default=540.0, help="wait: at most this long")
    args = parser.parse_args(argv)
    args.rest = rest
    return prepare(args) if args.where == "prepare" else device(args)


if __name__ == "__main__":
    sys.exit(main())
