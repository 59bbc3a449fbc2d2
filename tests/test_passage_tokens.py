"""The one passage index with its tokenization in token shards on workers == the one-process build, byte for byte.

Real data: the enwiki sample ingested, clustered and segmented (whitespace token counts: fast).
"""
from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

from corpus_stages import enwiki_sample_stages
from data_contracts.base import sha256_file
from data_contracts.corpus import PASSAGES
from tasks.corpus import stages as S
from funnelrag.verify import DIGESTS_FILE
from tasks.corpus.bm25_csc import doc_freqs
from tasks.corpus.index import BM25Config, BM25Index, TokenIds
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.sharded.cluster_index import DF_FILE
from tasks.corpus.sharded.passage_tokens import PassageTokenShards


@pytest.fixture(scope="module")
def segmented(data_mirror, tmp_path_factory):
    root = enwiki_sample_stages(tmp_path_factory.mktemp("segmented"), data_mirror)
    S.run_segment(root / "ingest", root / "tokens", root / "cluster", root / "segment", SegmentConfig(tokenizer="whitespace"), None)
    return root


def _files(directory):
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir())}


def _one_process(root, cfg, out):
    passages = PASSAGES.read(root / "segment", columns=["passage_id", "title", "text"])
    texts = [f"{t}\n{x}" for t, x in zip(passages.column("title").to_pylist(), passages.column("text").to_pylist())]
    BM25Index.build(texts, passages.column("passage_id").to_pylist(), cfg).save(out)
    return _files(out)


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster + segment (module fixture), then index builds
@pytest.mark.parametrize("cfg", [BM25Config(), BM25Config(stemmer=None, stopwords=None, k1=1.2, b=0.75)],
                         ids=["default", "unstemmed"])
def test_passage_token_shards_on_workers_give_the_one_process_index(segmented, cfg, tmp_path):
    """The index stage through a 2-worker pool (shards of at most 30K tokens, 3 in flight, the
    passages' queued behind the clusters'): ``index/passages.bm25`` is the one-process build's.
    A second build reuses every passage shard; one with other shard cuts takes every passage's
    terms from the token memo the first wrote. Same bytes each time."""
    root = segmented
    expected = _one_process(root, cfg, tmp_path / "one")
    with ProcessPoolExecutor(2) as pool:
        runs = [S.run_index(root / "ingest", root / "cluster", root / "segment", tmp_path / name, cfg, submit=pool.submit,
                            window=3, work_dir=tmp_path / "work", tokens_per_shard=shard_tokens)
                for name, shard_tokens in (("first", 30_000), ("again", 30_000), ("other", 45_000))]
    first, again, other = runs
    n = first["passage_index_docs"]
    assert first["passage_token_shards"] > 3 and first["passage_token_shards_built"] == first["passage_token_shards"]
    assert first["passages_reused"] == 0 and again["passage_token_shards_reused"] == again["passage_token_shards"]
    assert other["passage_token_shards_built"] > 0 and other["passages_reused"] == n
    for name in ("first", "again", "other"):
        assert _files(tmp_path / name / S.PASSAGE_INDEX_DIR) == expected


def test_passages_out_of_cluster_order_are_refused(segmented, tmp_path):
    """A passages table whose rows are not in the clusters' order cannot be cut into ranges: the
    error names the file instead of an index with passages missing."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    root = segmented
    (tmp_path / "segment").mkdir()
    table = pq.read_table(root / "segment" / PASSAGES.filename)
    pq.write_table(table.take(list(range(table.num_rows))[::-1]), tmp_path / "segment" / PASSAGES.filename)
    with pytest.raises(ValueError, match="passages.parquet"):
        PassageTokenShards.plan(tmp_path / "segment", root / "cluster", root / "ingest", BM25Config(), tmp_path / "work", 30_000)


def test_the_worker_keeps_each_shards_document_frequencies_in_its_entry(segmented, tmp_path):
    """With ``keep_df`` (the sharded index) each passage token shard's entry holds its ``df`` (int64, one a term in the shard's id
    order): :func:`tasks.corpus.bm25_csc.doc_freqs` over the kept ids, and a plain count of the
    documents holding each term; recorded in the entry's digests, so it is verified when read."""
    shards = PassageTokenShards.plan(segmented / "segment", segmented / "cluster", segmented / "ingest", BM25Config(),
                                     tmp_path / "work", 30_000, keep_df=True)
    dirs, _ = shards.collect(fn(*args) for fn, *args in shards.calls)
    assert len(dirs) > 3
    one_index = PassageTokenShards.plan(segmented / "segment", segmented / "cluster", segmented / "ingest", BM25Config(),
                                        tmp_path / "work", 30_000)
    one_dirs, _ = one_index.collect(fn(*args) for fn, *args in one_index.calls)
    assert not any((d / DF_FILE).exists() for d in one_dirs)   # the one index counts df in its own pass: not kept
    assert not set(one_dirs) & set(dirs)                       # ... and keeping it is part of the key
    for d in dirs:
        tokens, df = TokenIds.load(d), np.load(d / DF_FILE)
        assert df.dtype == np.int64 and df.shape == (len(tokens.terms),)
        assert np.array_equal(df, doc_freqs(lambda: [(tokens.ids, tokens.offsets)], len(tokens.terms))[0])
        counted = Counter(t for a, b in zip(tokens.offsets[:-1], tokens.offsets[1:]) for t in set(tokens.ids[a:b].tolist()))
        assert df.tolist() == [counted[t] for t in range(len(tokens.terms))]
        assert DF_FILE in json.loads((d / DIGESTS_FILE).read_text())["files"]
