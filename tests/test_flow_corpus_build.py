"""The corpus-build flow on the real samples under the Prefect harness."""
import ast
import json
from pathlib import Path

import mlflow
import pyarrow.parquet as pq
import pytest

from flows.corpus_build import CorpusBuildConfig, corpus_build_flow, enwiki_sample_config
from funnelrag.config import load_config
from funnelrag.workspace import Workspace
from tasks.corpus import stages as corpus_stages
from tasks.corpus.published import corpus_store, open_corpus

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _ws(home, mirror):
    return {"home": home, "data_mirror": mirror}


def _manifest(version_dir):
    return json.loads((version_dir / "manifest.json").read_text())


def test_enwiki_sample_builds_publishes_and_reuses_cache(prefect_harness, workspace_home, data_mirror, monkeypatch):
    import flows.corpus_build

    events = []
    real_emit = flows.corpus_build.emit_event
    monkeypatch.setattr(flows.corpus_build, "emit_event", lambda **kw: (events.append(kw), real_emit(**kw))[1])
    cfg = enwiki_sample_config(workspace=_ws(workspace_home, data_mirror))
    first = corpus_build_flow(cfg)
    assert not first["unchanged"] and [e["event"] for e in events] == ["funnelrag.corpus.current"]
    ws = Workspace(workspace_home)
    corpus = open_corpus(ws, "enwiki-sample")
    assert corpus.version == first["version"]
    docs = corpus.documents
    assert first["counts"]["documents"] == docs.num_rows > 50
    report = pq.read_table(corpus.path / "ingest_report.parquet")
    assert report.num_rows == 206  # every page of the real sample is accounted for
    assert set(report.column("status").to_pylist()) >= {"kept", "redirect"}
    assert corpus.cluster_members.num_rows == docs.num_rows
    assert first["counts"]["passages"] == corpus.passages.num_rows > docs.num_rows
    assert not any(v["cache_hit"] for k, v in first["stages"].items() if k != "publish")
    cache = ws.cache_dir / "corpus"   # the documents split by shard, shared by segment and index, is gone
    assert not list(cache.glob(".tmp-*-split-*")) and not list(cache.rglob(".tmp-*-documents-by-shard-*"))

    # MLflow: one run with config params, per-stage seconds, and the artifacts
    client = mlflow.tracking.MlflowClient(f"sqlite:///{workspace_home / 'mlflow.db'}")
    run = client.get_run(first["mlflow_run_id"])
    assert run.data.params["clustering.max_tokens"] == "4096"  # the paper S for dumps
    assert run.data.metrics["count_documents"] == docs.num_rows and "seconds_ingest" in run.data.metrics
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"manifest.json", "ingest_report.parquet", "cluster_sizes.png"} <= names

    # a re-run reuses every stage; its content equals current's, so it publishes nothing new,
    # moves nothing and emits no corpus.current event
    manifest_before = (ws.store_dir("corpus/enwiki-sample") / "versions" / first["version"] / "manifest.json").read_bytes()
    second = corpus_build_flow(cfg)
    assert all(v["cache_hit"] for k, v in second["stages"].items() if k != "publish")
    assert second["unchanged"] and second["version"] == first["version"]
    assert corpus_store(ws, "enwiki-sample").versions() == [first["version"]]
    assert corpus_store(ws, "enwiki-sample").current_version() == first["version"]
    assert (ws.store_dir("corpus/enwiki-sample") / "versions" / first["version"] / "manifest.json").read_bytes() \
        == manifest_before
    assert len(events) == 1
    assert client.get_run(second["mlflow_run_id"]).data.tags["corpus_unchanged"] == "true"


def test_failed_validation_leaves_current_untouched(prefect_harness, workspace_home, data_mirror, monkeypatch):
    cfg = enwiki_sample_config(workspace=_ws(workspace_home, data_mirror))
    good = corpus_build_flow(cfg)
    store = corpus_store(Workspace(workspace_home), "enwiki-sample")

    def broken(version_dir, max_tokens):
        raise ValueError("clusters: injected validation failure")
    monkeypatch.setattr(corpus_stages, "validate_corpus", broken)
    # other content (shorter passages): an unchanged rebuild would publish nothing and validate nothing
    other = enwiki_sample_config(workspace=_ws(workspace_home, data_mirror), segment={"passage_words": 80})
    with pytest.raises(Exception, match="injected validation failure"):
        corpus_build_flow(other)
    assert store.current_version() == good["version"] and store.versions() == [good["version"]]
    store.verify()


def test_changed_input_content_at_same_path_rebuilds(prefect_harness, workspace_home, data_mirror, tmp_path):
    """Prefect's INPUTS caching of a Path returns stale results; our cache keys on content."""
    src = tmp_path / "corpus.jsonl"
    rows = [{"title": "Alpha", "text": "Alpha links to beta. " * 30, "links": ["Beta"]},
            {"title": "Beta", "text": "Beta is a letter. " * 30, "links": ["Alpha"]}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = CorpusBuildConfig.model_validate({
        "name": "tiny", "source": {"datasets": [], "paths": [str(src)]}, "ingest": {"format": "jsonl"},
        "clustering": {"tokenizer": "whitespace"}, "segment": {"tokenizer": "whitespace"},
        "workspace": _ws(workspace_home, data_mirror)})
    first = corpus_build_flow(cfg)
    assert first["counts"]["documents"] == 2 and first["counts"]["clusters"] == 1
    rows.append({"title": "Gamma", "text": "Gamma stands alone. " * 10})
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    second = corpus_build_flow(cfg)
    assert not second["stages"]["ingest"]["cache_hit"]
    assert second["counts"]["documents"] == 3 and second["counts"]["clusters"] == 2


def test_sharded_passage_index_searches_like_one_index(prefect_harness, workspace_home, data_mirror):
    """``index.passage_shard_tokens: 250000`` (~4 shards) publishes shards that answer 20 real NQ questions with the ids
    and scores of the one-index build, and the quality gate's figures are the same."""
    from same_search import assert_same_search  # noqa: PLC0415

    from tasks.corpus.gate import version_figures  # noqa: PLC0415
    from tasks.corpus.index import BM25Index  # noqa: PLC0415
    from tasks.corpus.sharded.sharded_index import ShardedBM25  # noqa: PLC0415

    ws = Workspace(workspace_home)
    one = corpus_build_flow(enwiki_sample_config(workspace=_ws(workspace_home, data_mirror)))
    three = corpus_build_flow(enwiki_sample_config(workspace=_ws(workspace_home, data_mirror),
                                                   index={"passage_shard_tokens": 250_000}))
    assert not three["stages"]["index"]["cache_hit"] and three["stages"]["segment"]["cache_hit"]
    n = three["shards"]["passage_token_shards"]["built"]
    assert n > 2 and three["shards"]["passage_token_shards"] == three["shards"]["passage_index_shards"] == {"built": n, "reused": 0}
    single, sharded = (open_corpus(ws, "enwiki-sample", s["version"]) for s in (one, three))
    assert (sharded.path / "index/passages.bm25/shards.json").exists()
    assert sorted(p.name for p in (sharded.path / "index/passages.bm25").iterdir()) == [
        "global_stats.json", *(f"shard-{k:05d}" for k in range(n)), "shards.json"]
    assert isinstance(single.passage_index(), BM25Index) and isinstance(sharded.passage_index(), ShardedBM25)
    lines = (data_mirror / "nq-open" / "nq-open-dev.tsv").read_text().splitlines()[:20]
    questions = [line.split("\t")[0] for line in lines]
    assert_same_search(single.passage_index(), sharded.passage_index(), questions, ks=(1, 10, 100))
    qa = [(line.split("\t")[0], ast.literal_eval(line.split("\t")[1])) for line in lines]
    a, b = (version_figures(c.path, qa, 20) for c in (single, sharded))
    assert (a.answer_recall, a.documents, a.pages) == (b.answer_recall, b.documents, b.pages)
    assert _manifest(sharded.path)["content_digest"] != _manifest(single.path)["content_digest"]


# docs/results/corpus-build.md "The real samples": documents, links, clusters, units, passages of both real samples with
# the shipped configs, and the content digest (sha256 over every published file). A change means
# the published corpus changed: if intended, bump the stage version (``@stage`` in
# tasks/corpus/stages.py) and update these figures and docs/results/corpus-build.md.
FIGURES = {
    "wikispeedia": {"config": "corpus_wikispeedia.yaml", "docs_per_shard": 1_000, "tokens_per_shard": 2_000_000, "documents": 4_598, "links": 119_879, "clusters": 1_573,
                    "document_units": 23_397, "passages": 146_402, "max_cluster_tokens": 25_793,
                    "content_digest": "7e2efd3b4f2b4107186cecf47d0ec05f468c19be3e0d54f4a24a2e083615b638"},
    "enwiki-sample": {"config": "corpus_enwiki_sample.yaml", "docs_per_shard": 25, "tokens_per_shard": 100_000, "documents": 98, "links": 93, "clusters": 98,
                      "document_units": 757, "passages": 4_568, "max_cluster_tokens": 21_999,
                      "content_digest": "56f60bb2fff39994b1a32392906e8c4bd5fc42beb3a25941cfecf738b23ce57a"},
}


@pytest.fixture(scope="module")
def shipped_builds(prefect_harness, data_mirror, tmp_path_factory) -> Workspace:
    """Both real samples built once, with the shipped ``configs/corpus_*.yaml``, into one workspace;
    shards of ``docs_per_shard`` documents and ``tokens_per_shard`` tokens (no artifact byte depends on them), so the pinned digests
    also say that several token, segment and cluster-index shards give the one-process bytes."""
    home = tmp_path_factory.mktemp("shipped-corpora")
    for name, fig in FIGURES.items():
        cfg = load_config(CorpusBuildConfig, CONFIGS / fig["config"],
                          [f"workspace.home={home}", f"workspace.data_mirror={data_mirror}",
                           f"runner.docs_per_shard={fig['docs_per_shard']}",
                           f"runner.tokens_per_shard={fig['tokens_per_shard']}"])
        assert cfg.name == name and corpus_build_flow(cfg)["corpus"] == name
    return Workspace(home)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FIGURES))
def test_corpus_figures_match_the_readme(shipped_builds, name):
    fig, manifest = FIGURES[name], open_corpus(shipped_builds, name).manifest
    for key in ("documents", "links", "clusters", "document_units", "passages", "max_cluster_tokens"):
        assert manifest["counts"][key] == fig[key], f"{name}: {key} {manifest['counts'][key]:,} != README {fig[key]:,}"
    assert manifest["content_digest"] == fig["content_digest"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FIGURES))
def test_cluster_index_is_the_one_process_index(shipped_builds, name, tmp_path):
    """The published cluster index (tokenized in cluster-range shards, vocabularies merged) has
    the bytes of one ``BM25Index.build`` over all cluster texts of the published tables."""
    from data_contracts.base import sha256_file  # noqa: PLC0415
    from tasks.corpus.index import BM25Config, BM25Index  # noqa: PLC0415
    from tasks.corpus.sharded.shards import read_cluster_ranges  # noqa: PLC0415

    corpus = open_corpus(shipped_builds, name)
    members = pq.read_table(corpus.path / "cluster_members.parquet")
    assert len(read_cluster_ranges(corpus.path, FIGURES[name]["tokens_per_shard"])) > 3
    ids, texts = corpus_stages.cluster_texts(pq.read_table(corpus.path / "documents.parquet"), members)
    cfg = BM25Config(**json.loads((corpus.path / corpus_stages.CLUSTER_INDEX_DIR / "tokenizer.index.json").read_text()))
    one = BM25Index.build(texts, ids, cfg).save(tmp_path / "one")
    published = corpus.path / corpus_stages.CLUSTER_INDEX_DIR
    assert {p.name: sha256_file(p) for p in sorted(published.iterdir())} == {p.name: sha256_file(p) for p in sorted(one.iterdir())}


@pytest.mark.slow
def test_wikispeedia_full_build(shipped_builds):
    """The README's main job on all 4,598 real Wikispeedia articles."""
    corpus = open_corpus(shipped_builds)
    clusters = corpus.clusters
    assert clusters.column("n_members").to_numpy().sum() == corpus.documents.num_rows == 4598
    big = clusters.filter(clusters["n_tokens"].to_numpy() > 16384)
    assert (big.column("n_members").to_numpy() == 1).all()  # only single over-size documents exceed S
    index = corpus.cluster_index()
    ids, _ = index.search(["Charles Darwin natural selection evolution"], k=3)
    titles = {t for c in ids[0] for _, t, _ in corpus.members_of([int(c)])[int(c)]}
    assert "Charles Darwin" in titles or "Natural selection" in titles
