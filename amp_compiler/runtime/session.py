"""What running a model means here: :class:`Session` and :class:`Runner`, the interface that the
child-process runner and the in-process runner (:mod:`amp_compiler.runtime.runner`) share."""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from amp_compiler.runtime import child as runner_child

__all__ = ["CPU", "Runner", "Session", "check_provider", "compare_feeds"]


#: onnxruntime's CPU execution provider, where models run unless a load asks for another.
CPU = runner_child.PROVIDERS[0]


class Session(abc.ABC):
    """One loaded model: its inputs' names and onnxruntime types (``tensor(float16)``), its outputs'
    names, and the execution providers onnxruntime started for it (the first one runs most ops)."""

    input_names: list[str]
    input_types: list[str]
    output_names: list[str]
    providers: list[str]

    def _set_facts(self, facts: Mapping[str, list[str]]) -> None:
        self.input_names, self.input_types = list(facts["inputs"]), list(facts["input_types"])
        self.output_names, self.providers = list(facts["outputs"]), list(facts["providers"])

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        """The graph outputs, in order, for ``feeds`` (entries that are not inputs of the model are ignored)."""
        return self._run({k: np.asarray(v) for k, v in feeds.items() if k in self.input_names})

    @abc.abstractmethod
    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    def close(self) -> None:  # noqa: B027 - nothing to free by default
        """Free the session."""


class Runner(abc.ABC):
    """Loads models into onnxruntime sessions; a context manager that frees them on exit."""

    onnxruntime_version = ""  # the version of the onnxruntime that loads the models, once known

    @abc.abstractmethod
    def load(
        self, model: onnx.ModelProto | str | os.PathLike, *, provider: str = CPU, basic: bool = False, threads: int = 0,
        data_folder: str | os.PathLike | None = None, prepack: bool = True, disabled: Sequence[str] = (),
        chained: bool = False,
    ) -> Session:
        """A session of ``model`` (a ModelProto, or a model file whose external data lies beside it)
        on the execution ``provider`` (one of :data:`runner_child.PROVIDERS`; onnxruntime falls back
        to the CPU when it cannot start it: see :attr:`Session.providers`); ``basic``: onnxruntime's
        basic graph optimisations only (:func:`runner_child.session_options`); ``threads``: its
        thread pool's size (0: onnxruntime's default, one per core); ``data_folder``: where the
        external data of a ModelProto lies (onnxruntime reads it from there); ``prepack``: False skips
        the kernels' weight prepacking (a session only created, never run, need not pay for it);
        ``disabled``: onnxruntime graph optimizers not to run (``MatmulTransposeFusion``); ``chained``: one
        session of a chain that :meth:`fold` runs (:func:`runner_child.session_options`)."""

    def load_chain(
        self, models: Iterable[onnx.ModelProto], *, basic: bool = False, chained: bool = False,
        data_folder: str | os.PathLike | None = None, prepack: bool = True,
    ) -> list[Session]:
        """The sessions of ``models`` (taken one at a time), as :meth:`load` with ``basic``, ``chained``,
        ``data_folder`` and ``prepack`` makes them, in order; where one fails, those made are closed."""
        sessions: list[Session] = []
        try:
            for model in models:
                sessions.append(
                    self.load(model, basic=basic, chained=chained, data_folder=data_folder, prepack=prepack))
        except BaseException:
            for session in sessions:
                session.close()
            raise
        return sessions

    @abc.abstractmethod
    def fold(self, sessions: list[Session], feeds: Mapping[str, np.ndarray], key: int) -> None:
        """Run the chain ``sessions`` (this runner's) on ``feeds`` where they run and fold their float
        outputs into the running statistics ``key`` (:func:`runner_child.run_chain`, which folds one
        session's outputs while the next runs): no tensor comes back."""

    @abc.abstractmethod
    def statistics(self, key: int) -> dict[str, list[float]]:
        """The running statistics ``key`` (per tensor, :data:`child_folds.STAT_FIELDS`), then forgotten."""

    @abc.abstractmethod
    def compare(
        self, reference: Sequence[Session], converted: Sequence[Session], feeds: Mapping[str, np.ndarray],
        pairs: Sequence[tuple[str, str]], outputs: Sequence[tuple[str, str]], key: int,
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Run the chains ``reference`` and ``converted`` (this runner's sessions, each a model's pieces
        or a model alone) on ``feeds`` where they run (a float feed that ``converted`` takes in FP16 is
        rounded to it) and add each float pair of ``pairs`` (reference tensor, converted tensor) to the
        running error sums ``key`` (per reference tensor, :data:`child_folds.ERROR_FIELDS`: :meth:`errors`),
        each as soon as both halves are out; only the pairs ``outputs`` come back: their reference values
        and their converted values (:func:`runner_child.compare_chains`)."""

    @abc.abstractmethod
    def errors(self, key: int) -> dict[str, list[float]]:
        """The running error sums ``key`` (per tensor, :data:`child_folds.ERROR_FIELDS`), then forgotten."""

    def close(self) -> None:  # noqa: B027 - nothing to free by default
        """Free every session (a child process is stopped)."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close()


def compare_feeds(
    reference: Sequence[Session], converted: Sequence[Session], feeds: Mapping[str, np.ndarray]
) -> tuple[list[str], list[str], list[str]]:
    """The names of ``feeds`` that the chains ``reference`` and ``converted`` take, and the float ones that
    ``converted`` takes in FP16 (a model converted without keeping its I/O types)."""
    half = list(dict.fromkeys(n for s in converted for n, t in zip(s.input_names, s.input_types, strict=True)
                              if t == "tensor(float16)" and n in feeds and np.asarray(feeds[n]).dtype.kind == "f"))
    ref_inputs = {n for s in reference for n in s.input_names}
    conv_inputs = {n for s in converted for n in s.input_names}
    return [n for n in feeds if n in ref_inputs], [n for n in feeds if n in conv_inputs], half


def check_provider(provider: str) -> None:
    if provider not in runner_child.PROVIDERS:
        raise ValueError(f"unknown execution provider {provider!r}")
