"""``funnelrag search``: passage text, and the corpora that exist when the asked one does not."""
from __future__ import annotations

import json

import pytest

from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
from funnelrag.cli import main


@pytest.fixture
def tiny_corpus(prefect_harness, workspace_home, data_mirror, tmp_path):
    src = tmp_path / "tiny.jsonl"
    rows = [{"title": "Darwin", "text": "Charles Darwin wrote On the Origin of Species in 1859. " * 20, "links": ["Finch"]},
            {"title": "Finch", "text": "Finches are small passerine birds of the Galapagos. " * 20, "links": ["Darwin"]}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    summary = corpus_build_flow(CorpusBuildConfig.model_validate({
        "name": "tiny", "source": {"datasets": [], "paths": [str(src)]}, "ingest": {"format": "jsonl"},
        "clustering": {"tokenizer": "whitespace"}, "segment": {"tokenizer": "whitespace"}, "gate": {"enabled": False},
        "workspace": {"home": workspace_home, "data_mirror": data_mirror}}))
    return workspace_home, summary["version"]


def test_search_prints_clusters_and_passage_text(tiny_corpus, capsys):
    home, version = tiny_corpus
    assert main(["search", "who wrote the origin of species", "--home", str(home), "--corpus", "tiny"]) == 0
    out = capsys.readouterr().out
    assert f"corpus tiny version {version}" in out and "top 3 passages:" in out
    assert "Darwin [" in out and "Charles Darwin wrote On the Origin of Species in 1859." in out


def test_search_lists_existing_corpora_when_the_default_is_absent(tiny_corpus, capsys):
    home, version = tiny_corpus
    assert main(["search", "darwin", "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert "no published corpus 'wikispeedia'" in err and f"tiny (current {version})" in err
    assert "Traceback" not in err
