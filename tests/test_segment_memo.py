"""The segmentation memo keeps each cluster's rows under everything they are made of, and gives
them back as they are; the one segmentation (``segment_clusters``) makes the rows of every path
(whitespace tokens: no tokenizer file needed)."""
from __future__ import annotations

import numpy as np
import pytest
import pyarrow as pa

from data_contracts.base import parse_temp_name, temp_name
from funnelrag.content_store import text_keys
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
    rows ~7 CPU s to gather). The shard's rows and the memo are written in batches of
    MEMO_BATCH_ROWS, and the memo gives back each cluster's rows by its key."""
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
    assert SM.has_part(part)
    writer = SM.MemoWriter(memo)
    writer.add(part)
    assert writer.commit() == n
    for f in (part / SM.UNITS_FILE, part / SM.PASSAGES_FILE, memo / SM.UNITS_FILE, memo / SM.PASSAGES_FILE):
        reader = ipc.open_file(pa.memory_map(str(f)))
        assert reader.num_record_batches == -(-reader.read_all().num_rows // 8), f.name
    kept = SM.SegmentMemo.open(memo)
    found = kept.lookup(np.concatenate([keys[[4, 0]], [[999, 999]]]).astype(np.uint64))
    assert found[2] == -1
    got_units, got_passages, got_counts = kept.take(found[:2])
    want = _rows([clusters[4], clusters[0]])
    assert got_units.combine_chunks().equals(want[0]) and got_passages.combine_chunks().equals(want[1])
    assert np.array_equal(got_counts, want[2])


def test_a_memo_written_as_the_shards_are_read_equals_one_read_from_the_parts(tmp_path):
    """The segment stage hands each shard's rows to the next memo as it reads them
    (MemoWriter.add with the tables) instead of reading them again: the same files. A failed
    stage (abort) leaves the last memo and no temporary file."""
    from funnelrag.reaper import sweep_stale_temp_dirs

    parts = [_part(tmp_path / f"part{p}", [(c, [c % 3, 3][::1 - 2 * p]) for c in range(5 * p, 5 * p + 5)], 5 * p)
             for p in range(2)]
    after = SM.MemoWriter(tmp_path / "after")
    for part, *_ in parts:
        after.add(part)
    assert after.commit() == 10
    streamed = SM.MemoWriter(tmp_path / "streamed")
    for part, units, passages, _ in parts:
        streamed.add(part, units, passages)
    assert streamed.commit() == 10
    names = sorted(f.name for f in (tmp_path / "after").iterdir())
    assert names == sorted(f.name for f in (tmp_path / "streamed").iterdir()) and SM.PASSAGES_FILE in names
    for name in names:
        assert (tmp_path / "after" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes(), name
    before = {f.name: f.read_bytes() for f in (tmp_path / "after").iterdir()}
    failed = SM.MemoWriter(tmp_path / "after")
    failed.add(parts[0][0])
    failed.abort()
    assert {f.name: f.read_bytes() for f in (tmp_path / "after").iterdir()} == before
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".tmp-")]
    killed = SM.MemoWriter(tmp_path / "after")                # a stage killed after a shard: its files
    killed.add(parts[0][0])                                   # are in a temp directory the sweep knows
    (work,) = [f for f in tmp_path.iterdir() if f.name.startswith(".tmp-")]
    assert sweep_stale_temp_dirs(tmp_path) == [] and work.is_dir()   # this process is alive: kept
    dead = work.with_name(temp_name(parse_temp_name(work.name).label, pid=999_999_999))   # as if its process had died
    work.rename(dead)
    assert sweep_stale_temp_dirs(tmp_path) == [dead] and not dead.exists()
    with pytest.raises(ValueError, match="passages but passages.arrow holds"):
        SM.MemoWriter(tmp_path / "short").add(parts[0][0], parts[0][1], parts[0][2].slice(0, 1))


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
