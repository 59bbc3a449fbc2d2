"""The BM25 benchmark's one bm25s index over a sharded passage index (the shards' matrices
stacked) holds the matrix of one index built over all the passages, so bm25s searches the corpus
it is compared on.

Real data: the NQ-open oracle's gold 100-word Wikipedia passages, NQ-open dev questions as queries.
"""
from __future__ import annotations

import gzip
import json

import bm25s
import numpy as np
import pytest

from benchmarks.bench_retrieval import merge_shard_matrices
from funnelrag.datasets import resolve
from tasks.corpus.index import BM25Config, BM25Index
from tasks.corpus.sharded.sharded_index import build_shard, merge_stats, shard_stats


@pytest.fixture(scope="module")
def passages(data_mirror) -> tuple[list[str], list[str]]:
    with gzip.open(resolve("nq-open-oracle", data_mirror), "rt", encoding="utf-8") as fh:
        rows = [json.loads(line)["ctxs"][0] for _, line in zip(range(900), fh)]
    return [f"{r['title']}\n{r['text']}" for r in rows], [f"p{i}" for i in range(len(rows))]


@pytest.fixture(scope="module")
def questions(data_mirror) -> list[str]:
    lines = (data_mirror / "nq-open" / "nq-open-dev.tsv").read_text().splitlines()
    return [line.split("\t")[0] for line in lines[:40]]


def _shards(texts, ids, cuts, cfg):
    parts = [(texts[a:b], ids[a:b]) for a, b in zip([0, *cuts], [*cuts, len(texts)])]
    stats = merge_stats([shard_stats(t, cfg) for t, _ in parts])
    return [build_shard(t, i, cfg, stats) for t, i in parts]


def _columns(retriever) -> dict[str, list[tuple[int, float]]]:
    """term -> the (row, score) pairs of its column."""
    sc = retriever.scores
    data, indices, indptr = (np.asarray(sc[k]) for k in ("data", "indices", "indptr"))
    return {t: sorted(zip(indices[indptr[j]:indptr[j + 1]].tolist(), data[indptr[j]:indptr[j + 1]].tolist()))
            for t, j in retriever.vocab_dict.items() if j < indptr.size - 1}


def test_stacked_shards_hold_the_single_index_matrix(passages, questions, tmp_path):
    texts, ids = passages
    cfg = BM25Config()
    single = BM25Index.build(texts, ids, cfg)
    shards = _shards(texts, ids, [250, 251, 600], cfg)
    out = merge_shard_matrices(shards, tmp_path / "one.bm25")
    merged = bm25s.BM25.load(str(out), mmap=True, show_progress=False)
    assert int(merged.scores["num_docs"]) == len(texts)
    got, want = _columns(merged), _columns(single.retriever)
    assert set(got) == set(want) and len(got) > 5_000
    assert got == want                                   # every (row, score) of every term, exact
    # bm25s's own retrieve over the stacked matrix ranks as the single index (same float32 sums)
    ours = BM25Index(merged, ids, cfg)
    rows_a, scores_a = ours.search_token_rows_bm25s(ours.tokenize(questions), 50)
    rows_b, scores_b = single.search_rows(questions, 50)
    assert (scores_a[:, 0] > 0).all()
    np.testing.assert_allclose(scores_a, scores_b, rtol=1e-6)
    assert (rows_a == rows_b).mean() > 0.95              # rows differ only inside ties at the 50th place
    # written once: a second call reuses the directory
    stamp = (out / "data.csc.index.npy").stat().st_mtime_ns
    assert merge_shard_matrices(shards, out) == out and (out / "data.csc.index.npy").stat().st_mtime_ns == stamp


def test_stacking_refuses_shards_of_other_parameters(passages, tmp_path):
    texts, ids = passages
    a = _shards(texts[:300], ids[:300], [150], BM25Config())
    b = _shards(texts[:300], ids[:300], [150], BM25Config(k1=1.2))
    with pytest.raises(ValueError, match="different parameters"):
        merge_shard_matrices([a[0], b[1]], tmp_path / "mixed.bm25")
    assert not (tmp_path / "mixed.bm25").exists()
