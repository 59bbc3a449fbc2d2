"""Document-sharded token counting and cluster-sharded segmentation == the one-process stages
(real enwiki sample, real T5 tokenizer)."""
from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from data_contracts.base import parse_temp_name, sha256_file
from funnelrag.datasets import resolve
from tasks.corpus.sharded import segment_memo as SM
from tasks.corpus import stages as S
from tasks.sources.ingest import IngestConfig, ingest
from tasks.corpus.clustering import ClusteringConfig
from tasks.corpus.segment import SegmentConfig
from funnelrag.content_store import arrow_text_keys
from tasks.corpus.sharded.shards import (TEXT_KEYS_FILE, anchor_keys, cluster_ranges, doc_shards, partition_documents,
                                 put_cached, read_cluster_ranges, read_rows, read_rows_at, read_shard_documents,
                                 read_text_keys, run_here, run_segment_sharded, run_tokens_sharded)


@pytest.fixture(scope="module")
def ingested(data_mirror, tmp_path_factory):
    out = tmp_path_factory.mktemp("enwiki")
    ingest([resolve("enwiki-sample", data_mirror)], out, IngestConfig(format="mediawiki"))
    return out


def test_a_failed_cache_write_leaves_no_entry_and_no_temporary_directory(tmp_path):
    def fails(tmp):
        (tmp / "half.parquet").write_bytes(b"PAR1")
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError, match="No space left"):
        put_cached(tmp_path / "key", fails)
    assert list(tmp_path.iterdir()) == []
    put_cached(tmp_path / "key", lambda tmp: (tmp / "COMPLETE").write_text("0\n"))
    assert [p.name for p in tmp_path.iterdir()] == ["key"] and (tmp_path / "key" / "COMPLETE").read_text() == "0\n"


def test_doc_shards_cover_every_document_once():
    assert doc_shards(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert doc_shards(0, 4) == []


@pytest.mark.slow  # T5 token counts in a pool of worker processes
@pytest.mark.parametrize("docs_per_shard", [7, 1000])
def test_sharded_tokens_are_byte_identical(ingested, data_mirror, tmp_path, docs_per_shard):
    cfg = SegmentConfig()
    one = S.run_tokens(ingested, tmp_path / "one", cfg, data_mirror)
    with ProcessPoolExecutor(2) as pool:
        many = run_tokens_sharded(ingested, tmp_path / "many", cfg, data_mirror, pool.submit, docs_per_shard, window=3)
    assert many["shards"] == -(-one["documents"] // docs_per_shard)
    assert (many["documents"], many["windows"], many["tokens"]) == (one["documents"], one["windows"], one["tokens"])
    assert sha256_file(tmp_path / "one" / "window_tokens.parquet") == sha256_file(tmp_path / "many" / "window_tokens.parquet")
    texts = pq.read_table(ingested / "documents.parquet", columns=["text"]).column("text")   # keys by row
    assert np.array_equal(read_text_keys(tmp_path / "many", np.arange(len(texts))), arrow_text_keys(texts))
    assert np.array_equal(read_text_keys(tmp_path / "many", np.array([5, 0])), arrow_text_keys(texts.take([5, 0])))
    assert read_text_keys(tmp_path / "one", np.array([0])) is None   # the one-process stage keeps none
    np.save(tmp_path / "many" / TEXT_KEYS_FILE, arrow_text_keys(texts)[1:])
    with pytest.raises(ValueError, match="text keys for"):
        read_text_keys(tmp_path / "many", np.array([0]))


def test_missing_documents_in_a_range_are_an_error(ingested):
    with pytest.raises(ValueError, match="are not all present"):
        read_rows(ingested / "documents.parquet", 100, 200, ["doc_id"])


def test_token_shards_with_unchanged_texts_are_reused(ingested, data_mirror, tmp_path):
    cfg, cache = SegmentConfig(tokenizer="whitespace"), tmp_path / "cache"
    with ProcessPoolExecutor(2) as pool:
        first = run_tokens_sharded(ingested, tmp_path / "a", cfg, data_mirror, pool.submit, 20, cache_dir=cache)
        again = run_tokens_sharded(ingested, tmp_path / "b", cfg, data_mirror, pool.submit, 20, cache_dir=cache)
    assert (first["shards_built"], first["shards_reused"]) == (first["shards"], 0)
    assert (first["documents_counted"], first["documents_reused"]) == (first["documents"], 0)
    assert (again["shards_built"], again["shards_reused"]) == (0, first["shards"])
    assert (again["documents_counted"], again["documents_reused"]) == (0, first["documents"])
    assert sha256_file(tmp_path / "a" / "window_tokens.parquet") == sha256_file(tmp_path / "b" / "window_tokens.parquet")


def _edited(ingested, out, edits):
    """A copy of ``ingested``'s documents with the texts of ``edits`` (row -> text) replaced."""
    docs = pq.read_table(ingested / "documents.parquet")
    texts = docs.column("text").to_pylist()
    for row, text in edits.items():
        texts[row] = text
    out.mkdir(parents=True)
    pq.write_table(docs.set_column(docs.schema.get_field_index("text"), "text", pa.array(texts, pa.string())),
                   out / "documents.parquet", row_group_size=16)
    return out


def test_the_token_memo_counts_only_edited_documents_in_every_shard(ingested, data_mirror, tmp_path):
    """Edits spread over every shard (as a nightly's adds-changes are): no shard is unchanged, yet
    only the edited documents are tokenized, and the counts are those of a build without a memo."""
    cfg, cache = SegmentConfig(tokenizer="whitespace"), tmp_path / "cache"
    n_docs = pq.read_metadata(ingested / "documents.parquet").num_rows
    edits = {d: f"edited article {d} " + "word " * (37 * d % 250) for d in range(3, n_docs, 20)}
    edited = _edited(ingested, tmp_path / "edited", edits)
    run_tokens_sharded(ingested, tmp_path / "a", cfg, data_mirror, run_here, 20, cache_dir=cache)
    tonight = run_tokens_sharded(edited, tmp_path / "b", cfg, data_mirror, run_here, 20, cache_dir=cache)
    fresh = run_tokens_sharded(edited, tmp_path / "c", cfg, data_mirror, run_here, 20)
    assert (tonight["shards_built"], tonight["shards_reused"]) == (tonight["shards"], 0)
    assert (tonight["documents_counted"], tonight["documents_reused"]) == (len(edits), n_docs - len(edits))
    assert fresh["documents_counted"] == n_docs
    assert sha256_file(tmp_path / "b" / "window_tokens.parquet") == sha256_file(tmp_path / "c" / "window_tokens.parquet")
    back = run_tokens_sharded(ingested, tmp_path / "d", cfg, data_mirror, run_here, 20, cache_dir=cache)
    assert back["documents_counted"] == len(edits)   # the memo holds the last build's texts only
    assert sha256_file(tmp_path / "a" / "window_tokens.parquet") == sha256_file(tmp_path / "d" / "window_tokens.parquet")


def _sums(ids, tokens, ranges):
    return [int(tokens[(ids >= lo) & (ids < hi)].sum()) for lo, hi in ranges]


def _corpus_like(n, seed=0):
    """``n`` clusters with Algorithm-1-like sizes: most near S = 4K tokens, a long tail of big
    singleton articles; ids with gaps; titles as anchor names."""
    rng = np.random.default_rng(seed)
    ids = np.cumsum(rng.integers(1, 3, n))
    tokens = np.minimum(rng.lognormal(8.3, 0.6, n), 400_000).astype(np.int64)
    return ids, tokens, [f"Article {i}" for i in ids.tolist()]


def test_cluster_ranges_hold_whole_clusters_within_the_token_budget():
    ids, tokens, names = _corpus_like(20_000)
    ranges = cluster_ranges(ids, tokens, anchor_keys(names), 1_000_000)
    assert ranges[0][0] == ids[0] and ranges[-1][1] == ids[-1] + 1
    assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:]))            # ordered, disjoint
    covered = np.zeros(ids.size, bool)
    for lo, hi in ranges:
        covered |= (ids >= lo) & (ids < hi)
    assert covered.all()                                                      # every cluster in a range
    sums = _sums(ids, tokens, ranges)
    assert sum(sums) == tokens.sum() and max(sums) <= 1_000_000
    starts = [int(np.searchsorted(ids, lo)) for lo, _ in ranges]
    for k, total in enumerate(sums[:-1]):                                     # at least half full, or the next
        assert total >= 500_000 or total + tokens[starts[k + 1]] > 1_000_000  # cluster would not fit
    assert 0.55 < np.mean(sums[:-1]) / 1_000_000 < 0.7                        # ~0.62 of the budget
    big = np.array([10, 5_000, 10, 10])                                      # a cluster over the budget: alone
    assert cluster_ranges(np.arange(4), big, anchor_keys(list("abcd")), 100) == [(0, 1), (1, 2), (2, 4)]
    assert cluster_ranges(np.arange(3), np.array([1, 2, 3]), anchor_keys(list("abc")), 10**9) == [(0, 3)]
    assert cluster_ranges(np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.uint64), 4) == []


def test_an_edited_cluster_moves_no_cut_after_the_next_anchor():
    """Content-defined cuts: one cluster's token count changes (an edited page), and the shards
    after the next cut are the same ranges; cuts at running-sum multiples would move ~all."""
    ids, tokens, names = _corpus_like(20_000, seed=1)
    keys = anchor_keys(names)
    before = cluster_ranges(ids, tokens, keys, 1_000_000)
    assert len(before) > 20
    for at, delta in ((3_000, 700), (9_000, -1_500), (15_000, 40)):
        edited = tokens.copy()
        edited[at] = max(0, edited[at] + delta)
        after = cluster_ranges(ids, edited, keys, 1_000_000)
        changed = set(before) ^ set(after)
        assert len(set(before) - set(after)) <= 2 and len(set(after) - set(before)) <= 2, (at, changed)
        assert all(hi > ids[at] for _, hi in changed)                     # nothing before the edit moved
    assert cluster_ranges(ids, tokens, keys, 1_000_000) == before         # deterministic
    assert anchor_keys(["Alabama"]) == anchor_keys(["Alabama"]) and anchor_keys(["Alabama"]) != anchor_keys(["Alaska"])


def test_cluster_ranges_reject_bad_input(tmp_path):
    keys = anchor_keys(["a", "b"])
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        cluster_ranges(np.arange(2), np.ones(2), keys, 0)
    with pytest.raises(ValueError, match="not strictly ascending"):
        cluster_ranges(np.array([1, 1]), np.ones(2), keys, 10)
    with pytest.raises(ValueError, match="token counts"):
        cluster_ranges(np.arange(3), np.ones(2), keys, 10)
    with pytest.raises(ValueError, match="negative token count for cluster 1"):
        cluster_ranges(np.arange(2), np.array([1, -1]), keys, 10)


@pytest.mark.slow  # enwiki-sample T5 tokens + clustering (module fixture)
def test_read_cluster_ranges_checks_members_against_clusters(clustered):
    cluster_dir = clustered / "cluster"
    members = pq.read_table(cluster_dir / "cluster_members.parquet").column("cluster_id").to_numpy()
    ranges = read_cluster_ranges(cluster_dir, 60_000, members)
    assert len(ranges) > 3
    with pytest.raises(ValueError, match="disagree .*not in clusters: \\[999999\\]"):
        read_cluster_ranges(cluster_dir, 60_000, np.r_[members, 999_999])


@pytest.fixture(scope="module")
def clustered(ingested, data_mirror, tmp_path_factory):
    """Tokens and Algorithm 1 over the enwiki sample (S = 32K T5 tokens: clusters of several articles)."""
    root = tmp_path_factory.mktemp("clustered")
    S.run_tokens(ingested, root / "tokens", SegmentConfig(), data_mirror)
    S.run_cluster(ingested, root / "tokens", root / "cluster", ClusteringConfig(max_tokens=32_768))
    return root


@pytest.mark.slow  # enwiki-sample T5 tokens + clustering (module fixture)
def test_partition_gives_each_shard_exactly_its_documents(ingested, clustered, tmp_path):
    """One pass over documents.parquet (doc ranges of 9, through a process pool) puts every member
    document in its shard's directory, with the rows a by-id read of documents.parquet gives."""
    from data_contracts.corpus import rows_of
    from tasks.corpus.sharded.shards import DOC_COLUMNS, ROW, member_cluster_ranks

    cluster_dir = clustered / "cluster"
    members = pq.read_table(cluster_dir / "cluster_members.parquet")
    ranks, dids = member_cluster_ranks(members.column("cluster_id").to_numpy()), members.column("doc_id").to_numpy()
    ids = pq.read_table(ingested / "documents.parquet", columns=["doc_id"]).column("doc_id").to_numpy()
    rows = rows_of(ids, dids, "documents")   # the members' rows of documents.parquet
    ranges = read_cluster_ranges(cluster_dir, 60_000, members.column("cluster_id").to_numpy())
    with ProcessPoolExecutor(2) as pool:
        dirs = partition_documents(ingested, ranges, ranks, rows, tmp_path / "parts", pool.submit, 9, window=3)
    assert len(dirs) == len(ranges) > 3
    seen = []
    for (lo, hi), d in zip(ranges, dirs):
        mask = (ranks >= lo) & (ranks < hi)
        mine = read_shard_documents(str(d))
        assert mine.column(ROW).to_pylist() == sorted(rows[mask].tolist())   # in the file's row order
        want = pq.read_table(ingested / "documents.parquet", columns=DOC_COLUMNS).take(sorted(rows[mask].tolist()))
        assert mine.select(DOC_COLUMNS).equals(want)
        seen += mine.column("doc_id").to_pylist()
    assert sorted(seen) == sorted(dids.tolist())
    with pytest.raises(ValueError, match="outside the shards' cluster ranges"):
        partition_documents(ingested, ranges[1:], ranks, rows, tmp_path / "bad", run_here, 9)


@pytest.mark.slow  # enwiki-sample T5 tokens + clustering (module fixture)
@pytest.mark.parametrize("tokens_per_shard", [60_000, 10**9])
def test_sharded_segment_is_byte_identical(ingested, clustered, data_mirror, tmp_path, tokens_per_shard):
    cfg = SegmentConfig()
    one = S.run_segment(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "one", cfg, data_mirror)
    with ProcessPoolExecutor(2) as pool:
        many = run_segment_sharded(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "many", cfg,
                                   data_mirror, pool.submit, tokens_per_shard, window=3, cache_dir=tmp_path / "cache")
        again = run_segment_sharded(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "again", cfg,
                                    data_mirror, pool.submit, tokens_per_shard, cache_dir=tmp_path / "cache")
        scratch = run_segment_sharded(ingested, clustered / "tokens", clustered / "cluster", tmp_path / "scratch", cfg,
                                      data_mirror, pool.submit, tokens_per_shard)
    assert (many["shards"] > 3) == (tokens_per_shard == 60_000) and many["shards"] >= 1
    assert scratch["shards_built"] == many["shards"] and not (tmp_path / "scratch" / ".segment-shards").exists()
    for key in ("document_units", "passages", "mean_unit_tokens", "articles_without_passages"):
        assert many[key] == one[key], key
    assert (many["shards_built"], again["shards_reused"]) == (many["shards"], many["shards"])
    for name in ("document_units.parquet", "passages.parquet"):
        digest = sha256_file(tmp_path / "one" / name)
        assert sha256_file(tmp_path / "many" / name) == digest == sha256_file(tmp_path / "again" / name)
        assert sha256_file(tmp_path / "scratch" / name) == digest


@pytest.mark.parametrize("kept_keys", [False, True])
def test_the_segment_memo_segments_only_changed_clusters(ingested, data_mirror, tmp_path, kept_keys):
    """Edits spread over every shard, clusters recomputed by Algorithm 1 on the edited corpus: only
    clusters with an edited member are segmented again, the others come from the memo as they are
    (ids are content ids), and the bytes are those of a build without a memo and of the
    one-process stage; the same whether the shards hash the texts or take the keys the tokens
    stage kept."""
    cfg, cache = SegmentConfig(tokenizer="whitespace"), tmp_path / "cache"
    n_docs = pq.read_metadata(ingested / "documents.parquet").num_rows
    edits = {d: f"edited article {d} " + "word " * (37 * d % 250) for d in range(3, n_docs, 20)}
    edited = _edited(ingested, tmp_path / "edited", edits)
    for other in ingested.glob("*.parquet"):
        if other.name != "documents.parquet":
            shutil.copyfile(other, edited / other.name)
    built = {}
    for name, src in (("base", ingested), ("edited", edited)):
        S.run_tokens(src, tmp_path / name / "tokens", cfg, data_mirror)
        if kept_keys:   # as run_tokens_sharded keeps them
            texts = pq.read_table(src / "documents.parquet", columns=["text"]).column("text")   # by row
            np.save(tmp_path / name / "tokens" / TEXT_KEYS_FILE, arrow_text_keys(texts))
        S.run_cluster(src, tmp_path / name / "tokens", tmp_path / name / "cluster", ClusteringConfig(max_tokens=8192, tokenizer="whitespace"))
        built[name] = (src, tmp_path / name / "tokens", tmp_path / name / "cluster")
    base = run_segment_sharded(*built["base"], tmp_path / "s-base", cfg, data_mirror, run_here, 40_000, cache_dir=cache)
    # the memo's parts under names no shard of tonight has (no shard entry reused whole): every
    # cluster reused comes from them
    memo_only = tmp_path / "memo-only"
    parts = [memo_only / f"kept-{part.name}" for part, *_ in SM.listed_parts(SM.memo_dir(cache, cfg))]
    for part in parts:
        shutil.copytree(cache / part.name.removeprefix("kept-"), part)
    SM.write_manifest(SM.memo_dir(memo_only, cfg), parts)
    tonight = run_segment_sharded(*built["edited"], tmp_path / "s-tonight", cfg, data_mirror, run_here, 40_000,
                                  cache_dir=memo_only)
    fresh = run_segment_sharded(*built["edited"], tmp_path / "s-fresh", cfg, data_mirror, run_here, 40_000)
    S.run_segment(*built["edited"], tmp_path / "s-one", cfg, data_mirror)
    assert base["clusters_reused"] == 0 and fresh["clusters_reused"] == 0
    members = pq.read_table(tmp_path / "edited" / "cluster" / "cluster_members.parquet")
    edited_ids = pq.read_table(ingested / "documents.parquet", columns=["doc_id"]).column("doc_id").take(sorted(edits))
    touched = len(set(members.filter(pc.is_in(members.column("doc_id"), edited_ids.combine_chunks())).column("cluster_id")
                      .to_pylist()))
    assert tonight["shards_built"] == tonight["shards"] > 1
    assert tonight["clusters"] / 2 < tonight["clusters_reused"] <= tonight["clusters"] - touched
    for name in ("document_units.parquet", "passages.parquet"):
        digest = sha256_file(tmp_path / "s-one" / name)
        assert sha256_file(tmp_path / "s-tonight" / name) == sha256_file(tmp_path / "s-fresh" / name) == digest


def test_a_segmentation_memo_of_the_earlier_layout_is_never_read_and_retention_sweeps_it(ingested, data_mirror, tmp_path):
    """The first build after the memo's layout changed (rows kept with their ids, no relabelling)
    cuts every cluster: a memo written before, under the earlier version, sits under another
    name; unused, retention removes it."""
    import time

    from funnelrag.content_store import settings_dir
    from funnelrag.store import entry_marker, prune_cache

    cfg = SegmentConfig(tokenizer="whitespace")
    S.run_tokens(ingested, tmp_path / "tokens", cfg, data_mirror)
    S.run_cluster(ingested, tmp_path / "tokens", tmp_path / "cluster", ClusteringConfig(max_tokens=8192, tokenizer="whitespace"))
    built = (ingested, tmp_path / "tokens", tmp_path / "cluster")
    run_segment_sharded(*built, tmp_path / "s1", cfg, data_mirror, run_here, 40_000, cache_dir=tmp_path / "cache")
    home = tmp_path / "home"
    old = settings_dir(home, "segment-memo", str(int(SM.SEGMENT_MEMO_VERSION) - 1), cfg)
    shutil.copytree(SM.memo_dir(tmp_path / "cache", cfg), old)   # the same clusters, under the earlier version
    again = run_segment_sharded(*built, tmp_path / "s2", cfg, data_mirror, run_here, 40_000, cache_dir=home)
    assert again["clusters"] > 10 and again["clusters_reused"] == 0 and SM.memo_dir(home, cfg).is_dir()
    week_ago = time.time() - 7 * 86400
    os.utime(entry_marker(old), (week_ago, week_ago))   # no build used it since the upgrade
    assert old.relative_to(home).as_posix() in prune_cache(home, 3 * 86400).removed
    assert not old.exists() and SM.memo_dir(home, cfg).is_dir()


def test_rows_at_are_the_taken_rows(tmp_path):
    """Row group by row group (7 rows each): the rows of ``table.take(rows)`` for spread rows, runs
    of consecutive rows (sliced) across row-group bounds, one row, all rows and none; a row past
    the end is an error naming the file."""
    n = 100
    table = pa.table({"doc_id": pa.array(np.arange(n, dtype=np.int32)), "text": [f"t{i}" * (i % 5) for i in range(n)],
                      "n": pa.array(np.arange(n, dtype=np.int64) * 3)})
    path = tmp_path / "docs.parquet"
    pq.write_table(table, path, row_group_size=7)
    for rows in ([0, 3, 50, 51, 52, 99], list(range(0, n, 13)), [7], list(range(n)), list(range(5, 30)), []):
        got = read_rows_at(path, np.array(rows, np.int64), ["text", "doc_id"])
        assert got.column_names == ["text", "doc_id"]
        assert got.to_pydict() == table.select(["text", "doc_id"]).take(pa.array(rows, pa.int64())).to_pydict()
    assert read_rows(path, 5, 30, ["n"]).equals(table.select(["n"]).slice(5, 25))
    with pytest.raises(ValueError, match="docs.parquet: the rows wanted are not all present"):
        read_rows_at(path, np.array([98, 99, 100]), ["text"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
def test_status_mb_reads_the_process_memory_fields():
    import mmap

    from funnelrag.memory import status_mb

    rss, peak = status_mb("VmRSS"), status_mb("VmHWM")
    assert 10 < rss <= peak                      # MB, not kB: a Python process with pyarrow holds tens of MB
    block = mmap.mmap(-1, 64 << 20)              # fresh pages (not memory malloc already holds) ...
    for offset in range(0, len(block), mmap.PAGESIZE):
        block[offset] = 1                        # ... each touched: 64 MB more resident
    assert status_mb("VmRSS") - rss > 50 and status_mb("VmHWM") >= status_mb("VmRSS")
    block.close()
    assert status_mb("NoSuchField") is None and status_mb("VmRS") is None   # a prefix is not the field


@pytest.mark.slow  # allocates and frees hundreds of MB to watch the RSS
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RSS from /proc, malloc_trim from glibc")
def test_release_memory_gives_a_finished_tasks_heap_back():
    """Freed but fragmented malloc memory (what a shard task leaves in a worker) stays in RSS until
    release_memory; afterwards it is back with the OS, the survivors intact."""
    import gc

    from funnelrag.memory import release_memory, status_mb

    release_memory()
    base = status_mb("VmRSS")
    blocks = [bytes(1000) + i.to_bytes(4, "little") for i in range(150_000)]   # ~150 MB of malloc'd blocks
    keep = blocks[::100]                                                         # pins pages all over the heap
    del blocks
    gc.collect()
    held = status_mb("VmRSS")
    release_memory()
    released = status_mb("VmRSS")
    assert held - base > 100, (base, held)           # the freed blocks were still resident
    assert held - released > 0.6 * (held - base), (base, held, released)
    assert all(b[1000:] == (100 * i).to_bytes(4, "little") for i, b in enumerate(keep))


def test_run_shard_releases_memory_after_the_call_even_when_it_fails(monkeypatch):
    from flows import runners

    calls = []
    monkeypatch.setattr(runners, "release_memory", lambda freeze: calls.append(("release", freeze)))
    assert runners.run_shard(lambda a, b: calls.append("call") or a + b, [2, 3]) == 5
    assert calls == ["call", ("release", False)]   # this test's process is no pool's child: never frozen

    def boom():
        raise ValueError("shard 7: bad record")
    with pytest.raises(ValueError, match="shard 7"):
        runners.run_shard(boom, [])
    assert calls == ["call", ("release", False), ("release", False)]


def _freeze_count_after_release(_: int) -> tuple[int, int]:
    """In a pool worker: release_memory(freeze=True) after making a reference cycle; the frozen
    count and how many of the cycle's objects the collection found."""
    import gc

    from funnelrag.memory import release_memory

    class Node:
        pass
    a, b = Node(), Node()
    a.other, b.other = b, a
    del a, b
    gc.set_debug(gc.DEBUG_SAVEALL)
    release_memory(freeze=True)
    found = sum(isinstance(o, Node) for o in gc.garbage)
    gc.set_debug(0)
    gc.garbage.clear()
    return gc.get_freeze_count(), found


def test_release_memory_freezes_survivors_after_collecting_the_tasks_cycles():
    """A pool worker's release: the cycle a task left is collected, then the survivors are frozen
    (the next collection skips them)."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        frozen, found = pool.submit(_freeze_count_after_release, 0).result()
    assert found == 2
    assert frozen > 1000


def test_build_collector_freezes_raises_the_young_threshold_and_restores_both():
    """Inside: the objects alive at entry frozen, the young threshold raised, nested use a no-op,
    a reference cycle made inside still collected; at exit (also after an error) the thresholds
    and the frozen count are as before."""
    import gc
    import weakref

    from funnelrag.memory import build_collector, in_build_collector

    gc.unfreeze()
    old = gc.get_threshold()

    class Node:
        pass
    with build_collector(12_345):
        assert in_build_collector()
        assert gc.get_threshold() == (12_345, *old[1:])
        assert gc.get_freeze_count() > 1000
        made = [[]]   # tracked, made after the freeze: a nested entry must not freeze it
        with build_collector(999):
            assert gc.get_threshold()[0] == 12_345
            assert any(o is made for o in gc.get_objects())   # not in the permanent generation
        assert in_build_collector()
        a = Node()
        a.me = a
        ref = weakref.ref(a)
        del a
        gc.collect()
        assert ref() is None
    assert not in_build_collector()
    assert gc.get_threshold() == old and gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError, match="stage failed"), build_collector(777):
        raise RuntimeError("stage failed")
    assert gc.get_threshold() == old and gc.get_freeze_count() == 0 and not in_build_collector()
    with pytest.raises(ValueError, match="young_objects"), build_collector(0):
        pass


def test_build_collector_leaves_a_processs_own_freeze_alone():
    import gc

    from funnelrag.memory import build_collector

    mine = [[]]
    gc.freeze()
    try:
        with build_collector():
            pass
        assert not any(o is mine for o in gc.get_objects())   # still in the permanent generation
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())


def test_run_shard_freezes_inside_a_build_collector(monkeypatch):
    from flows import runners
    from funnelrag.memory import build_collector

    calls = []
    monkeypatch.setattr(runners, "release_memory", lambda freeze: calls.append(freeze))
    with build_collector():
        runners.run_shard(lambda: None, [])
    runners.run_shard(lambda: None, [])
    assert calls == [True, False]


def test_init_worker_sets_levels_environment_directory_stderr_lines_and_the_young_threshold(monkeypatch, tmp_path):
    """A pool worker's start: the parent's levels, environment (the forkserver's own is older) and
    directory, our loggers writing to the worker's stderr only (no Prefect handler), and the young
    collection threshold of a build."""
    import gc
    import logging
    import os
    import sys

    from flows.runners import init_worker
    from funnelrag.config import RUN_LOGGERS
    from funnelrag.memory import YOUNG_COLLECTION_OBJECTS

    old = gc.get_threshold()
    loggers = {n: (logging.getLogger(n).level, logging.getLogger(n).handlers[:], logging.getLogger(n).propagate)
               for n in RUN_LOGGERS}
    monkeypatch.setenv("FUNNELRAG_TEST_STALE", "forkserver's")
    monkeypatch.chdir(tmp_path.parent)
    environ = {k: v for k, v in os.environ.items() if k != "FUNNELRAG_TEST_STALE"}
    try:
        init_worker({"tasks": logging.DEBUG}, {**environ, "FUNNELRAG_TEST_PARENT": "pool start"}, str(tmp_path))
        assert gc.get_threshold() == (YOUNG_COLLECTION_OBJECTS, *old[1:])
        assert logging.getLogger("tasks").level == logging.DEBUG
        assert os.environ["FUNNELRAG_TEST_PARENT"] == "pool start" and "FUNNELRAG_TEST_STALE" not in os.environ
        assert os.getcwd() == str(tmp_path)
        for name in RUN_LOGGERS:
            handlers = logging.getLogger(name).handlers
            assert len(handlers) == 1 and handlers[0].stream is sys.stderr and not logging.getLogger(name).propagate
    finally:
        os.environ.pop("FUNNELRAG_TEST_PARENT", None)
        gc.set_threshold(*old)
        for name, (level, handlers, propagate) in loggers.items():
            logger = logging.getLogger(name)
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate = propagate


def test_a_failed_rename_of_a_finished_cache_entry_is_not_swallowed(tmp_path):
    """Only a concurrent writer's entry at ``cached`` is taken as done; a rename that fails for
    another reason (here: a file, not an entry, at that name) raises, naming both paths."""
    put_cached(tmp_path / "key", lambda tmp: (tmp / "COMPLETE").write_text("0\n"))
    put_cached(tmp_path / "key", lambda tmp: (tmp / "COMPLETE").write_text("0\n"))   # kept by another writer: fine
    (tmp_path / "blocked").write_text("not a cache entry")
    with pytest.raises(OSError, match="cannot move the finished .*blocked"):
        put_cached(tmp_path / "blocked", lambda tmp: (tmp / "COMPLETE").write_text("0\n"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked", "key"]   # no temporary directory left


def test_a_cache_writer_s_temp_name_carries_its_pid_first(tmp_path):
    """``put_cached``'s temp directory is ``.tmp-<pid>-<name>-<thread>``: the pid parsed back is the
    writer's, never its thread id."""
    seen = []
    put_cached(tmp_path / "key", lambda tmp: seen.append(tmp.name))
    parsed = parse_temp_name(seen[0])
    assert parsed is not None and parsed.pid == os.getpid() and parsed.label.startswith("key-")
