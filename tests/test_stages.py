"""The shared flow plumbing: stage declarations, the cached stage run, input data sources."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from funnelrag.errors import BadInput
from funnelrag.stages import DataSource, hash_path, input_digests, retry_transient, run_cached, stage, stage_of
from funnelrag.store import StageCache
from tasks.corpus import stages as corpus
from tasks.sources.ingest import IngestError
from tasks.dr_rag import stages as dr_rag
from tasks.funnel import stages as funnel
from tasks.r2ag import stages as r2ag


@stage("toy", version="3")
def _toy(out: Path, text: str) -> dict:
    (out / "toy.txt").write_text(text)
    return {"chars": len(text)}


def test_run_cached_builds_once_then_hits(tmp_path):
    cache = StageCache(tmp_path)
    calls = []

    def build(out: Path, key: str) -> dict:
        calls.append(key)
        return _toy(out, "abc")

    first = run_cached(cache, _toy, {"n": 1}, {"data": "d1"}, build)
    again = run_cached(cache, _toy, {"n": 1}, {"data": "d1"}, build)
    other = run_cached(cache, _toy, {"n": 1}, {"data": "d2"}, build)
    assert (first.cache_hit, again.cache_hit, other.cache_hit) == (False, True, False)
    assert len(calls) == 2 and first.path == again.path == tmp_path / "toy" / calls[0]
    assert (first.path / "toy.txt").read_text() == "abc" and again.summary == {"chars": 3}


def test_declared_key_is_the_store_key():
    """Keys are the store's key over (name, version, config, inputs): moving the version from
    the flows to the stage code must not invalidate existing caches."""
    spec = stage_of(_toy)
    assert (spec.name, spec.version) == ("toy", "3")
    assert spec.key({"n": 1}, {"a": "x"}) == StageCache.key("toy", "3", {"n": 1}, {"a": "x"})
    assert spec.key({"n": 1}, {"a": "x"}) != StageCache.key("toy", "4", {"n": 1}, {"a": "x"})


def test_undeclared_function_is_refused(tmp_path):
    with pytest.raises(TypeError, match="not declared"):
        run_cached(StageCache(tmp_path), lambda out: {}, {}, {}, lambda out, key: {})


@pytest.mark.parametrize(("core", "name", "version"), [
    (corpus.run_ingest, "ingest", "1"), (corpus.run_tokens, "tokens", "1"), (corpus.run_cluster, "cluster", "1"),
    (corpus.run_segment, "segment", "1"), (corpus.run_index, "index", "2"),
    (funnel.run_questions, "questions", "1"), (funnel.run_candidates, "candidates", "1"),
    (funnel.run_reader, "reader", "1"), (funnel.run_reader_eval, "reader_eval", "1"),
    (funnel.run_attention, "attention", "1"), (funnel.run_labels, "labels", "1"),
    (funnel.run_distill, "distill", "1"), (funnel.run_eval, "eval", "1"),
    (dr_rag.run_collection, "collection", "1"), (dr_rag.run_embeddings, "embeddings", "1"),
    (dr_rag.run_rankings, "rankings", "1"), (dr_rag.run_pairs, "pairs", "2"),
    (r2ag.build_lists_and_features, "r2ag-features", "1"),
])
def test_every_cached_stage_declares_its_cache_name(core, name, version):
    """Cache directory names are part of the workspace layout; a version may only go up."""
    spec = stage_of(core)
    assert spec.name == name and int(spec.version) >= int(version)


def test_data_source_resolves_paths_with_digests(tmp_path):
    f = tmp_path / "q.tsv"
    f.write_bytes(b"who?\t['me']\n")
    files = DataSource(paths=[f]).resolve(None, None)
    assert files == [(f, hashlib.sha256(f.read_bytes()).hexdigest())]
    assert input_digests(files) == {"input0:q.tsv": files[0][1]}
    with pytest.raises(FileNotFoundError, match="questions.paths: .*missing.tsv"):
        DataSource(paths=[tmp_path / "missing.tsv"]).resolve(None, None, "questions.paths")
    with pytest.raises(FileNotFoundError, match="data.path"):
        hash_path(tmp_path / "nope", "data.path")


def test_data_source_resolves_registered_sets_in_the_mirror(data_mirror):
    from funnelrag.datasets import REGISTRY

    ((path, sha),) = DataSource(datasets=["nq-open-dev"]).resolve(data_mirror, None)
    assert path.is_file() and sha == REGISTRY["nq-open-dev"].sha256
    with pytest.raises(KeyError):
        DataSource(datasets=["no-such-set"]).resolve(data_mirror, None)


class _Failed:
    """A Prefect task state whose result raises ``exc``."""

    def __init__(self, exc: Exception):
        self.exc = exc

    def result(self):
        raise self.exc


def test_bad_input_is_never_retried_other_failures_are():
    """The platform knows stage input errors only through its own base class (an ingest error
    is a :class:`funnelrag.errors.BadInput`), so it needs no import of a stage package."""
    assert issubclass(IngestError, BadInput) and issubclass(IngestError, RuntimeError)
    for exc in (IngestError("dump.xml.bz2: truncated"), BadInput("empty file"), ValueError("bad config")):
        assert retry_transient(None, None, _Failed(exc)) is False
    assert retry_transient(None, None, _Failed(OSError("disk full"))) is True
