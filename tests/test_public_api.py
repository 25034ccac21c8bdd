"""The public API says what it is: the names users need are importable from the package root, and
every module declares the names it offers (``__all__``)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pkgutil
from pathlib import Path

import pytest

import amp_compiler
from tests.support import REPO_ROOT

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


# ------------------------------------------------------------------------------------------- __all__
def _modules() -> list[str]:
    import amp_compiler.passes

    names = [m.name for m in pkgutil.walk_packages(amp_compiler.__path__, "amp_compiler.")]
    names += [m.name for m in pkgutil.walk_packages(amp_compiler.passes.__path__, "amp_compiler.passes.")]
    return sorted({
        n for n in ["amp_compiler", "amp_compiler.passes", *names]
        if not any(part.startswith("_") for part in n.split("."))
    })


MODULES = _modules()


def _offers_names(module) -> bool:
    """A module offers names unless it is a package whose namespace holds only its submodules."""
    if not hasattr(module, "__path__"):
        return True
    return any(
        not name.startswith("_") and not isinstance(value, type(amp_compiler))
        for name, value in vars(module).items() if name != "annotations"
    )


@pytest.mark.parametrize("name", MODULES)
def test_every_public_module_declares_its_names(name):
    module = importlib.import_module(name)
    if not _offers_names(module):
        return
    names = getattr(module, "__all__", None)
    assert isinstance(names, list) and names, f"{name} has no __all__"
    assert len(set(names)) == len(names), f"{name}: __all__ lists a name twice"
    assert not [n for n in names if not hasattr(module, n)], f"{name}: __all__ names what it does not define"
    assert not [n for n in names if n.startswith("_")], f"{name}: __all__ lists private names"


def test_what_the_package_imports_from_a_module_is_in_its_all():
    """Inside the package, ``from amp_compiler.X import name`` takes only what X declares (or a submodule)."""
    missing = []
    for path in [*(REPO_ROOT / "amp_compiler").rglob("*.py"), *(REPO_ROOT / "passes").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("amp_compiler"):
                continue
            if node.module not in MODULES:
                continue
            module = importlib.import_module(node.module)
            declared = set(getattr(module, "__all__", ()))
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if alias.name.startswith("_") or alias.name in declared:
                    continue
                if hasattr(module, "__path__") and importlib.util.find_spec(sub) is not None:
                    continue
                missing.append(f"{Path(path).relative_to(REPO_ROOT)}: {alias.name} from {node.module}")
    assert not missing, missing


def test_one_class_of_each_name():
    """Two public classes of one name in two modules (two OutputAccuracy, two NodeError) are two
    definitions of one thing, or two things that need two names."""
    homes: dict[str, list[str]] = {}
    for name in MODULES:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == name and not attr.startswith("_"):
                homes.setdefault(attr, []).append(name)
    assert not {cls: where for cls, where in homes.items() if len(where) > 1}
