"""pyproject.toml declares what the code imports: every third-party import of the installed
packages is a runtime dependency, every runtime dependency is imported (or kept for a stated
install reason), and tests/ and benchmarks/ need nothing beyond their extras."""
from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("funnelrag", "flows", "tasks", "models", "data_contracts", "infra")
# Declared but never imported: pins that steer what pip resolves for another dependency.
INSTALL_PINS = {
    "fastapi",  # prefect 3.8's API server
    "sqlalchemy",  # 2.1 breaks prefect 3.8's scheduler
}


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def _names(requirements: list[str]) -> set[str]:
    return {_normalise(re.match(r"[A-Za-z0-9._-]+", r).group()) for r in requirements}


@cache
def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared(*extras: str) -> set[str]:
    names = _names(_project()["dependencies"])
    for extra in extras:
        names |= _names(_project()["optional-dependencies"][extra])
    return names


@cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@cache
def third_party_imports(*dirs: str) -> dict[str, set[str]]:
    """Top-level module name -> files importing it (function-level imports included), for every
    absolute import under ``dirs`` that is neither stdlib nor first-party (a package of this
    repository, or a sibling module such as ``tests/conftest.py``)."""
    first_party = set(LIBRARY) | {"tests", "benchmarks"}
    found: dict[str, set[str]] = {}
    for d in dirs:
        files = sorted((ROOT / d).rglob("*.py"))
        local = {f.stem for f in files}
        for f in files:
            for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top in sys.stdlib_module_names or top in first_party | local or top == "__future__":
                        continue
                    found.setdefault(top, set()).add(str(f.relative_to(ROOT)))
    return found


def _undeclared(imports: dict[str, set[str]], declared: set[str]) -> dict[str, str]:
    """Import name -> why it is not covered by ``declared``."""
    dists = _distributions()
    missing = {}
    for module, files in sorted(imports.items()):
        providers = {_normalise(d) for d in dists.get(module, [])}
        if not providers:
            missing[module] = f"no installed distribution provides it (imported by {sorted(files)})"
        elif not providers & declared:
            missing[module] = f"declare one of {sorted(providers)} (imported by {sorted(files)})"
    return missing


def test_requires_python_matches_the_interpreter_features_used():
    # The ingest cleaner's regexes use possessive quantifiers (``*+``, ``++``): re has them
    # from 3.11 on; on 3.10 ``re.compile`` raises "multiple repeat" at import.
    assert _project()["requires-python"] == ">=3.11"
    assert sys.version_info >= (3, 11)


def test_every_library_import_is_a_runtime_dependency():
    assert _undeclared(third_party_imports(*LIBRARY), _declared()) == {}


def test_every_runtime_dependency_is_imported_or_an_install_pin():
    dists = _distributions()
    imported = {_normalise(d) for module in third_party_imports(*LIBRARY) for d in dists.get(module, [])}
    unused = _declared() - imported - INSTALL_PINS
    assert unused == set(), f"runtime dependencies nothing in {LIBRARY} imports: move them to an extra"


@pytest.mark.parametrize(("directory", "extra"), [("tests", "dev"), ("benchmarks", "bench")])
def test_tests_and_benchmarks_need_only_their_extra(directory, extra):
    assert _undeclared(third_party_imports(directory), _declared(extra)) == {}
