"""The segmentation memo's id-free rows, relabelled, are the rows segmentation makes for the
cluster under its new ids (whitespace tokens: no tokenizer file needed)."""
from __future__ import annotations

import numpy as np
import pytest
import pyarrow as pa

from data_contracts.base import parse_temp_name, temp_name
from funnelrag.content_store import text_keys
from tasks.corpus.sharded import segment_memo as SM
from tasks.corpus.segment import SegmentConfig, article_windows, document_key, segment_cluster, segments_to_tables
from tasks.corpus.tokenize import WhitespaceCounter

CFG = SegmentConfig(tokenizer="whitespace", passage_words=7, unit_max_tokens=20)
TEXTS = [("Alpha", " ".join(f"a{i}" for i in range(30))), ("Beta", ""), ("Gamma", "g " * 41),
         ("Delta", " ".join(f"d{i}" for i in range(3)))]


def _segments(cluster_id: int, doc_ids: list[int], order: list[int]):
    members = [(doc_ids[i], *TEXTS[k]) for i, k in enumerate(order)]
    return segment_cluster(cluster_id, members, CFG, WhitespaceCounter())


def _members(orders: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The parts' member text keys and windows of clusters whose members are ``TEXTS[k]`` for
    ``k`` in each order (what a segment shard hands to ``write_part``)."""
    texts = [TEXTS[k][1] for order in orders for k in order]
    return text_keys(texts), np.array([len(article_windows(t, CFG.passage_words)) for t in texts], np.int64)


def test_unlabelled_rows_relabel_to_the_rows_of_new_ids():
    """Two clusters segmented under old cluster and document ids, kept id-free, labelled with new
    ones, equal segmenting them under the new ids (passage and unit ids come from the titles and
    windows, the cluster id and doc id columns from tonight); the keys depend on the texts and
    counts only."""
    old = [_segments(3, [10, 11], [0, 1]), _segments(4, [12, 13], [2, 3])]
    units, passages, counts = SM.unlabel(old, [[10, 11], [12, 13]])
    assert counts.tolist() == [[len(s.units), len(s.passages)] for s in old]
    new_ids, new_docs = [12_345_678, 9], [[500, 7], [2, 600]]
    want = segments_to_tables([_segments(c, d, o) for c, d, o in zip(new_ids, new_docs, [[0, 1], [2, 3]])])
    titles = pa.array([TEXTS[k][0] for k in (0, 1, 2, 3)])
    got = SM.label(units, passages, counts, np.array(new_ids), np.array([0, 2]), np.array([500, 7, 2, 600]), titles)
    assert got[0].equals(want[0]) and got[1].equals(want[1])
    assert got[1].column("passage_id")[0].as_py() == f"{document_key('Alpha')}.p000"
    assert got[1].column("cluster_id")[0].as_py() == 12_345_678


def test_interleave_puts_each_cluster_back_in_its_place():
    segs = [_segments(c, [c * 10, c * 10 + 1], o) for c, o in ((1, [0, 3]), (2, [2, 0]), (3, [1, 2]))]
    whole = SM.unlabel(segs, [[c * 10, c * 10 + 1] for c in (1, 2, 3)])
    first = SM.unlabel([segs[1]], [[20, 21]])
    second = SM.unlabel([segs[0], segs[2]], [[10, 11], [30, 31]])
    units, passages, counts = SM.interleave(first, second, np.array([True, False, True]))
    assert units.equals(whole[0]) and passages.equals(whole[1]) and np.array_equal(counts, whole[2])


def test_cluster_keys_follow_texts_counts_and_order():
    texts = [t for _, t in TEXTS]
    tkeys = text_keys(texts)
    offsets = np.array([0, 2, 2, 4, 5])
    counts = np.array([7, 7, 7, 7, 3], np.int32)
    keys = SM.cluster_keys([(0, 2), (2, 4), (0, 2)], [0, 1, 2, 3], tkeys, offsets, counts)
    assert keys.shape == (3, 2) and keys.dtype == np.uint64
    assert np.array_equal(keys[0], keys[2]) and not np.array_equal(keys[0], keys[1])
    swapped = SM.cluster_keys([(0, 2)], [1, 0], tkeys, offsets, counts)
    assert not np.array_equal(swapped[0], keys[0])   # member order matters
    recounted = SM.cluster_keys([(0, 2)], [0, 1], tkeys, offsets, counts + 1)
    assert not np.array_equal(recounted[0], keys[0])
    edited = SM.cluster_keys([(0, 2)], [0, 1], text_keys([texts[0] + " more", texts[1]]), offsets, counts)
    assert not np.array_equal(edited[0], keys[0])   # a member's text matters


def test_the_memo_gives_back_each_texts_windows_by_its_key(tmp_path):
    """A text the last build cut, in whatever cluster, comes back as its windows (what
    article_windows cuts), looked up by its text key; a text the memo lacks, or one held with
    another number of windows, does not."""


    orders = [[0, 1], [2, 0], [3, 2]]   # "Alpha" and "Gamma" twice: kept once
    segs = [_segments(c, [c * 10, c * 10 + 1], order) for c, order in enumerate(orders)]
    units, passages, counts = SM.unlabel(segs, [[c * 10, c * 10 + 1] for c in range(len(orders))])
    part = tmp_path / "part"
    part.mkdir()
    SM.write_part(part, np.arange(6, dtype=np.uint64).reshape(3, 2), units, passages, counts, *_members(orders))
    SM.write_rows(part / SM.LABELLED_PASSAGES_FILE, pa.table({"text": passages.column("text").cast(pa.string())}))
    SM.write_memo(tmp_path / "memo", [part])
    memo = SM.SegmentMemo.open(tmp_path / "memo")
    texts = [t for _, t in TEXTS] + ["never cut"]
    windows = [len(article_windows(t, CFG.passage_words)) for t in texts]
    got = memo.document_windows(text_keys(texts), np.array(windows))
    assert got[:4] == [article_windows(t, CFG.passage_words) for t in texts[:4]] and got[4] is None
    assert got[1] == []   # "Beta" has no words: no window, but known
    assert memo.document_windows(text_keys(texts[:1]), np.array([windows[0] + 1])) == [None]
    with pytest.raises(ValueError, match="windows"):
        SM.write_part(part, np.arange(6, dtype=np.uint64).reshape(3, 2), units, passages, counts,
                      *_members(orders[:2]))


def test_memo_files_keep_whole_batches_night_after_night(tmp_path, monkeypatch):
    """Rows taken from a memo come as one slice per run; written as they came, every night's memo
    had smaller batches (80,240 batches of ~62 passages after three nights at 1M pages, a shard's
    rows ~7 CPU s to gather). The part and the memo are written in batches of MEMO_BATCH_ROWS,
    and the memo gives back the rows."""
    import pyarrow.ipc as ipc


    monkeypatch.setattr(SM, "MEMO_BATCH_ROWS", 8)
    n = 30
    segs = [_segments(c, [c * 10, c * 10 + 1], [c % 4, (c + 1) % 4]) for c in range(n)]
    units, passages, counts = SM.unlabel(segs, [[c * 10, c * 10 + 1] for c in range(n)])
    frag_units = pa.concat_tables([units.slice(i, 1) for i in range(units.num_rows)])
    frag_passages = pa.concat_tables([passages.slice(i, 1) for i in range(passages.num_rows)])
    assert frag_passages.column("text").num_chunks == passages.num_rows > 8
    part, memo = tmp_path / "part", tmp_path / "memo"
    part.mkdir()
    SM.write_part(part, np.arange(2 * n, dtype=np.uint64).reshape(n, 2), frag_units, frag_passages, counts,
                  *_members([[c % 4, (c + 1) % 4] for c in range(n)]))
    SM.write_rows(part / SM.LABELLED_PASSAGES_FILE, pa.table({"text": frag_passages.column("text").cast(pa.string())}))
    assert SM.write_memo(memo, [part]) == n
    for f in (part / SM.UNITS_FILE, part / SM.PASSAGES_FILE, memo / SM.UNITS_FILE, memo / SM.PASSAGES_FILE):
        reader = ipc.open_file(pa.memory_map(str(f)))
        assert reader.num_record_batches == -(-reader.read_all().num_rows // 8), f.name
    got_units, got_passages, got_counts = SM.SegmentMemo.open(memo).take(np.arange(n))
    assert got_units.combine_chunks().equals(units) and got_passages.combine_chunks().equals(passages)
    assert np.array_equal(got_counts, counts)


def test_a_memo_written_as_the_shards_are_read_equals_one_written_after(tmp_path):
    """The segment stage hands each shard's texts to the next memo as it reads them
    (MemoWriter.add with the text column) instead of reading them again after: the same files. A
    failed stage (abort) leaves the last memo and no temporary file."""

    from funnelrag.reaper import sweep_stale_temp_dirs

    parts = []
    for p in range(2):
        segs = [_segments(c, [c * 10, c * 10 + 1], [c % 3, (c + p) % 4]) for c in range(5 * p, 5 * p + 5)]
        units, passages, counts = SM.unlabel(segs, [[c * 10, c * 10 + 1] for c in range(5 * p, 5 * p + 5)])
        part = tmp_path / f"part{p}"
        part.mkdir()
        SM.write_part(part, np.arange(10 * p, 10 * p + 10, dtype=np.uint64).reshape(5, 2), units, passages, counts,
                      *_members([[c % 3, (c + p) % 4] for c in range(5 * p, 5 * p + 5)]))
        SM.write_rows(part / SM.LABELLED_PASSAGES_FILE, pa.table({"text": passages.column("text").cast(pa.string())}))
        parts.append(part)
    assert SM.write_memo(tmp_path / "after", parts) == 10
    writer = SM.MemoWriter(tmp_path / "streamed")
    for part in parts:
        writer.add(part, SM.read_rows(part / SM.LABELLED_PASSAGES_FILE).column("text"))
    assert writer.commit() == 10
    names = sorted(f.name for f in (tmp_path / "after").iterdir())
    assert names == sorted(f.name for f in (tmp_path / "streamed").iterdir()) and SM.PASSAGES_FILE in names
    for name in names:
        assert (tmp_path / "after" / name).read_bytes() == (tmp_path / "streamed" / name).read_bytes(), name
    before = {f.name: f.read_bytes() for f in (tmp_path / "after").iterdir()}
    failed = SM.MemoWriter(tmp_path / "after")
    failed.add(parts[0])
    failed.abort()
    assert {f.name: f.read_bytes() for f in (tmp_path / "after").iterdir()} == before
    assert not [f for f in tmp_path.iterdir() if f.name.startswith(".tmp-")]
    killed = SM.MemoWriter(tmp_path / "after")                # a stage killed after a shard: its files
    killed.add(parts[0])                                      # are in a temp directory the sweep knows
    (work,) = [f for f in tmp_path.iterdir() if f.name.startswith(".tmp-")]
    assert sweep_stale_temp_dirs(tmp_path) == [] and work.is_dir()   # this process is alive: kept
    dead = work.with_name(temp_name(parse_temp_name(work.name).label, pid=999_999_999))   # as if its process had died
    work.rename(dead)
    assert sweep_stale_temp_dirs(tmp_path) == [dead] and not dead.exists()
    with pytest.raises(ValueError, match="memo rows but"):
        SM.MemoWriter(tmp_path / "short").add(parts[0], pa.array(["only one"]))


def test_clusters_cut_straight_to_id_free_rows_equal_unlabelled_segments(data_mirror):
    """``segment_unlabeled`` (what a night's shards run for the clusters they cut) gives the rows
    ``unlabel(segment_cluster(...))`` gives, on the enwiki sample's text cut into articles of
    varied lengths (empty ones, windows longer than a unit) grouped into clusters of 1-6."""
    import bz2
    import re

    import pytest

    from funnelrag.datasets import resolve

    raw = bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes()).decode()
    words = re.sub(r"<[^>]+>|\{\{[^}]*\}\}|\[\[|\]\]|'''?", " ", raw).split()[:60_000]
    lengths, texts, at = (0, 3, 250, 40, 1_100, 7, 95, 0, 600), [], 0
    while at < len(words):
        n = lengths[len(texts) % len(lengths)]
        texts.append(" \n ".join(words[at:at + n]))
        at += max(n, 1)
    cfg = SegmentConfig(tokenizer="whitespace", passage_words=100, unit_max_tokens=350)
    counter = WhitespaceCounter()
    from tasks.corpus.segment import article_windows
    counts = [np.asarray(counter.count(article_windows(t, cfg.passage_words)), np.int32) for t in texts]
    clusters, doc_ids, d = [], [], 0
    while d < len(texts):
        size = 1 + (d * 7) % 6
        members = list(range(d, min(d + size, len(texts))))
        clusters.append(members)
        doc_ids.append([1_000 + m for m in members])
        d += size
    segs = [segment_cluster(9_000 + c, [(1_000 + m, f"T{m}", texts[m]) for m in ms], cfg, counter, [counts[m] for m in ms])
            for c, ms in enumerate(clusters)]
    want = SM.unlabel(segs, doc_ids)
    got = SM.segment_unlabeled(((9_000 + c, ids, [texts[m] for m in ms], [counts[m] for m in ms])
                                for c, (ms, ids) in enumerate(zip(clusters, doc_ids))), cfg, counter)
    assert len(clusters) > 50 and want[1].num_rows > 500 and max(u.position for s in segs for u in s.units) >= 3
    assert got[0].equals(want[0]) and got[1].equals(want[1]) and np.array_equal(got[2], want[2])
    empty = SM.segment_unlabeled([], cfg, counter)
    assert empty[0].num_rows == empty[1].num_rows == 0 and empty[2].shape == (0, 2)
    with pytest.raises(ValueError, match="cluster 5, doc 1001: 1 precomputed window token counts for 3 windows"):
        SM.segment_unlabeled([(5, [1_000, 1_001], [texts[0], texts[2]], [counts[0], np.ones(1, np.int32)])], cfg, counter)
