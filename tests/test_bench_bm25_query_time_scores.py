"""The BM25 scoring bench: term frequencies derived from a stored index score every stored score
bit for bit; scoring postings at query time (computed or looked up) adds up to the stored scores'
sums; a kept term-frequency matrix with a day's rows merged in (rows renumbered, rows removed) is
the matrix of the day's documents, and re-scoring it gives a fresh build's stored scores; a
cluster's frequencies summed from its members' are its stored row; a wrong length normalisation,
wrong texts or a wrong membership are refused rather than measured."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_bm25_query_time_scores import (lazy_arrays, measure, measure_night, member_frequencies, merge_rows,
                                                     passage_texts, questions, rescore)
from tasks.corpus.index import BM25Config, BM25Index

WORDS = ["alpha", "beta", "gamma", "delta", "river", "mountain", "city", "history", "music", "war", "king",
         "science", "island", "bridge", "church", "garden", "winter", "language", "railway", "painter"]


@pytest.fixture
def version(tmp_path):
    """A version directory with ``passages.parquet`` (300 passages of 1-60 words, some repeated)
    and its passage index as the index stage saves it."""
    rng = np.random.default_rng(0)
    titles = [f"Page {i % 40}" for i in range(300)]
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 60)))) for _ in range(300)]
    pq.write_table(pa.table({"title": titles, "text": texts}), tmp_path / "passages.parquet")
    index = BM25Index.build([f"{a}\n{b}" for a, b in zip(titles, texts)], [f"p{i}" for i in range(300)],
                            BM25Config(method="lucene"))
    index.save(tmp_path / "index" / "passages.bm25")
    return tmp_path


def test_stored_scores_are_derived_and_searched_both_ways(version, tmp_path):
    index = BM25Index.load(version / "index" / "passages.bm25")
    tf, norms, idf = lazy_arrays(index, passage_texts(version))
    data = index._csc[0]
    assert tf.shape == data.shape and norms.shape == (300,) and tf.min() >= 1
    assert int(tf.max()) > 1                      # repeated words: frequencies above one are recovered
    tsv = tmp_path / "nq-open-dev.tsv"
    tsv.write_text("".join(f"which {a} and {b} of the {c}?\t[\"x\"]\n"
                           for a, b, c in zip(WORDS, WORDS[3:], WORDS[7:])), encoding="utf-8")
    qs = questions(tsv, 10)
    assert len(qs) == 10 and qs[0] == "which alpha and delta of the history?"
    for batch in (1, 4):
        row = measure(index, tf, norms, idf, qs, k=20, batch=batch, repeat=1)
        assert row["queries"] == 10 and row["postings_a_query"] > 0
        assert row["top_k_ms_a_query"] > 0 and row["add_stored_ms_a_query"] > 0
        assert row["scored_ratio"] > 0 and row["tabled_ratio"] > 0      # both ways ran and gave the stored sums
        json.dumps(row)
    night = measure_night(index, tf, share=0.1, seed=1)
    assert night["day_rows"] == 30 and 0 < night["day_postings"] < tf.size and night["rescored"] == "identical"


def test_a_way_of_scoring_that_adds_other_scores_is_refused(version, tmp_path):
    index = BM25Index.load(version / "index" / "passages.bm25")
    tf, norms, idf = lazy_arrays(index, passage_texts(version))
    idf = idf * np.float32(1.001)                               # every term scored a little off
    with pytest.raises(ValueError, match="scores added scored differ"):
        measure(index, tf, norms, idf, ["alpha beta gamma delta river mountain city"] * 3, k=5, batch=1, repeat=1)


def _csc(rows: list[dict[int, int]], n_terms: int):
    """CSC ``(tf, indices, indptr)`` of documents given as ``{term: tf}``."""
    tf, indices, indptr = [], [], [0]
    for t in range(n_terms):
        for r, doc in enumerate(rows):
            if t in doc:
                tf.append(doc[t])
                indices.append(r)
        indptr.append(len(tf))
    return np.array(tf, np.uint16), np.array(indices, np.int32), np.array(indptr, np.int64)


def test_a_day_merged_into_kept_term_frequencies_is_the_days_matrix_and_rescores_as_a_fresh_build():
    rng = np.random.default_rng(3)
    n_terms = 12
    docs = [{int(t): int(rng.integers(1, 4)) for t in rng.choice(n_terms, size=int(rng.integers(1, 6)), replace=False)}
            for _ in range(40)]
    base = _csc(docs, n_terms)
    # the day: documents 3 and 17 changed, 8 and 30 removed, two new ones after 10 and at the end
    changed = {3: {0: 2, 5: 1}, 17: {11: 3}}
    new = [(10, {1: 1, 2: 2}), (40, {0: 1, 11: 1})]
    after = [changed.get(i, d) for i, d in enumerate(docs) if i not in (8, 30)]
    after.insert(10 - 1, new[0][1])          # after document 10 of the old numbering: 9 in the new one (8 removed)
    after.append(new[1][1])
    keep = np.array([i not in (3, 17, 8, 30) for i in range(40)])
    new_row = np.full(40, -1, np.int64)
    at = 0
    for i in range(40):
        if i == 10:
            at += 1                          # the new document before old 10
        if i not in (8, 30):
            new_row[i] = at
            at += 1
    day_rows = {int(new_row[3]): changed[3], int(new_row[17]): changed[17], 9: new[0][1], len(after) - 1: new[1][1]}
    day = _csc([day_rows.get(r, {}) for r in range(len(after))], n_terms)
    got = merge_rows(base, keep, new_row, day)
    want = _csc(after, n_terms)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    cfg = BM25Config(method="lucene")
    texts = [" ".join(" ".join([WORDS[t]] * c) for t, c in sorted(d.items())) for d in after]
    fresh = BM25Index.build(texts, [f"p{i}" for i in range(len(after))], cfg)
    data, indices, indptr, _ = fresh._csc
    order = np.argsort([WORDS[t] for t in range(n_terms)], kind="stable")    # the fresh index numbers its terms by spelling
    tf, idx, ptr = got
    cols = [(tf[ptr[t]:ptr[t + 1]], idx[ptr[t]:ptr[t + 1]]) for t in order]
    got_sorted = (np.concatenate([c[0] for c in cols]), np.concatenate([c[1] for c in cols]),
                  np.concatenate([[0], np.cumsum([c[0].size for c in cols])]).astype(np.int64))
    assert np.array_equal(got_sorted[1], indices) and np.array_equal(got_sorted[2], indptr)
    assert np.array_equal(rescore(*got_sorted, len(after), cfg), data)


def test_a_wrong_length_normalisation_or_wrong_texts_are_refused(version):
    index = BM25Index.load(version / "index" / "passages.bm25")
    texts = passage_texts(version)
    index.cfg = BM25Config(method="lucene", b=0.75)   # other than the index was built with (0.4)
    with pytest.raises(ValueError, match="stored scores differ"):
        lazy_arrays(index, texts)
    index.cfg = BM25Config(method="lucene")
    with pytest.raises(ValueError, match="299 texts for an index of 300"):
        lazy_arrays(index, texts[:-1])


def test_regrouped_clusters_summed_from_their_members_are_the_stored_rows():
    rng = np.random.default_rng(5)
    members = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 30)))) for _ in range(60)]
    sizes = rng.integers(1, 5, size=60)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    offsets = offsets[offsets < 60].tolist() + [60]
    offsets = np.array(offsets, np.int64)
    clusters = ["\n\n".join(members[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]   # as the index stage joins them
    index = BM25Index.build(clusters, [str(i) for i in range(len(clusters))], BM25Config(method="lucene"))
    tf, _, _ = lazy_arrays(index, clusters)
    night = measure_night(index, tf, share=0.4, seed=2, members=member_frequencies(index, members, offsets))
    assert night["day_rows"] == round(0.4 * len(clusters)) and night["sum_from_members_cpu_s"] >= 0
    assert night["rescored"] == "identical"
    wrong = offsets.copy()
    wrong[1] += 1                                  # the second cluster's first member counted in the first
    with pytest.raises(ValueError, match="summed from their members differ"):
        measure_night(index, tf, share=1.0, seed=2, members=member_frequencies(index, members, wrong))
