"""ARCHITECTURE.md names only things that exist: every path, and every ``path:function``."""
from __future__ import annotations

import re
from pathlib import Path

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
        elif name and not re.search(rf"^\s*(?:def|class) {name}\b", target.read_text(), re.MULTILINE):
            missing.append(f"{path}:{name}")
    assert not missing, f"ARCHITECTURE.md names what does not exist: {missing}"
