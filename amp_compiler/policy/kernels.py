"""Kernel coverage of onnxruntime's execution providers: which ops have a kernel for which types.

An op that has no FP16 (or BF16) kernel on the provider the model is meant for must stay FP32 there:
otherwise onnxruntime places it on the CPU, with copies to and from the GPU around it. Where the
coverage comes from, best first:

1. The installed onnxruntime's kernel registry (``get_all_opkernel_def()``: provider, op, version
   range, type constraints), when it lists the provider. It is read in a child process: an
   ``onnxruntime-gpu`` whose CUDA libraries are missing lists the CUDA provider as available, and
   reading its registry then crashes the process (a segfault, not an exception).
2. For the CUDA provider, the snapshot shipped with the package (``policy/ort_cuda_kernels.json``):
   the registry of the ``onnxruntime-gpu`` wheel named in the file, read by
   ``python -m amp_compiler.policy.make_kernel_snapshot``.

``AMP_COMPILER_KERNEL_SOURCE=snapshot`` skips the probe (reproducible conversions on any machine).

Kernel matching follows onnxruntime's: a kernel serves a node when its domain and op match, its
version range holds the node's schema ``since_version`` (the op's version at the model's opset),
and every type parameter it constrains allows the node's type for that parameter.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from amp_compiler.policy.schemas import canonical_domain
from amp_compiler.targets import Provider

if TYPE_CHECKING:  # onnx is imported where a model is checked
    pass

__all__ = [
    "KernelCoverage", "KernelDef", "OPEN_END", "ORT_NAMES", "SHORT_NAMES", "SNAPSHOT", "SOURCE_ENV", "coverage_for",
    "load_snapshot", "probe_registry", "read_snapshot_data", "short_type",
]

SNAPSHOT = "ort_cuda_kernels.json"
ORT_NAMES = {
    Provider.CUDA: "CUDAExecutionProvider",
    Provider.TENSORRT: "TensorrtExecutionProvider",
    Provider.CPU: "CPUExecutionProvider",
}
SHORT_NAMES = {Provider.CUDA: "CUDA", Provider.TENSORRT: "TensorRT", Provider.CPU: "CPU"}
OPEN_END = 2**31 - 1  # onnxruntime's end of an open version range (INT_MAX)
SOURCE_ENV = "AMP_COMPILER_KERNEL_SOURCE"
#: The shared library an onnxruntime build ships for a provider (in ``onnxruntime/capi``): a build
#: without it does not list the provider, which is then known without importing onnxruntime.
PROVIDER_LIBRARIES = {"CUDAExecutionProvider": "onnxruntime_providers_cuda"}

# Run in a child process: prints the registry of one provider as JSON (argv[1]: its onnxruntime name).
PROBE_SCRIPT = r"""
import json, sys
import onnxruntime
from onnxruntime.capi import _pybind_state as C
want = sys.argv[1]
defs = []
for k in C.get_all_opkernel_def():
    if k.provider == want:
        lo, hi = k.version_range
        defs.append([k.domain, k.op_name, lo, hi, {p: list(t) for p, t in k.type_constraints.items()}])
sys.stdout.write(json.dumps({"onnxruntime_version": onnxruntime.__version__, "provider": want, "kernels": defs}))
"""


def short_type(type_str: str) -> str:
    """``tensor(float16)`` -> ``float16``; other type strings (``seq(tensor(float))``) unchanged."""
    if type_str.startswith("tensor(") and type_str.endswith(")"):
        return type_str[len("tensor(") : -1]
    return type_str


@dataclasses.dataclass(frozen=True)
class KernelDef:
    start: int
    end: int  # inclusive; OPEN_END for "and later"
    types: Mapping[str, frozenset[str]]  # type parameter -> short type names ("float16")

    def serves(self, since_version: int) -> bool:
        return self.start <= since_version <= self.end

    def accepts(self, requirements: Iterable[tuple[str, Iterable[str]]]) -> bool:
        """True when every (type parameter, candidate types) requirement that this kernel constrains
        has a candidate it allows. Parameters the kernel does not constrain take any type."""
        for param, candidates in requirements:
            allowed = self.types.get(param)
            if allowed is not None and not any(c in allowed for c in candidates):
                return False
        return True


@dataclasses.dataclass(frozen=True)
class KernelCoverage:
    """One provider's kernels, by (domain, op), and where they were read."""

    provider: Provider
    onnxruntime_version: str
    source: str  # a short phrase for decision reasons: "onnxruntime-gpu 1.31.1 kernel registry snapshot"
    kernels: Mapping[tuple[str, str], tuple[KernelDef, ...]]

    def defs(self, domain: str, op: str, since_version: int) -> tuple[KernelDef, ...]:
        return tuple(k for k in self.kernels.get((canonical_domain(domain), op), ()) if k.serves(since_version))

    def has_op(self, domain: str, op: str) -> bool:
        return (canonical_domain(domain), op) in self.kernels

    def supports(
        self, domain: str, op: str, since_version: int, requirements: Iterable[tuple[str, Iterable[str]]]
    ) -> bool:
        """True when some kernel of ``op`` at ``since_version`` takes these types.

        ``requirements``: one (type parameter, candidate types) pair per input or output, any
        candidate will do: the slots being decided have the low-precision type alone, the others
        every type they may still end up with.
        """
        requirements = [(p, tuple(c)) for p, c in requirements]
        return any(k.accepts(requirements) for k in self.defs(domain, op, since_version))

    def low_precision_ops(self, type_name: str) -> set[tuple[str, str]]:
        """(domain, op) pairs with at least one kernel that lists ``type_name`` ("float16")."""
        return {
            key for key, defs in self.kernels.items()
            if any(type_name in types for k in defs for types in k.types.values())
        }


def _build(provider: Provider, version: str, source: str, rows: Iterable) -> KernelCoverage:
    kernels: dict[tuple[str, str], list[KernelDef]] = {}
    for domain, op, start, end, types in rows:
        kernels.setdefault((canonical_domain(domain), op), []).append(
            KernelDef(
                int(start),
                OPEN_END if end is None else int(end),
                {p: frozenset(short_type(t) for t in ts) for p, ts in types.items()},
            )
        )
    return KernelCoverage(provider, version, source, {k: tuple(v) for k, v in kernels.items()})


def read_snapshot_data() -> dict:
    return json.loads(resources.files("amp_compiler.policy").joinpath(SNAPSHOT).read_text("utf-8"))


@functools.cache
def load_snapshot() -> KernelCoverage:
    """The CUDA provider's kernels from the snapshot shipped with the package."""
    data = read_snapshot_data()
    rows = [
        (domain, op, start, end, types)
        for domain, ops in data["kernels"].items()
        for op, defs in ops.items()
        for start, end, types in defs
    ]
    source = f"onnxruntime-gpu {data['onnxruntime_version']} kernel registry snapshot"
    return _build(Provider.CUDA, data["onnxruntime_version"], source, rows)


def probe_registry(
    ort_provider: str,
    *,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> dict | None:
    """Read one provider's kernel registry in a child process; None when the child fails or crashes.

    Returns ``{"onnxruntime_version", "provider", "kernels": [[domain, op, start, end, {param:
    [type strings]}], ...]}``. ``python`` and ``env`` choose the interpreter and its environment
    (the snapshot generator points them at an unpacked onnxruntime-gpu wheel).
    """
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", PROBE_SCRIPT, ort_provider],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=None if env is None else dict(env),
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return None
    return data if data.get("kernels") else None


def _may_list(name: str) -> bool:
    """False when the installed onnxruntime cannot list provider ``name``: no onnxruntime, or a build
    without the provider's library (the CPU wheel and CUDA). Found without importing onnxruntime
    (a plain conversion then never loads it); True means "import it and ask"."""
    try:
        spec = importlib.util.find_spec("onnxruntime")
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    library = PROVIDER_LIBRARIES.get(name)
    if library is None:
        return True
    return any(any((Path(folder) / "capi").glob(f"*{library}*")) for folder in spec.submodule_search_locations)


def _available_providers() -> list[str]:
    try:
        import onnxruntime

        return list(onnxruntime.get_available_providers())
    except Exception:  # no onnxruntime, or a broken one: nothing to probe
        return []


@functools.cache
def coverage_for(provider: Provider) -> KernelCoverage | None:
    """The kernels of ``provider``: installed registry if listed and readable, else the snapshot.

    None for TensorRT (it has no kernel registry: it builds an engine from the graph and takes each
    tensor's type from it) and for a CPU provider whose registry cannot be read.
    """
    if provider is Provider.TENSORRT:
        return None
    name = ORT_NAMES[provider]
    use_installed = os.environ.get(SOURCE_ENV, "").lower() != "snapshot"
    if use_installed and _may_list(name) and name in _available_providers():
        data = probe_registry(name)
        if data is not None:
            version = data["onnxruntime_version"]
            return _build(provider, version, f"installed onnxruntime {version} kernel registry", data["kernels"])
    if provider is Provider.CUDA:
        return load_snapshot()
    return None


