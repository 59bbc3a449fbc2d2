"""Document-sharded token counting and cluster-sharded segmentation == the one-process stages
(real enwiki sample, real T5 tokenizer)."""
from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts.base import sha256_file
from funnelrag.datasets import resolve
from tasks.corpus import stages as S
from tasks.corpus.ingest import IngestConfig, ingest
from tasks.corpus.clustering import ClusteringConfig
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.shards import (cluster_ranges, doc_shards, read_doc_range, read_rows_by_id, run_segment_sharded,
                                 run_tokens_sharded)


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


def test_cluster_ranges_hold_whole_clusters():
    members = np.array([0, 0, 0, 1, 2, 2, 3, 5, 5, 5, 5])   # cluster id per member, sorted
    assert cluster_ranges(members, 4) == [(0, 2), (2, 6)]   # cut once a range reaches 4, 8, ... members
    assert cluster_ranges(members, 100) == [(0, 6)]
    assert cluster_ranges(members, 1) == [(0, 1), (1, 2), (2, 3), (3, 4), (5, 6)]
    assert cluster_ranges(np.zeros(0, np.int32), 4) == []


@pytest.fixture(scope="module")
def clustered(ingested, data_mirror, tmp_path_factory):
    """Tokens and Algorithm 1 over the enwiki sample (S = 32K T5 tokens: clusters of several articles)."""
    root = tmp_path_factory.mktemp("clustered")
    S.run_tokens(ingested, root / "tokens", SegmentConfig(), data_mirror)
    S.run_cluster(ingested, root / "tokens", root / "cluster", ClusteringConfig(max_tokens=32_768))
    return root


@pytest.mark.parametrize("docs_per_shard", [7, 1000])
def test_sharded_segment_is_byte_identical(ingested, clustered, data_mirror, tmp_path, docs_per_shard):
    cfg = SegmentConfig()
    one = S.run_segment(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "one", cfg, data_mirror)
    with ProcessPoolExecutor(2) as pool:
        many = run_segment_sharded(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "many", cfg,
                                   data_mirror, pool.submit, docs_per_shard, window=3, cache_dir=tmp_path / "cache")
        again = run_segment_sharded(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "again", cfg,
                                    data_mirror, pool.submit, docs_per_shard, cache_dir=tmp_path / "cache")
        scratch = run_segment_sharded(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "scratch", cfg,
                                      data_mirror, pool.submit, docs_per_shard)
    assert (many["shards"] > 1) == (docs_per_shard == 7)
    assert scratch["shards_built"] == many["shards"] and not (tmp_path / "scratch" / ".segment-shards").exists()
    for key in ("document_units", "passages", "mean_unit_tokens", "articles_without_passages"):
        assert many[key] == one[key], key
    assert (many["shards_built"], again["shards_reused"]) == (many["shards"], many["shards"])
    for name in ("document_units.parquet", "passages.parquet"):
        digest = sha256_file(tmp_path / "one" / name)
        assert sha256_file(tmp_path / "many" / name) == digest == sha256_file(tmp_path / "again" / name)
        assert sha256_file(tmp_path / "scratch" / name) == digest


@pytest.mark.parametrize("statistics", [True, False])
def test_rows_by_id_are_the_filtered_read(tmp_path, statistics):
    """Row group by row group (7 rows each, with and without min/max statistics): the rows and
    order of ``pq.read_table(filters=[(key, "in", ids)])``, for spread, repeated and absent ids."""
    n = 100
    table = pa.table({"doc_id": pa.array(np.arange(n, dtype=np.int32)), "text": [f"t{i}" * (i % 5) for i in range(n)],
                      "n": pa.array(np.arange(n, dtype=np.int64) * 3)})
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path, row_group_size=7, write_statistics=statistics)
    for ids in ([3, 99, 50, 3, 0, 51, 52, 200, -1], list(range(0, n, 13)), [7], list(range(n)), []):
        got = read_rows_by_id(path, "doc_id", ids, ["text", "doc_id"])
        want = pq.read_table(path, columns=["text", "doc_id"], filters=[("doc_id", "in", ids)]) if ids else table.slice(0, 0)
        assert got.column_names == ["text", "doc_id"]
        assert got.to_pydict() == want.select(["text", "doc_id"]).to_pydict()
    with pytest.raises(ValueError, match="key column"):
        read_rows_by_id(path, "doc_id", [1], ["text"])


def _rss_mb() -> float:
    from pathlib import Path
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS from /proc, malloc_trim from glibc")
def test_release_memory_gives_a_finished_tasks_heap_back():
    """Freed but fragmented malloc memory (what a shard task leaves in a worker) stays in RSS until
    release_memory; afterwards it is back with the OS, the survivors intact."""
    import gc

    from tasks.corpus.shards import release_memory

    release_memory()
    base = _rss_mb()
    blocks = [bytes(1000) + i.to_bytes(4, "little") for i in range(150_000)]   # ~150 MB of malloc'd blocks
    keep = blocks[::100]                                                         # pins pages all over the heap
    del blocks
    gc.collect()
    held = _rss_mb()
    release_memory()
    released = _rss_mb()
    assert held - base > 100, (base, held)           # the freed blocks were still resident
    assert held - released > 0.6 * (held - base), (base, held, released)
    assert all(b[1000:] == (100 * i).to_bytes(4, "little") for i, b in enumerate(keep))


def test_shard_call_releases_memory_after_the_call_even_when_it_fails(monkeypatch):
    from flows import runners
    from tasks.corpus import shards

    calls = []
    monkeypatch.setattr(shards, "release_memory", lambda: calls.append("release"))
    assert runners.shard_call.fn(lambda a, b: calls.append("call") or a + b, [2, 3]) == 5
    assert calls == ["call", "release"]

    def boom():
        raise ValueError("shard 7: bad record")
    with pytest.raises(ValueError, match="shard 7"):
        runners.shard_call.fn(boom, [])
    assert calls == ["call", "release", "release"]
