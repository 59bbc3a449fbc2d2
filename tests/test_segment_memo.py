"""The segmentation memo keeps each cluster's rows under everything they are made of, and gives
them back as they are; the one segmentation (``segment_clusters``) makes the rows of every path
(whitespace tokens: no tokenizer file needed)."""
from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest
import pyarrow as pa

from funnelrag.content_store import text_keys
from funnelrag.verify import DIGESTS_FILE, record_digests
from tasks.corpus.sharded import segment_memo as SM
from tasks.corpus.segment import SegmentConfig, segment_cluster, segment_clusters, segments_to_tables
from tasks.corpus.tokenize import WhitespaceCounter

CFG = SegmentConfig(tokenizer="whitespace", passage_words=7, unit_max_tokens=20)
TEXTS = [("Alpha", " ".join(f"a{i}" for i in range(30))), ("Beta", ""), ("Gamma", "g " * 41),
         ("Delta", " ".join(f"d{i}" for i in range(3)))]


def _rows(clusters: list[tuple[int, list[int]]]) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """The rows of clusters ``(cluster_id, order)`` whose members are ``TEXTS[k]`` for ``k`` in
    ``order``, titled ``"<title> (<cluster_id>)"`` (a title is in one cluster), document ids ``100 + k``."""
    return segment_clusters([(c, [100 + k for k in order], [f"{TEXTS[k][0]} ({c})" for k in order],
                              [TEXTS[k][1] for k in order], None) for c, order in clusters], CFG, WhitespaceCounter())


def _part(directory, clusters: list[tuple[int, list[int]]], first_key: int = 0):
    """A segment shard's cache entry holding the rows and part of ``clusters``."""
    units, passages, counts = _rows(clusters)
    directory.mkdir()
    SM.write_rows(directory / SM.UNITS_FILE, units)
    SM.write_rows(directory / SM.PASSAGES_FILE, passages)
    n = len(clusters)
    SM.write_part(directory, np.arange(2 * first_key, 2 * (first_key + n), dtype=np.uint64).reshape(n, 2), counts)
    return directory, units, passages, counts


def test_segment_clusters_makes_the_rows_of_segment_cluster():
    """One segmentation: the rows of ``segment_clusters`` are those ``segment_cluster`` (query time)
    gives as objects; each cluster's counts are its units and passages."""
    clusters = [(3, [0, 1]), (12_345_678, [2, 3]), (4, [1])]
    units, passages, counts = _rows(clusters)
    segs = [segment_cluster(c, [(100 + k, f"{TEXTS[k][0]} ({c})", TEXTS[k][1]) for k in order], CFG, WhitespaceCounter())
            for c, order in clusters]
    want = segments_to_tables(segs)
    assert units.equals(want[0]) and passages.equals(want[1])
    assert counts.tolist() == [[len(s.units), len(s.passages)] for s in segs] and counts[2].tolist() == [0, 0]
    empty = segment_clusters([], CFG, WhitespaceCounter())
    assert empty[0].num_rows == empty[1].num_rows == 0 and empty[2].shape == (0, 2)


def test_interleave_puts_each_cluster_back_in_its_place():
    clusters = [(1, [0, 3]), (2, [2, 0]), (3, [1, 2])]
    whole = _rows(clusters)
    first, second = _rows([clusters[1]]), _rows([clusters[0], clusters[2]])
    units, passages, counts = SM.interleave(first, second, np.array([True, False, True]))
    assert units.equals(whole[0]) and passages.equals(whole[1]) and np.array_equal(counts, whole[2])


def test_cluster_keys_follow_every_input_of_the_rows():
    """A cluster's key changes with its id, its members' order, ids, titles, texts and token
    counts: a stored row is used as it is only when all of them are the same."""
    titles = pa.array([t for t, _ in TEXTS])
    texts = [t for _, t in TEXTS]
    tkeys, doc_ids = text_keys(texts), np.array([100, 101, 102, 103])
    offsets = np.array([0, 2, 2, 4, 5])
    counts = np.array([7, 7, 7, 7, 3], np.int32)

    def key(bounds=((0, 2),), rows=(0, 1), cids=(7,), ids=doc_ids, names=titles, keys=tkeys, n=counts):
        return SM.cluster_keys(list(bounds), list(rows), np.array(cids), ids, names, keys, offsets, n)

    keys = key(bounds=((0, 2), (2, 4), (0, 2)), rows=(0, 1, 2, 3), cids=(7, 8, 7))
    assert keys.shape == (3, 2) and keys.dtype == np.uint64
    assert np.array_equal(keys[0], keys[2]) and not np.array_equal(keys[0], keys[1])
    assert np.array_equal(key()[0], keys[0])
    changed = {"cluster id": key(cids=(9,)), "member order": key(rows=(1, 0)),
               "doc id": key(ids=np.array([100, 555, 102, 103])),
               "title": key(names=pa.array(["Alpha (renamed)", "Beta", "Gamma", "Delta"])),
               "text": key(keys=text_keys([texts[0] + " more", *texts[1:]])), "token counts": key(n=counts + 1)}
    for what, other in changed.items():
        assert not np.array_equal(other[0], keys[0]), what


def test_memo_rows_come_back_as_they_were_written_in_whole_batches(tmp_path, monkeypatch):
    """Rows taken from a memo come as one slice per run; written as they came, every night's memo
    had smaller batches (80,240 batches of ~62 passages after three nights at 1M pages, a shard's
    rows ~7 CPU s to gather). A shard's rows are written in batches of MEMO_BATCH_ROWS, and the
    memo (a manifest naming the shard's entry) gives back each cluster's rows by its key."""
    import pyarrow.ipc as ipc

    monkeypatch.setattr(SM, "MEMO_BATCH_ROWS", 8)
    n = 30
    clusters = [(c, [c % 4, (c + 1) % 4]) for c in range(n)]
    units, passages, counts = _rows(clusters)
    frag_units = pa.concat_tables([units.slice(i, 1) for i in range(units.num_rows)])
    frag_passages = pa.concat_tables([passages.slice(i, 1) for i in range(passages.num_rows)])
    assert frag_passages.column("text").num_chunks == passages.num_rows > 8
    part, memo = tmp_path / "part", tmp_path / "memo"
    part.mkdir()
    SM.write_rows(part / SM.UNITS_FILE, frag_units)
    SM.write_rows(part / SM.PASSAGES_FILE, frag_passages)
    keys = np.arange(2 * n, dtype=np.uint64).reshape(n, 2)[::-1].copy()   # not in key order
    SM.write_part(part, keys, counts)
    record_digests(part)
    assert SM.has_part(part)
    assert SM.write_manifest(memo, [part]) == 1
    for f in (part / SM.UNITS_FILE, part / SM.PASSAGES_FILE):
        reader = ipc.open_file(pa.memory_map(str(f)))
        assert reader.num_record_batches == -(-reader.read_all().num_rows // 8), f.name
    kept = SM.SegmentMemo.open(memo)
    found = kept.lookup(np.concatenate([keys[[4, 0]], [[999, 999]]]).astype(np.uint64))
    assert found[2] == -1 and len(kept) == n
    got_units, got_passages, got_counts = kept.take(found[:2])
    want = _rows([clusters[4], clusters[0]])
    assert got_units.combine_chunks().equals(want[0]) and got_passages.combine_chunks().equals(want[1])
    assert np.array_equal(got_counts, want[2])


def _entry(directory, clusters, first_key):
    """:func:`_part` with its digests recorded: a segment shard's cache entry as the build leaves it."""
    out = _part(directory, clusters, first_key)
    record_digests(directory)
    return out


def test_the_memo_names_the_parts_and_skips_one_gone_or_altered(tmp_path, caplog):
    """The memo is a manifest of the last build's shard entries (no row copied): lookups and takes
    run over their concatenation, across parts, a key two parts hold giving equal rows. A part gone
    or whose digests differ from the manifest's is skipped with a WARNING naming it (its clusters
    are then cut again); a part of other bytes is discarded when the build checks the memo
    (verify_memo), a memo of other bytes too; a part whose counts and rows disagree is an error
    naming it."""
    root = tmp_path / "segment-shards"
    root.mkdir()
    groups = [[(c, [c % 3, 3][::1 - 2 * (p % 2)]) for c in range(4 * p, 4 * p + 4)] for p in range(3)]
    parts = [_entry(root / f"part{p}", g, 4 * p) for p, g in enumerate(groups)]
    shared = _entry(root / "again", groups[1][:2], 4)   # the same two clusters under the same keys
    memo = SM.memo_dir(root, CFG)
    assert SM.write_manifest(memo, [parts[0][0], parts[1][0], shared[0], parts[2][0], parts[0][0]]) == 4
    assert sorted(f.name for f in memo.iterdir()) == sorted([SM.MANIFEST_FILE, DIGESTS_FILE, SM.INDEX_KEYS_FILE,
                                                             SM.INDEX_ROWS_FILE, SM.COUNTS_FILE])   # no row copied
    assert [(p.name, n) for p, _, n in SM.listed_parts(memo)] == [("part0", 4), ("part1", 4), ("again", 2), ("part2", 4)]
    keys = np.arange(24, dtype=np.uint64).reshape(12, 2)
    kept = SM.SegmentMemo.open(memo)
    asked = keys[[9, 2, 5, 0, 11, 4]]
    got = kept.take(kept.lookup(asked))
    want = _rows([groups[k // 4][k % 4] for k in (9, 2, 5, 0, 11, 4)])
    assert got[0].combine_chunks().equals(want[0]) and got[1].combine_chunks().equals(want[1])
    assert np.array_equal(got[2], want[2]) and kept.take(np.zeros(0, np.int64))[1].num_rows == 0

    shutil.rmtree(parts[2][0])                                     # pruned by retention
    (root / "part0" / "spare.txt").write_text("x\n")                # an entry replaced: other digests
    record_digests(root / "part0")
    with caplog.at_level(logging.WARNING):
        kept = SM.SegmentMemo.open(memo)
    logged = caplog.text
    assert f"part {root / 'part2'} skipped: missing" in logged and f"part {root / 'part0'} skipped" in logged
    assert "digests.json differs" in logged
    assert kept.lookup(keys).tolist()[:4] == [-1] * 4 and (kept.lookup(keys)[4:8] >= 0).all()
    assert (kept.lookup(keys)[8:] == -1).all()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert SM.SegmentMemo.open(memo, warn=False) is not None and not caplog.text   # the shards: quiet

    data = bytearray((root / "part1" / SM.PASSAGES_FILE).read_bytes())   # a same-size flip in a part
    data[len(data) // 2] ^= 1
    (root / "part1" / SM.PASSAGES_FILE).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        assert SM.verify_memo(memo) == [root / "again"]
    assert f"cache entry {root / 'part1'} discarded" in caplog.text and not (root / "part1").exists()
    for fault in ("flip", "truncate", "delete"):   # the manifest: the memo is discarded, every cluster cut
        SM.write_manifest(memo, [root / "again"])
        data = bytearray((memo / SM.MANIFEST_FILE).read_bytes())
        data[len(data) // 2] ^= 1
        if fault == "delete":
            (memo / SM.MANIFEST_FILE).unlink()
        else:
            (memo / SM.MANIFEST_FILE).write_bytes(bytes(data if fault == "flip" else data[:len(data) // 2]))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert SM.verify_memo(memo) == [] and not memo.exists() and SM.SegmentMemo.open(memo) is None
        assert f"cache entry {memo} discarded" in caplog.text, fault

    short = root / "short"
    _entry(short, groups[0], 0)
    SM.write_part(short, keys[:4], np.array([[1, 1]] * 4))   # counts of other rows
    record_digests(short)
    SM.write_manifest(memo, [short])
    broken = SM.SegmentMemo.open(memo)
    with pytest.raises(ValueError, match=f"{short}: its clusters have 4 units but units.arrow holds"):
        broken.take(np.array([0]))
    with pytest.raises(ValueError, match="not a cache entry"):
        SM.write_manifest(memo, [tmp_path])


def test_segment_clusters_on_the_enwiki_sample_equals_segment_cluster(data_mirror):
    """On the enwiki sample's text cut into articles of varied lengths (empty ones, windows longer
    than a unit) grouped into clusters of 1-6, with precomputed counts: the rows of
    ``segment_clusters`` (the build, whole or in shards) are those of ``segment_cluster`` (query
    time); counts that do not match a member's windows name the cluster and the document."""
    import bz2
    import re

    from funnelrag.datasets import resolve
    from tasks.corpus.segment import article_windows

    raw = bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes()).decode()
    words = re.sub(r"<[^>]+>|\{\{[^}]*\}\}|\[\[|\]\]|'''?", " ", raw).split()[:60_000]
    lengths, texts, at = (0, 3, 250, 40, 1_100, 7, 95, 0, 600), [], 0
    while at < len(words):
        n = lengths[len(texts) % len(lengths)]
        texts.append(" \n ".join(words[at:at + n]))
        at += max(n, 1)
    cfg = SegmentConfig(tokenizer="whitespace", passage_words=100, unit_max_tokens=350)
    counter = WhitespaceCounter()
    counts = [np.asarray(counter.count(article_windows(t, cfg.passage_words)), np.int32) for t in texts]
    clusters, d = [], 0
    while d < len(texts):
        size = 1 + (d * 7) % 6
        clusters.append(list(range(d, min(d + size, len(texts)))))
        d += size
    segs = [segment_cluster(9_000 + c, [(1_000 + m, f"T{m}", texts[m]) for m in ms], cfg, counter, [counts[m] for m in ms])
            for c, ms in enumerate(clusters)]
    want = segments_to_tables(segs)
    got = segment_clusters(((9_000 + c, [1_000 + m for m in ms], [f"T{m}" for m in ms], [texts[m] for m in ms],
                             [counts[m] for m in ms]) for c, ms in enumerate(clusters)), cfg, counter)
    assert len(clusters) > 50 and want[1].num_rows > 500 and max(u.position for s in segs for u in s.units) >= 3
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    with pytest.raises(ValueError, match="cluster 5, doc 1001: 1 precomputed window token counts for 3 windows"):
        segment_clusters([(5, [1_000, 1_001], ["A", "B"], [texts[0], texts[2]], [counts[0], np.ones(1, np.int32)])],
                         cfg, counter)


@pytest.fixture(scope="module")
def enwiki_clusters(data_mirror, tmp_path_factory):
    """The enwiki sample ingested, its whitespace window tokens and its clusters."""
    from funnelrag.datasets import resolve
    from tasks.corpus import stages as S
    from tasks.corpus.clustering import ClusteringConfig
    from tasks.sources.ingest import IngestConfig, ingest

    out = tmp_path_factory.mktemp("enwiki-memo")
    ingest([resolve("enwiki-sample", data_mirror)], out / "ingest", IngestConfig(format="mediawiki"))
    cfg = SegmentConfig(tokenizer="whitespace")
    S.run_tokens(out / "ingest", out / "tokens", cfg, data_mirror)
    S.run_cluster(out / "ingest", out / "tokens", out / "cluster", ClusteringConfig(max_tokens=8192, tokenizer="whitespace"))
    return out / "ingest", out / "tokens", out / "cluster"


@pytest.mark.parametrize("fault", ["none", "missing", "altered", "flipped"])
def test_a_second_build_takes_its_clusters_from_the_parts_the_memo_names(enwiki_clusters, data_mirror, tmp_path,
                                                                         fault, caplog):
    """Build 1 leaves its shard entries and a manifest naming them; build 2 cuts other shards (so no
    shard entry is reused whole) and takes every cluster from build 1's parts, with the bytes of a
    build without a memo. A part missing, replaced (other digests) or of other bytes: its clusters
    are cut again, the same bytes, and a WARNING names it; build 2's memo names build 2's entries."""
    from data_contracts.base import sha256_file
    from tasks.corpus.sharded.shards import run_here, run_segment_sharded

    cfg, cache = SegmentConfig(tokenizer="whitespace"), tmp_path / "cache"
    first = run_segment_sharded(*enwiki_clusters, tmp_path / "first", cfg, data_mirror, run_here, 40_000, cache_dir=cache)
    memo = SM.memo_dir(cache, cfg)
    parts = [p for p, *_ in SM.listed_parts(memo)]
    assert len(parts) == first["shards"] > 2 and first["clusters_reused"] == 0 and first["memo_write_cpu_seconds"] >= 0
    victim = parts[1]
    lost = len(np.load(victim / SM.KEYS_FILE))
    if fault == "missing":
        shutil.rmtree(victim)
    elif fault == "altered":
        (victim / "note.txt").write_text("another entry under this name\n")
        record_digests(victim)
    elif fault == "flipped":
        data = bytearray((victim / SM.PASSAGES_FILE).read_bytes())
        data[len(data) // 2] ^= 1
        (victim / SM.PASSAGES_FILE).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        second = run_segment_sharded(*enwiki_clusters, tmp_path / "second", cfg, data_mirror, run_here, 25_000,
                                     cache_dir=cache)
    fresh = run_segment_sharded(*enwiki_clusters, tmp_path / "fresh", cfg, data_mirror, run_here, 25_000)
    assert fresh["clusters_reused"] == 0 and fresh["memo_verify_cpu_seconds"] == 0
    assert second["shards_reused"] == 0 and second["shards"] != first["shards"]
    assert second["clusters_reused"] == second["clusters"] - (lost if fault != "none" else 0)
    for name in ("document_units.parquet", "passages.parquet"):
        assert sha256_file(tmp_path / "second" / name) == sha256_file(tmp_path / "fresh" / name)
        assert sha256_file(tmp_path / "second" / name) == sha256_file(tmp_path / "first" / name)
    if fault == "none":
        assert str(victim) not in caplog.text
    else:
        reason = {"missing": "skipped: missing", "altered": "digests.json differs", "flipped": "discarded"}[fault]
        assert str(victim) in caplog.text and reason in caplog.text, caplog.text
    assert len(SM.listed_parts(memo)) == second["shards"] and not {p for p, *_ in SM.listed_parts(memo)} & set(parts)
