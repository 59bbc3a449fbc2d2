"""Passage windows, document-unit packing, ids and corpus tables (tasks.corpus.segment, tasks.corpus.tokenize)."""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_contracts.base import ContractViolation
from data_contracts.corpus import DOCUMENT_UNITS, PASSAGES
from tasks.corpus.segment import (SegmentConfig, article_windows, count_window_tokens, document_key, pack_units,
                                  passage_id, segment_cluster, segment_clusters, segment_corpus, segments_to_tables,
                                  unit_id, window_id, window_ids)
from tasks.corpus.tokenize import WhitespaceCounter, load_token_counter

WS = WhitespaceCounter()


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def test_article_windows_cut_every_n_words_last_shorter():
    text = words(250)
    windows = article_windows(text, 100)
    assert [len(w.split()) for w in windows] == [100, 100, 50]
    assert " ".join(windows) == text
    assert windows[1].split()[0] == "w100"


def test_article_windows_normalise_whitespace_and_empty_text():
    assert article_windows("a\tb\n\n c\u00a0d  e ", 2) == ["a b", "c d", "e"]
    assert article_windows("", 100) == []
    assert article_windows(" \n\t ", 100) == []


@pytest.mark.parametrize("tokens,limit,bounds", [
    ([300, 300, 300, 300], 1024, [0, 3, 4]),
    ([512, 512, 1], 1024, [0, 2, 3]),       # exact fit stays in the unit
    ([2000, 10, 10], 1024, [0, 1, 3]),      # an over-long window is its own unit
    ([10, 2000, 10], 1024, [0, 1, 2, 3]),
    ([], 1024, [0]),
])
def test_pack_units_greedy(tokens, limit, bounds):
    assert pack_units(tokens, limit) == bounds


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 400), max_size=40), st.integers(1, 600))
def test_pack_units_invariants(tokens, limit):
    bounds = pack_units(tokens, limit)
    assert bounds[0] == 0 and bounds[-1] == len(tokens)
    assert all(a < b for a, b in zip(bounds, bounds[1:]))  # contiguous, non-empty units
    for a, b in zip(bounds, bounds[1:]):
        assert sum(tokens[a:b]) <= limit or b - a == 1
        if b < len(tokens):  # greedy: the next window did not fit
            assert sum(tokens[a:b + 1]) > limit


def test_segment_cluster_ids_order_and_spanning_units():
    cfg = SegmentConfig(passage_words=10, unit_max_tokens=25, tokenizer="whitespace")
    members = [(7, "Alpha", words(23, "a")), (3, "Beta", ""), (5, "Gamma", words(12, "g"))]
    seg = segment_cluster(42, members, cfg, WS)
    # windows: a(10) a(10) a(3) | g(10) g(2) -> units [10, 10, 3] [10, 2]
    a, g = document_key("Alpha"), document_key("Gamma")
    assert a == hashlib.blake2b(b"Alpha", digest_size=8).hexdigest() and len(a) == 16
    assert [u.unit_id for u in seg.units] == [f"{a}.u000", f"{g}.u000"]
    assert [u.n_tokens for u in seg.units] == [23, 12]
    # ids name (article, window): the cluster does not enter them
    assert [p.passage_id for p in seg.passages] == [f"{a}.p000", f"{a}.p001", f"{a}.p002", f"{g}.p000", f"{g}.p001"]
    assert [p.unit_id for p in seg.passages] == [f"{a}.u000"] * 3 + [f"{g}.u000"] * 2
    assert [p.doc_id for p in seg.passages] == [7, 7, 7, 5, 5]
    assert [p.title for p in seg.passages] == ["Alpha"] * 3 + ["Gamma"] * 2
    assert [p.n_words for p in seg.passages] == [10, 10, 3, 10, 2]
    assert seg.units[0].title == "Alpha" and seg.units[1].title == "Gamma"
    assert seg.units[0].text == words(23, "a")
    # a unit spans articles when they fit
    wide = segment_cluster(42, members, SegmentConfig(passage_words=10, unit_max_tokens=1000, tokenizer="whitespace"), WS)
    assert len(wide.units) == 1 and {p.doc_id for p in wide.passages} == {5, 7}
    assert [p.unit_id for p in wide.passages] == [f"{a}.u000"] * 5   # a unit spanning articles: its first one's


def test_an_article_keeps_its_passage_ids_in_another_cluster_and_position():
    """A passage's id depends on its article and window only: the same article in another cluster,
    after other members, keeps its ids while its units (and their ids) follow the packing."""
    cfg = SegmentConfig(passage_words=10, unit_max_tokens=25, tokenizer="whitespace")
    beta = (8, "Beta", words(21, "b"))
    alone = segment_cluster(1, [beta], cfg, WS)
    later = segment_cluster(99, [(2, "Alpha", words(15, "a")), (40, "Beta", words(21, "b"))], cfg, WS)
    ids = [p.passage_id for p in alone.passages]
    assert ids == [p.passage_id for p in later.passages if p.title == "Beta"] == [
        f"{document_key('Beta')}.p{w:03d}" for w in range(3)]
    assert {p.doc_id for p in later.passages if p.title == "Beta"} == {40}   # the row's doc_id is tonight's


def test_segment_cluster_rejects_wrong_tokenizer_and_counts():
    with pytest.raises(ValueError, match="tokenizer is 't5' but the token counter is 'whitespace'"):
        segment_cluster(0, [(0, "A", "x y")], SegmentConfig(), WS)
    cfg = SegmentConfig(tokenizer="whitespace")
    with pytest.raises(ValueError, match="doc 0: 2 precomputed window token counts for 1 windows"):
        segment_cluster(0, [(0, "A", "x y")], cfg, WS, window_tokens=[np.array([1, 1])])
    with pytest.raises(ValueError, match="unknown tokenizer"):
        load_token_counter("gpt-x", None)
    with pytest.raises(ValueError, match="passage_words"):
        SegmentConfig(passage_words=0)


ROW_ORDER = (3, 1, 0, 2, 4)   # the documents table's rows: ids that do not follow the rows, on purpose


def _tiny_corpus():
    texts = [words(230, "a"), "", words(40, "c"), words(150, "d"), words(5, "e")]
    documents = pa.table({"doc_id": pa.array(ROW_ORDER, pa.int64()),
                          "title": [f"T{i}" for i in ROW_ORDER],
                          "text": [texts[i] for i in ROW_ORDER]})
    members = pa.table({"cluster_id": pa.array([1, 0, 0, 1, 2], pa.int32()),
                        "position": pa.array([1, 0, 1, 0, 0], pa.int32()),
                        "doc_id": pa.array([4, 2, 0, 3, 1], pa.int32())})
    return texts, documents, members


def test_segment_corpus_tables_and_precomputed_counts(tmp_path):
    texts, documents, members = _tiny_corpus()
    cfg = SegmentConfig(passage_words=100, unit_max_tokens=120, tokenizer="whitespace")
    wt = count_window_tokens(texts, cfg, WS, batch_windows=2)
    assert wt.article_tokens().tolist() == [230, 0, 40, 150, 5]
    assert wt.n_windows().tolist() == [3, 0, 1, 2, 1]
    from_table = count_window_tokens(documents, cfg, WS)  # in the table's row order, whatever its ids
    by_row = count_window_tokens([texts[i] for i in ROW_ORDER], cfg, WS)
    assert np.array_equal(from_table.n_tokens, by_row.n_tokens) and np.array_equal(from_table.indptr, by_row.indptr)
    out = segment_corpus(documents, members, cfg, WS)
    again = segment_corpus(documents, members, cfg, WS, window_tokens=from_table)
    assert out.units.equals(again.units) and out.passages.equals(again.passages)
    assert out.n_articles_without_passages == 1
    # cluster 0 = [doc 2 (40 words), doc 0 (230)]: windows 40 | 100 100 30; limit 120:
    # 40 + 100 > 120 -> [40], [100], then 100 + 30 > 120 -> [100], [30]
    units = out.units.to_pylist()
    t0, t2, t3 = document_key("T0"), document_key("T2"), document_key("T3")
    assert [(u["unit_id"], u["n_tokens"], u["n_passages"], u["title"]) for u in units if u["cluster_id"] == 0] == [
        (f"{t2}.u000", 40, 1, "T2"), (f"{t0}.u000", 100, 1, "T0"),
        (f"{t0}.u001", 100, 1, "T0"), (f"{t0}.u002", 30, 1, "T0")]
    # cluster 1 = [doc 3 (150), doc 4 (5)]: windows 100 50 5 -> [100] [50 5]
    assert [(u["unit_id"], u["n_passages"]) for u in units if u["cluster_id"] == 1] == [
        (f"{t3}.u000", 1), (f"{t3}.u001", 2)]
    assert not [u for u in units if u["cluster_id"] == 2]  # the empty article: no unit, counted
    passages = out.passages.to_pylist()
    for d, text in enumerate(texts):  # passages of an article rebuild its text in order
        assert " ".join(p["text"] for p in passages if p["doc_id"] == d) == " ".join(text.split())
    for contract, table in ((DOCUMENT_UNITS, out.units), (PASSAGES, out.passages)):
        contract.write(table, tmp_path)
        assert contract.read(tmp_path).equals(table)
    wrong = out.passages.set_column(1, "unit_id", pa.array(["c0000009.u000"] * out.passages.num_rows))
    with pytest.raises(ContractViolation, match="unit_id is not a content id"):
        PASSAGES.validate(wrong)


def test_segment_corpus_rejects_inconsistent_inputs():
    texts, documents, members = _tiny_corpus()
    cfg = SegmentConfig(tokenizer="whitespace")
    with pytest.raises(ValueError, match="document 1 is in 0 clusters"):
        segment_corpus(documents, members.slice(0, 4), cfg, WS)
    dup = pa.concat_tables([members, members.slice(0, 1)])
    with pytest.raises(ValueError, match="document 4 is in 2 clusters"):
        segment_corpus(documents, dup, cfg, WS)
    with pytest.raises(ValueError, match="a member is not a document .documents: id 3 is not in the table"):
        segment_corpus(documents.slice(1), members, cfg, WS)   # row 0 holds doc_id 3
    bad = count_window_tokens(texts[:4], cfg, WS)
    with pytest.raises(ValueError, match="over 4 documents"):
        segment_corpus(documents, members, cfg, WS, window_tokens=bad)


def test_a_tokenizer_file_is_loaded_once_a_process_and_again_when_it_changes(data_mirror, tmp_path):
    """Build workers run shard after shard: the T5 counter is loaded once (same object), and a
    mirror whose tokenizer file changed gets a counter of the new file."""
    import os
    import shutil

    from funnelrag.datasets import resolve

    first = load_token_counter("t5", data_mirror)
    assert load_token_counter("t5", data_mirror) is first
    assert first.count(["Hello world"]).tolist() == [2]
    mirror = tmp_path / "mirror"
    src = resolve("t5-tokenizer", data_mirror)
    rel = src.relative_to(data_mirror)
    (mirror / rel).parent.mkdir(parents=True)
    shutil.copy2(src, mirror / rel)
    copy = load_token_counter("t5", mirror)
    assert copy is not first and copy.path == mirror / rel
    assert load_token_counter("t5", mirror) is copy
    st = (mirror / rel).stat()
    os.utime(mirror / rel, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert load_token_counter("t5", mirror) is not copy


# ------------------------------------------- the columnar segmentation against a per-window reference
SEPARATORS = (" ", "  ", "\t", "\n", " \n\t", "\u00a0", "\u2003", "\x1c", "\u3000 ")   # str.split()'s whitespace
VOCABULARY = ("a", "bé", "日本", "x\u200by", "ß-ſ", "w")   # "\u200b" is no whitespace: it stays inside a word


def _text(rng: np.random.Generator, n_words: int) -> str:
    """``n_words`` words joined by random (Unicode) whitespace, with some around them."""
    seps = [SEPARATORS[i] for i in rng.integers(0, len(SEPARATORS), n_words + 1)]
    body = "".join(f"{VOCABULARY[rng.integers(len(VOCABULARY))]}{i}{seps[i + 1]}" for i in range(n_words))
    return (seps[0] if rng.random() < 0.5 else "") + (body if rng.random() < 0.5 else body.rstrip())


def _random_clusters(seed: int, cfg: SegmentConfig, counted: str) -> list[tuple]:
    """Clusters of 1-5 members with empty, whitespace-only, short and long articles; one cluster
    whose members have no word, one of a single article of > 1,000 windows; precomputed window
    counts drawn at random (so windows longer than the unit limit come up), or ``None`` (to count)
    in every cluster (``counted`` ``"all"``) or every other one (``"some"``)."""
    rng = np.random.default_rng(seed)
    clusters, title = [], 0
    for c in range(12):
        n_members = 1 if c % 4 == 0 else int(rng.integers(1, 6))
        if c == 5:
            texts = ["", " \n\t\u00a0", "\x1c\u2003"]
        elif c == 7:
            texts = [_text(rng, 1000 * cfg.passage_words + int(rng.integers(1, 2 * cfg.passage_words)))]
        else:
            texts = [("" if rng.random() < 0.5 else "\u2003 \n") if rng.random() < 0.15
                     else _text(rng, int(rng.integers(1, 6 * cfg.passage_words))) for _ in range(n_members)]
        titles = [f"Title {seed}/{title + m} \u00e9" for m in range(len(texts))]
        title += len(texts)
        doc_ids = [int(d) for d in rng.integers(0, 10**12, len(texts))]
        tokens = None if counted == "all" or (counted == "some" and c % 2) else [rng.integers(0, 3 * cfg.unit_max_tokens // 2 + 2, len(article_windows(t, cfg.passage_words))
                                                    ).astype(np.int32) for t in texts]
        clusters.append((int(rng.integers(0, 10**12)), doc_ids, titles, texts, tokens))
    return clusters


def _reference(clusters: list[tuple], cfg: SegmentConfig) -> tuple[list[dict], list[dict], list[tuple[int, int]]]:
    """The rows, window by window, from the documented pieces: ``article_windows``, ``pack_units``,
    ``unit_id`` and ``passage_id`` (the whitespace counter for counted windows)."""
    units, passages, counts = [], [], []
    for cid, doc_ids, titles, texts, tokens in clusters:
        windows = [(m, w, text) for m, article in enumerate(texts)
                   for w, text in enumerate(article_windows(article, cfg.passage_words))]
        n_tokens = [len(text.split()) for _, _, text in windows] if tokens is None else [int(t) for ts in tokens for t in ts]
        bounds = pack_units(n_tokens, cfg.unit_max_tokens)
        for position, (a, b) in enumerate(zip(bounds, bounds[1:])):
            m, w, _ = windows[a]
            uid = unit_id(titles[m], w)
            units.append({"unit_id": uid, "cluster_id": cid, "position": position, "n_tokens": sum(n_tokens[a:b]),
                          "n_passages": b - a, "title": titles[m]})
            passages += [{"passage_id": passage_id(titles[m], w), "unit_id": uid, "cluster_id": cid, "doc_id": doc_ids[m],
                          "title": titles[m], "text": text, "n_words": len(text.split()), "n_tokens": n_tokens[i]}
                         for i, (m, w, text) in enumerate(windows[a:b], start=a)]
        counts.append((len(bounds) - 1, len(windows)))
    return units, passages, counts


@pytest.mark.parametrize("counted", ["all", "none", "some"], ids=["counted", "precomputed", "mixed"])
@pytest.mark.parametrize("seed, passage_words, unit_max_tokens", [(0, 1, 1), (1, 3, 5), (2, 7, 4), (3, 100, 1024)])
def test_segment_clusters_rows_equal_a_per_window_reference(seed, passage_words, unit_max_tokens, counted):
    """The columnar segmentation (window numbers, word counts and ids over all clusters at once)
    gives, row for row, what the documented per-window steps give, on Unicode whitespace, articles
    without words, one-member clusters, a cluster without any word, windows over the unit limit and an
    article of more than 1,000 windows (``…p1000``); ``segment_cluster`` gives the same rows."""
    cfg = SegmentConfig(passage_words=passage_words, unit_max_tokens=unit_max_tokens, tokenizer="whitespace")
    clusters = _random_clusters(seed, cfg, counted)
    units, passages, counts = segment_clusters(clusters, cfg, WS)
    want_units, want_passages, want_counts = _reference(clusters, cfg)
    assert units.to_pylist() == want_units
    assert passages.to_pylist() == want_passages
    assert counts.tolist() == [list(c) for c in want_counts] and counts.dtype == np.int64
    long_ids = [r["passage_id"] for r in want_passages if r["cluster_id"] == clusters[7][0]]
    assert len(long_ids) > 1000 and long_ids[1000].endswith(".p1000")
    assert want_counts[5] == (0, 0)
    if counted != "all" or passage_words > unit_max_tokens:   # a window over the limit is a unit of its own
        assert any(u["n_passages"] == 1 and u["n_tokens"] > unit_max_tokens for u in want_units)
    one = [segment_cluster(cid, list(zip(doc_ids, titles, texts)), cfg, WS, tokens)
           for cid, doc_ids, titles, texts, tokens in clusters]
    one_units, one_passages = segments_to_tables(one)
    assert one_units.to_pylist() == want_units and one_passages.to_pylist() == want_passages


def test_window_ids_spell_ids_as_window_id():
    keys = [document_key(t) for t in ("A", "B é", "")]
    windows = np.array([0, 7, 999, 1000, 12345, 42], np.int64)
    for kind in ("p", "u"):
        got = window_ids(pa.array([keys[i % 3] for i in range(windows.size)]), kind, windows).to_pylist()
        assert got == [window_id(keys[i % 3], kind, int(w)) for i, w in enumerate(windows)]
    assert window_ids(pa.array([], pa.string()), "p", np.zeros(0, np.int64)).to_pylist() == []


def test_segment_clusters_names_a_member_without_counts():
    cfg = SegmentConfig(tokenizer="whitespace")
    with pytest.raises(ValueError, match="cluster 3: 1 window count arrays for 2 members"):
        segment_clusters([(3, [0, 1], ["A", "B"], ["x", "y"], [np.array([1])])], cfg, WS)
    with pytest.raises(ValueError, match="cluster 4, doc 11: 2 precomputed window token counts for 1 windows"):
        segment_clusters([(3, [0], ["A"], ["x"], [np.array([1])]), (5, [9], ["C"], ["z"], None),
                          (4, [10, 11], ["B", "D"], ["", "y"], [np.zeros(0, np.int32), np.array([1, 1])])], cfg, WS)
    units, passages, counts = segment_clusters([], cfg, WS)
    assert units.num_rows == passages.num_rows == 0 and counts.shape == (0, 2)
