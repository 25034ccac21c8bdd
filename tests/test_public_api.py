"""The public API says what it is: the names users need are importable from the package root."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

import amp_compiler

PUBLIC = {
    "convert", "ConvertOptions", "ConversionResult", "NodeDecision", "Target", "Provider", "AmpUserError",
    "analyze", "Analysis", "refine", "Refinement", "compare_models", "Comparison", "emulate", "emulate_bf16",
    "collect_ranges", "load_samples", "Runner", "ChildRunner", "InProcessRunner", "RunBudget", "PrecisionReport",
    "undecided_values",
}


def test_the_documented_names_are_the_public_ones():
    assert set(amp_compiler.__all__) == PUBLIC and len(amp_compiler.__all__) == len(PUBLIC)
    assert set(amp_compiler._PUBLIC) == PUBLIC  # where each is imported from, on first use


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_every_public_name_resolves_from_the_package_root(name):
    value = getattr(amp_compiler, name)
    assert not isinstance(value, type(amp_compiler)), f"amp_compiler.{name} is a module"
    assert value.__name__ == name and value.__module__.startswith("amp_compiler.")
    namespace: dict = {}
    exec(f"from amp_compiler import {name}", namespace)
    assert namespace[name] is value
    assert name in dir(amp_compiler)


def test_no_module_at_the_root_is_named_like_a_public_name():
    """A submodule of that name would replace the function on the package once it is imported."""
    assert not [n for n in PUBLIC if importlib.util.find_spec(f"amp_compiler.{n}") is not None]
    importlib.import_module("amp_compiler.analysis")  # the module behind analyze, imported by the CLI
    assert callable(amp_compiler.analyze) and amp_compiler.analyze.__module__ == "amp_compiler.analysis"


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        amp_compiler.no_such_name  # noqa: B018
