"""Running trusted models in this process, without limits (:class:`InProcessRunner`): the test suite's
own checks use it; untrusted models go to :class:`~amp_compiler.runtime.runner.ChildRunner`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx

from amp_compiler import runtime
from amp_compiler.errors import ModelRefusedError, ModelRunError, ModelUnsupportedError
from amp_compiler.runtime import child as runner_child
from amp_compiler.runtime.session import CPU, Runner, Session, check_provider, compare_feeds

__all__ = ["InProcessRunner"]


class _LocalSession(Session):
    def __init__(self, session: Any, run_options: Any):
        self._session, self._options = session, run_options
        self._set_facts(runner_child.session_facts(session))

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return self._session.run(None, feeds, self._options)
        except Exception as exc:  # onnxruntime's own exception types
            raise ModelRunError(f"onnxruntime could not run the model: {runner_child.first_line(exc)}") from exc


class InProcessRunner(Runner):
    """Sessions in this process, with no time or memory limit: for models the caller trusts only
    (a hostile model can hang or crash the process). The test suite's own checks use it."""

    def __init__(self) -> None:
        self._folds: dict[int, dict[str, list]] = {}
        self._errors: dict[int, dict[str, list]] = {}

    def load(
        self, model: onnx.ModelProto | str | os.PathLike, *, provider: str = CPU, basic: bool = False, threads: int = 0,
        data_folder: str | os.PathLike | None = None, prepack: bool = True, disabled: Sequence[str] = (),
        chained: bool = False,
    ) -> Session:
        ort = runtime.onnxruntime("run the model")
        check_provider(provider)
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
        folder = os.path.abspath(data_folder) if data_folder is not None else None
        options = runner_child.session_options(
            ort, basic=basic, threads=threads, data_folder=folder, prepack=prepack, chained=chained
        )
        try:
            session = ort.InferenceSession(
                source, options, providers=[provider], disabled_optimizers=list(disabled) or None
            )
        except Exception as exc:
            error = ModelUnsupportedError if runner_child.error_kind(exc) == "unsupported" else ModelRefusedError
            raise error(f"onnxruntime could not load the model: {runner_child.first_line(exc)}") from exc
        return _LocalSession(session, runner_child.run_options(ort))

    def fold(self, sessions: list[Session], feeds: Mapping[str, np.ndarray], key: int) -> None:
        ort = runtime.onnxruntime("run the model")
        chain = [s._session for s in sessions if isinstance(s, _LocalSession)]
        if len(chain) != len(sessions):
            raise ValueError("fold runs sessions of this runner only")
        try:
            stats = self._folds.setdefault(key, {})
            runner_child.run_chain(np, chain, dict(feeds), runner_child.run_options(ort), stats)
        except Exception as exc:  # onnxruntime's own exception types
            raise ModelRunError(f"onnxruntime could not run the model: {runner_child.first_line(exc)}") from exc

    def statistics(self, key: int) -> dict[str, list[float]]:
        return self._folds.pop(key, {})

    def compare(
        self, reference: Sequence[Session], converted: Sequence[Session], feeds: Mapping[str, np.ndarray],
        pairs: Sequence[tuple[str, str]], outputs: Sequence[tuple[str, str]], key: int,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        ort = runtime.onnxruntime("run the model")
        ref_chain = [s._session for s in reference if isinstance(s, _LocalSession)]
        conv_chain = [s._session for s in converted if isinstance(s, _LocalSession)]
        if len(ref_chain) != len(reference) or len(conv_chain) != len(converted):
            raise ValueError("compare runs sessions of this runner only")
        ref_names, conv_names, half = compare_feeds(reference, converted, feeds)
        both = runner_child.compare_inputs(np, feeds, ref_names, conv_names, half)
        try:
            kept = runner_child.compare_chains(np, ref_chain, conv_chain, both, [list(p) for p in pairs],
                                               [list(p) for p in outputs], runner_child.run_options(ort),
                                               self._errors.setdefault(key, {}))
        except Exception as exc:  # onnxruntime's own exception types
            raise ModelRunError(f"onnxruntime could not run the model: {runner_child.first_line(exc)}") from exc
        return kept[: len(outputs)], kept[len(outputs):]

    def errors(self, key: int) -> dict[str, list[float]]:
        return self._errors.pop(key, {})
