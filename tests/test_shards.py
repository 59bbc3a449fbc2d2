"""Document-sharded token counting == the one-process stage (real enwiki sample, real T5 tokenizer)."""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor

import pytest

from data_contracts.base import sha256_file
from funnelrag.datasets import resolve
from tasks.corpus import stages as S
from tasks.corpus.ingest import IngestConfig, ingest
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.shards import doc_shards, read_doc_range, run_tokens_sharded


@pytest.fixture(scope="module")
def ingested(data_mirror, tmp_path_factory):
    out = tmp_path_factory.mktemp("enwiki")
    ingest([resolve("enwiki-sample", data_mirror)], out, IngestConfig(format="mediawiki"))
    return out


def test_doc_shards_cover_every_document_once():
    assert doc_shards(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert doc_shards(0, 4) == []


@pytest.mark.parametrize("docs_per_shard", [7, 1000])
def test_sharded_tokens_are_byte_identical(ingested, data_mirror, tmp_path, docs_per_shard):
    cfg = SegmentConfig()
    one = S.run_tokens(ingested, tmp_path / "one", cfg, data_mirror)
    with ProcessPoolExecutor(2) as pool:
        many = run_tokens_sharded(ingested, tmp_path / "many", cfg, data_mirror, pool.submit, docs_per_shard, window=3)
    assert many["shards"] == -(-one["documents"] // docs_per_shard)
    assert (many["documents"], many["windows"], many["tokens"]) == (one["documents"], one["windows"], one["tokens"])
    assert sha256_file(tmp_path / "one" / "window_tokens.parquet") == sha256_file(tmp_path / "many" / "window_tokens.parquet")


def test_missing_documents_in_a_range_are_an_error(ingested):
    with pytest.raises(ValueError, match="are not all present"):
        read_doc_range(ingested, 100, 200, ["doc_id"])


def test_token_shards_with_unchanged_texts_are_reused(ingested, data_mirror, tmp_path):
    cfg, cache = SegmentConfig(tokenizer="whitespace"), tmp_path / "cache"
    with ProcessPoolExecutor(2) as pool:
        first = run_tokens_sharded(ingested, tmp_path / "a", cfg, data_mirror, pool.submit, 20, cache_dir=cache)
        again = run_tokens_sharded(ingested, tmp_path / "b", cfg, data_mirror, pool.submit, 20, cache_dir=cache)
    assert (first["shards_built"], first["shards_reused"]) == (first["shards"], 0)
    assert (again["shards_built"], again["shards_reused"]) == (0, first["shards"])
    assert sha256_file(tmp_path / "a" / "window_tokens.parquet") == sha256_file(tmp_path / "b" / "window_tokens.parquet")
