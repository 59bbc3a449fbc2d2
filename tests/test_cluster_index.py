"""The cluster index with its tokenization in cluster-range shards == the one-process build, byte for byte.

Real data: the enwiki sample ingested, clustered (whitespace token counts: fast).
"""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest

from corpus_stages import enwiki_sample_stages
from data_contracts.base import sha256_file
from data_contracts.corpus import CLUSTER_MEMBERS, DOCUMENTS
from tasks.corpus import stages as S
from tasks.corpus.sharded.cluster_index import build_cluster_index, cluster_texts, merge_vocabularies
from tasks.corpus.index import BM25Config, BM25Index, TokenIds, _stemmer, tokenize_ids
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.sharded.shards import run_here, run_segment_sharded

CONFIGS = [BM25Config(), BM25Config(stemmer=None, stopwords=None, k1=1.2, b=0.75), BM25Config(stemmer=None)]


@pytest.fixture(scope="module")
def clustered(data_mirror, tmp_path_factory):
    return enwiki_sample_stages(tmp_path_factory.mktemp("clustered"), data_mirror)


def _files(directory):
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir())}


def _one_process(root, cfg, out):
    ids, texts = cluster_texts(DOCUMENTS.read(root / "ingest", columns=["doc_id", "title", "text"]),
                               CLUSTER_MEMBERS.read(root / "cluster"))
    BM25Index.build(texts, ids, cfg).save(out)
    return _files(out)


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster (module fixture), then index builds
@pytest.mark.parametrize("cfg", CONFIGS, ids=["default", "unstemmed", "unstemmed-stopwords"])
def test_sharded_tokenization_gives_the_one_process_index(clustered, cfg, tmp_path):
    expected = _one_process(clustered, cfg, tmp_path / "one")
    index, summary = build_cluster_index(clustered / "ingest", clustered / "cluster", cfg, run_here, 9, tmp_path / "work",
                                         docs_per_range=7)   # a cluster a shard; documents split in ranges of 7
    assert summary["cluster_token_shards"] > 5 and summary["cluster_token_shards_built"] == summary["cluster_token_shards"]
    assert not list((tmp_path / "work").glob(".documents-by-shard-*"))   # the partition is scratch
    assert _files(index.save(tmp_path / "sharded")) == expected


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster (module fixture), then index builds
def test_worker_processes_and_reuse(clustered, tmp_path):
    """Through a process pool (2 workers, 2 shards in flight); a second build reuses every shard."""
    cfg = BM25Config()
    expected = _one_process(clustered, cfg, tmp_path / "one")
    with ProcessPoolExecutor(2) as pool:
        first, a = build_cluster_index(clustered / "ingest", clustered / "cluster", cfg, pool.submit, 60_000, tmp_path / "w", window=2)
        again, b = build_cluster_index(clustered / "ingest", clustered / "cluster", cfg, pool.submit, 60_000, tmp_path / "w", window=2)
    assert a["cluster_token_shards_built"] == b["cluster_token_shards_reused"] == a["cluster_token_shards"] > 1
    assert _files(first.save(tmp_path / "a")) == _files(again.save(tmp_path / "b")) == expected


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster (module fixture), then index builds
def test_run_index_cluster_index_is_the_one_process_one(clustered, tmp_path):
    """The index stage with cluster shards of at most 30K tokens: ``index/clusters.bm25`` is the
    one-process build's; the scratch work directory is removed."""
    root, cfg = clustered, BM25Config()
    S.run_segment(root / "ingest", root / "tokens", root / "cluster", tmp_path / "segment", SegmentConfig(tokenizer="whitespace"), None)
    summary = S.run_index(root / "ingest", root / "cluster", tmp_path / "segment", tmp_path / "index", cfg, tokens_per_shard=30_000)
    assert summary["cluster_token_shards"] > 5 and not (tmp_path / "index" / ".work").exists()
    assert _files(tmp_path / "index" / S.CLUSTER_INDEX_DIR) == _one_process(root, cfg, tmp_path / "one")


@pytest.mark.parametrize("stemmer", ["english", None])
def test_merged_vocabularies_are_the_one_call_vocabulary(stemmer):
    """Split points anywhere (empty texts, a term first seen in a later part, stop-word-only text)."""
    cfg = BM25Config(stemmer=stemmer)
    texts = ["Running runners ran", "", "the and of", "Zebra apples running", "apples Apple APPLES zebra", "new words here"]
    whole = TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(stemmer)))
    for cuts in ([1], [2, 3], [1, 2, 3, 4, 5], [5]):
        bounds = list(zip([0, *cuts], [*cuts, len(texts)]))
        parts = [TokenIds.from_tokenized(tokenize_ids(texts[a:b], cfg, _stemmer(stemmer))) for a, b in bounds]
        terms, lookups = merge_vocabularies([p.terms for p in parts], sorted_terms=stemmer is not None)
        assert terms == whole.terms
        ids = [lookup[p.ids].tolist() for p, lookup in zip(parts, lookups)]
        assert sum(ids, []) == whole.ids.tolist()


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster (module fixture), then index builds
@pytest.mark.parametrize("cfg", [BM25Config(), BM25Config(method="robertson", stemmer=None, k1=1.5, b=0.3),
                                 BM25Config(method="atire")], ids=["lucene", "robertson", "atire"])
def test_flat_token_ids_index_is_the_bm25s_index(clustered, cfg, tmp_path, monkeypatch):
    """``bm25_from_token_ids`` (NumPy over flat ids, small chunks, texts without tokens) saves the
    bytes of bm25s indexing the lists without reaching bm25s's per-document loops."""
    import bm25s  # noqa: PLC0415

    from tasks.corpus.index import bm25_from_token_ids  # noqa: PLC0415

    ids, texts = cluster_texts(DOCUMENTS.read(clustered / "ingest", columns=["doc_id", "title", "text"]),
                               CLUSTER_MEMBERS.read(clustered / "cluster"))
    texts[3] = texts[10] = "the of and"                                  # no token left after stop words
    ids, texts = ids[:40], texts[:40]
    expected = BM25Index.build(texts, ids, cfg).save(tmp_path / "lists")
    monkeypatch.setattr(bm25s, "_calculate_doc_freqs", lambda *a, **k: pytest.fail("bm25s per-document loop used"))
    tokens = TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)))
    BM25Index(bm25_from_token_ids(tokens, cfg, chunk_tokens=5_000), ids, cfg).save(tmp_path / "flat")
    assert _files(tmp_path / "flat") == _files(expected)


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster (module fixture), then segment and index builds
def test_the_index_stage_takes_the_document_split_the_segment_stage_made(clustered, tmp_path):
    """A build's shared split: segment makes it, index reads it instead of splitting again, and
    both write the bytes they write without it; a stage's own scratch split is gone after it."""
    root, cfg, seg = clustered, BM25Config(), SegmentConfig(tokenizer="whitespace")
    split = tmp_path / "split"
    segmented = run_segment_sharded(root / "ingest", root / "tokens", root / "cluster", tmp_path / "segment", seg, None,
                                    run_here, 30_000, cache_dir=tmp_path / "cache", docs_per_range=50, split_dir=split)
    assert not segmented["split_reused"] and len(list(split.iterdir())) == 1   # one split, complete, no temporary
    indexed = S.run_index(root / "ingest", root / "cluster", tmp_path / "segment", tmp_path / "index", cfg,
                          tokens_per_shard=30_000, docs_per_range=50, split_dir=split)
    assert indexed["cluster_split_reused"] and indexed["cluster_token_shards"] > 5
    alone = S.run_index(root / "ingest", root / "cluster", tmp_path / "segment", tmp_path / "alone", cfg,
                        tokens_per_shard=30_000, docs_per_range=50)
    assert not alone["cluster_split_reused"]
    assert _files(tmp_path / "index" / S.CLUSTER_INDEX_DIR) == _files(tmp_path / "alone" / S.CLUSTER_INDEX_DIR) \
        == _one_process(root, cfg, tmp_path / "one")
    other = S.run_index(root / "ingest", root / "cluster", tmp_path / "segment", tmp_path / "other", cfg,
                        tokens_per_shard=20_000, docs_per_range=50, split_dir=split)   # other ranges: a split of its own
    assert not other["cluster_split_reused"] and len(list(split.iterdir())) == 2
