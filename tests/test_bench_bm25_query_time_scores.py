"""The query-time BM25 scoring bench: term frequencies derived from a stored index score every
stored score bit for bit, searching both ways gives the same rows and scores, and a wrong length
normalisation or wrong texts are refused rather than measured."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.bench_bm25_query_time_scores import lazy_arrays, measure, passage_texts, questions
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
        assert row["stored_ms_a_query"] > 0 and row["query_time_ms_a_query"] > 0
        json.dumps(row)


def test_a_wrong_length_normalisation_or_wrong_texts_are_refused(version):
    index = BM25Index.load(version / "index" / "passages.bm25")
    texts = passage_texts(version)
    index.cfg = BM25Config(method="lucene", b=0.75)   # other than the index was built with (0.4)
    with pytest.raises(ValueError, match="stored scores differ"):
        lazy_arrays(index, texts)
    index.cfg = BM25Config(method="lucene")
    with pytest.raises(ValueError, match="299 texts for an index of 300"):
        lazy_arrays(index, texts[:-1])
