"""ARCHITECTURE.md names only things that exist (every path, every ``path:function``, every
module-level ``path:CONSTANT``), and the layers it describes hold (the import-linter contract in
pyproject.toml)."""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "ARCHITECTURE.md").read_text()
# `tasks/funnel/labels.py:document_score`, `flows/`, `configs/`, `README.md`, `prefect.yaml`
REF = re.compile(r"`((?:[\w.-]+/)*[\w.-]+(?:\.(?:py|md|yaml)|/))(?::(\w+))?`")


def _refs() -> list[tuple[str, str | None]]:
    return [(m.group(1), m.group(2)) for m in REF.finditer(DOC)]


def test_the_document_names_the_layers_and_equations():
    refs = _refs()
    assert len(refs) > 40 and sum(name is not None for _, name in refs) > 20
    for eq in ("Algorithm 1", "Eq. 3", "Eq. 4", "Eq. 5", "Eq. 6", "Eqs. 10–12", "Eq. 9"):
        assert eq in DOC


def test_every_named_path_and_function_exists():
    missing = []
    for path, name in _refs():
        target = ROOT / path
        if not target.exists():
            missing.append(path)
        elif name and not re.search(rf"^(?:\s*(?:async\s+)?(?:def|class) {name}\b|{name}\s*(?::[^=\n]+)?=)",
                                    target.read_text(), re.MULTILINE):
            missing.append(f"{path}:{name}")
    assert not missing, f"ARCHITECTURE.md names what does not exist: {missing}"


# ---------------------------------------------------------------------------- the layers contract
LINT = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
PACKAGES = ("funnelrag", "flows", "tasks", "models", "data_contracts", "infra")


def _copy_sources(dest: Path) -> None:
    """A copy of every layered package's sources under ``dest`` (to plant a bad import in)."""
    for name in PACKAGES:
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.yaml", "*.json"))


def _lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the checkout at ``root`` (its pyproject contract, its own sources)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)


def test_layers_contract_is_kept():
    """``[tool.importlinter]`` in pyproject.toml: every layer imports only the layers below it."""
    out = _lint_imports(ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Layers import downward only KEPT" in out.stdout


def test_layers_contract_breaks_on_an_upward_import(tmp_path):
    """The same contract on a copy of the sources with one deferred upward import (the platform's
    stage plumbing reaching into a stage package, as it once did) fails and names it."""
    _copy_sources(tmp_path)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    stages = tmp_path / "funnelrag" / "stages.py"
    stages.write_text(stages.read_text() + "\n\ndef _upward():\n    from tasks.sources.ingest import IngestError\n")
    out = _lint_imports(tmp_path)
    assert out.returncode != 0 and "funnelrag.stages is not allowed to import tasks.sources" in out.stdout, out.stdout


def test_paper_stages_contract_breaks_on_a_shard_import(tmp_path):
    """The paper's corpus stages may not import the machinery that runs them in shards: a deferred
    import of the memo planted in the segmentation stage fails the contract and is named."""
    _copy_sources(tmp_path)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    segment = tmp_path / "tasks" / "corpus" / "segment.py"
    segment.write_text(segment.read_text() + "\n\ndef _machinery():\n    from funnelrag.content_store import text_key\n")
    out = _lint_imports(tmp_path)
    assert out.returncode != 0 and "tasks.corpus.segment is not allowed to import funnelrag.content_store" in out.stdout, out.stdout


def test_layers_table_is_the_contract():
    """The first column of ARCHITECTURE.md's layers table is the contract's layers, in order."""
    import tomllib

    contract = next(c for c in tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
                    if c["type"] == "layers")
    section = DOC.split("## Layers", 1)[1].split("\n## ", 1)[0]
    table = [m.group(1).replace("\\|", "|") for m in re.finditer(r"^\| `((?:[^`])+)` \|", section, re.MULTILINE)]
    assert table == contract["layers"]


def _first_party_imports(root: Path) -> "nx.DiGraph":
    """Module → first-party module it imports (module-level and function-level imports alike,
    ``from a.b import c`` meaning the module ``a.b.c`` where one exists, else ``a.b``)."""
    files = {}
    for name in PACKAGES:
        for f in (root / name).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = nx.DiGraph()
    for mod, f in files.items():
        graph.add_node(mod)
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files else node.module
                         for a in node.names]
            else:
                continue
            for target in names:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != mod:
                    graph.add_edge(mod, target)
    return graph


def test_no_module_imports_itself_back_even_through_a_deferred_import():
    """No import cycle between our modules, counting function-level imports: a deferred import
    may only defer a heavy module, never hide a cycle (import-linter sees cycles across layers,
    not between two modules of one package)."""
    cycles = list(nx.simple_cycles(_first_party_imports(ROOT)))
    assert cycles == [], f"import cycles: {cycles}"


def test_the_cycle_check_finds_a_deferred_cycle(tmp_path):
    """A function-level import back into a module's importer is reported as a cycle."""
    _copy_sources(tmp_path)
    shards = tmp_path / "tasks" / "sources" / "ingest" / "shards.py"
    shards.write_text(shards.read_text() + "\n\ndef _back():\n    from tasks.sources.ingest.run import ingest\n")
    cycles = list(nx.simple_cycles(_first_party_imports(tmp_path)))
    assert any({"tasks.sources.ingest.shards", "tasks.sources.ingest.run"} <= set(c) for c in cycles), cycles
