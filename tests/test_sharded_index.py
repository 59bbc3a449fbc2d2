"""Sharded BM25 passage index with corpus-wide statistics == one index over all passages.

Real data: ~100-word passages of the enwiki sample's articles, NQ-open dev questions as queries.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from data_contracts.corpus import DOCUMENTS
from funnelrag.datasets import resolve
from tasks.corpus.index import BM25Config, BM25Index
from tasks.corpus.ingest import IngestConfig, ingest
from tasks.corpus.segment import article_windows
from tasks.corpus.sharded_index import (SHARDS_FILE, ShardedBM25, build_shard, merge_stats, save_stats,
                                        shard_stats)


@pytest.fixture(scope="module")
def passages(data_mirror, tmp_path_factory) -> tuple[list[str], list[str]]:
    out = tmp_path_factory.mktemp("enwiki")
    ingest([resolve("enwiki-sample", data_mirror)], out, IngestConfig(format="mediawiki"))
    docs = DOCUMENTS.read(out, columns=["title", "text"])
    texts, ids = [], []
    for title, text in zip(docs["title"].to_pylist(), docs["text"].to_pylist()):
        for j, w in enumerate(article_windows(text, 100)):
            texts.append(f"{title}\n{w}")
            ids.append(f"{title}#{j}")
    return texts, ids


@pytest.fixture(scope="module")
def questions(data_mirror) -> list[str]:
    lines = (data_mirror / "nq-open" / "nq-open-dev.tsv").read_text().splitlines()
    return [line.split("\t")[0] for line in lines[:60]]


def _sharded(texts, ids, cuts, cfg, directory=None) -> ShardedBM25:
    parts = [(texts[a:b], ids[a:b]) for a, b in zip([0, *cuts], [*cuts, len(texts)])]
    stats = merge_stats([shard_stats(t, cfg) for t, _ in reversed(parts)])   # order does not matter
    shards = [build_shard(t, i, cfg, stats) for t, i in parts]
    if directory is None:
        return ShardedBM25(shards)
    names = [f"shard-{k:05d}" for k in range(len(shards))]
    for s, n in zip(shards, names):
        s.save(directory / n)
    (directory / SHARDS_FILE).write_text(json.dumps(names))
    save_stats(stats, directory)
    return ShardedBM25.load(directory)


@pytest.mark.parametrize("cfg", [BM25Config(), BM25Config(stemmer=None, stopwords=None, k1=1.2, b=0.75)],
                         ids=["default", "unstemmed"])
def test_sharded_search_equals_single_index(passages, questions, cfg, tmp_path):
    texts, ids = passages
    assert len(texts) > 2_000
    single = BM25Index.build(texts, ids, cfg)
    sharded = _sharded(texts, ids, [len(texts) // 5, len(texts) // 5 + 7, len(texts) * 3 // 4], cfg, tmp_path)
    assert sharded.doc_ids == single.doc_ids
    for k in (1, 10, 100):
        want_ids, want = single.search(questions, k)
        got_ids, got = sharded.search(questions, k)
        assert got.shape == want.shape == (len(questions), k)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        assert (want[:, -1] > 0).mean() > 0.9
        for q in range(len(questions)):
            # bm25s picks any of the rows tied at the k-th score (argpartition): compare the ids
            # above that score, and the tied ones as sets within their score
            above = want[q] > want[q, -1]
            assert [i for i, a in zip(got_ids[q], above) if a] == [i for i, a in zip(want_ids[q], above) if a]
            tied = sharded.search([questions[q]], 3 * k)
            tied_ids = {i for i, sc in zip(tied[0][0], tied[1][0]) if sc == want[q, -1]}
            assert {i for i, a in zip(want_ids[q], above) if not a} <= tied_ids


def test_shard_scores_are_not_local_scores(passages, questions):
    """Without global statistics shard scores differ (the test above is not vacuous)."""
    texts, ids = passages
    cfg = BM25Config()
    half = len(texts) // 2
    local = BM25Index.build(texts[:half], ids[:half], cfg)
    shard = _sharded(texts, ids, [half], cfg).shards[0]
    _, a = local.search(questions, 5)
    _, b = shard.search(questions, 5)
    assert not np.allclose(a, b, rtol=1e-3)


def test_shard_terms_missing_from_stats_are_an_error(passages):
    texts, ids = passages
    cfg = BM25Config()
    stats = shard_stats(texts[:50], cfg)
    with pytest.raises(ValueError, match="not in the corpus statistics"):
        build_shard(texts[50:100], ids[50:100], cfg, stats)
