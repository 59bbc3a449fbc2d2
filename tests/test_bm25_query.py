"""The compiled BM25 top-k (tasks/corpus/bm25_query.py) against bm25s's own retrieve: the same
scores, the same rows wherever no tie straddles the k-th place, and there the lowest rows of the
tied documents; on real passages and real questions."""
import gzip
import json

import numpy as np
import pytest

from funnelrag.datasets import resolve
from tasks.corpus.bm25_query import BUFFER_K, RunningTopK, top_k_rows
from tasks.corpus.index import BM25Config, BM25Index
from tasks.qa.questions import QuestionsConfig, load_questions


@pytest.fixture(scope="module")
def real_index(data_mirror):
    """BM25 over real Wikipedia passages: the NQ-open oracle gold passages and the HotpotQA paragraphs."""
    with gzip.open(resolve("nq-open-oracle", data_mirror), "rt", encoding="utf-8") as fh:
        texts = [f"{c['title']}\n{c['text']}" for c in (json.loads(line)["ctxs"][0] for line in fh)]
    with open(resolve("hotpotqa-dev-subsampled", data_mirror), encoding="utf-8") as fh:
        texts += [f"{c['title']}\n{c['paragraph_text']}" for line in fh for c in json.loads(line)["contexts"]]
    return BM25Index.build(texts, [f"p{i}" for i in range(len(texts))], BM25Config())


@pytest.fixture(scope="module")
def questions(data_mirror) -> list[str]:
    table, _ = load_questions([resolve("nq-open-dev", data_mirror)], QuestionsConfig(limit=300))
    return table["question"].to_pylist() + ["", "zzzzqx", "the of and"]   # empty, out of vocabulary, stop words only


def assert_same_top_k(index: BM25Index, tokens, k: int) -> int:
    """The compiled path equals bm25s's retrieve: equal scores; equal rows above the k-th score;
    at the k-th score, the lowest rows among all documents with that score. Returns how many
    queries had a tie at the k-th place (so a caller can see the tie rule was exercised)."""
    rows, scores = index.search_token_rows(tokens, k)
    ref_rows, ref_scores = index.search_token_rows_bm25s(tokens, k)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-6, atol=0)
    ties = 0
    vocab = index.retriever.vocab_dict
    for i, toks in enumerate(tokens):
        last = scores[i, -1]
        above = scores[i] > last
        np.testing.assert_array_equal(rows[i, above], ref_rows[i, above])
        full = index.retriever.get_scores_from_ids([vocab[t] for t in toks if t in vocab]) if any(
            t in vocab for t in toks) else np.zeros(len(index), np.float32)
        tied = np.flatnonzero(full == last)
        at_last = rows[i, ~above]
        np.testing.assert_array_equal(at_last, tied[:at_last.size])                 # lowest rows first
        assert set(ref_rows[i, ~above]) <= set(tied.tolist())                       # bm25s: any of them
        ties += tied.size > at_last.size
    return ties


@pytest.mark.parametrize("k", [1, 10, 100, 400])
def test_compiled_top_k_equals_bm25s_on_real_questions(real_index, questions, k):
    tokens = real_index.tokenize(questions)
    ties = assert_same_top_k(real_index, tokens, k)
    if k == 400:
        assert ties > 0      # empty and stop-word queries tie every document at 0
    rows, scores = real_index.search_rows(questions, k)
    assert rows.shape == scores.shape == (len(questions), k) and scores[0, 0] > 0
    np.testing.assert_array_equal(rows[-3], np.arange(k))                            # no token: first k rows, 0
    assert not scores[-3:].any()


def test_one_query_at_a_time_equals_the_batch(real_index, questions):
    rows, scores = real_index.search_rows(questions[:40], 50)
    for i, q in enumerate(questions[:40]):
        r, s = real_index.search_rows([q], 50)
        np.testing.assert_array_equal(r[0], rows[i])
        np.testing.assert_allclose(s[0], scores[i], rtol=1e-6)


def test_memory_mapped_index_and_k_beyond_the_corpus(real_index, questions, tmp_path):
    loaded = BM25Index.load(real_index.save(tmp_path / "ix"), mmap=True)
    a = loaded.search_rows(questions[:20], 30)
    b = real_index.search_rows(questions[:20], 30)
    np.testing.assert_array_equal(a[0], b[0])
    small = BM25Index.build(["red apple", "green apple", "blue sky"], ["a", "b", "c"], BM25Config(stemmer=None))
    ids, scores = small.search(["apple", "sky", "nothing"], k=10)    # k > n_docs: every document
    assert ids == [["a", "b", "c"], ["c", "a", "b"], ["a", "b", "c"]]
    assert scores[0, 0] == scores[0, 1] > 0 and scores[0, 2] == 0


def test_zero_scores_of_touched_documents_tie_with_untouched_ones():
    """Robertson's idf is 0 (bm25s clips it) for a term in more than half the documents: the
    documents holding it score 0 like the untouched ones, and all of them rank by row."""
    texts = ["common word here", "common thing", "common again", "rare common", "nothing shared", "other text"]
    index = BM25Index.build(texts, [str(i) for i in range(len(texts))],
                            BM25Config(method="robertson", stemmer=None, stopwords=None))
    tokens = index.tokenize(["common", "rare common", "common common"])
    rows, scores = index.search_token_rows(tokens, 6)
    assert rows[0].tolist() == list(range(6)) and not scores[0].any()
    assert rows[1].tolist() == [3, 0, 1, 2, 4, 5] and scores[1, 0] > 0 and not scores[1, 1:].any()
    assert assert_same_top_k(index, tokens, 6) == 0
    assert assert_same_top_k(index, tokens, 3) == 3


def test_methods_with_non_occurrence_scores_use_bm25s():
    index = BM25Index.build(["red apple pie", "green apple", "blue sky today"], ["a", "b", "c"],
                            BM25Config(method="bm25+", stemmer=None))
    tokens = index.tokenize(["apple pie"])
    np.testing.assert_array_equal(index.search_token_rows(tokens, 2)[0], index.search_token_rows_bm25s(tokens, 2)[0])


def test_bad_input_is_refused():
    data, indices, indptr = np.ones(2, np.float32), np.array([0, 1], np.int32), np.array([0, 1, 2], np.int64)
    with pytest.raises(ValueError, match="k must lie"):
        top_k_rows([[0]], data, indices, indptr, 2, 3)
    with pytest.raises(ValueError, match="outside the index"):
        top_k_rows([[2]], data, indices, indptr, 2, 1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        RunningTopK(1, 0)
    with pytest.raises(ValueError, match="2 queries for a batch of 1"):
        RunningTopK(1, 1).add([[0], [1]], data, indices, indptr, 2)
    with pytest.raises(ValueError, match=r"k must lie in \[1, 2\]"):
        RunningTopK(1, 3).add([[0]], data, indices, indptr, 2).result()     # matrices of fewer rows than k
    rows, scores = top_k_rows([[1, 1], [0]], data, indices, indptr, 2, 2)
    assert rows.tolist() == [[1, 0], [0, 1]] and scores.tolist() == [[2.0, 0.0], [1.0, 0.0]]


def test_sparse_and_dense_queries_equal_a_full_sort():
    """Both ways of ranking (few postings: the touched documents; many: every row) against a
    full sort of the dense scores by (score desc, row asc); scores quantised so ties are many."""
    rng = np.random.default_rng(7)
    n_docs, n_vocab = 3000, 200
    df = np.where(np.arange(n_vocab) < 20, 5, 600)                     # 20 rare terms, 180 common ones
    cols = [np.sort(rng.choice(n_docs, size=int(n), replace=False)) for n in df]
    indptr = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
    indices = np.concatenate(cols).astype(np.int32)
    data = (rng.integers(0, 4, size=indices.size) / 4).astype(np.float32)   # zeros included
    queries = [[0], [1, 2, 1], [150, 151], [3, 160, 170, 180], []]          # sparse, sparse, dense, dense, empty
    postings = [int(sum(df[t] for t in q)) for q in queries]
    ways = set()
    for k in (1, 7, 50, 100, 200, n_docs):
        # a query scanning every row compacts its buffer of candidates while it scans when the rows outnumber it
        ways |= {("sparse", False) if 16 * n < n_docs else ("dense", BUFFER_K * k < n_docs) for n in postings}
        rows, scores = top_k_rows(queries, data, indices, indptr, n_docs, k)
        for i, q in enumerate(queries):
            dense = np.zeros(n_docs, np.float32)
            for t in q:
                np.add.at(dense, indices[indptr[t]:indptr[t + 1]], data[indptr[t]:indptr[t + 1]])
            order = np.lexsort((np.arange(n_docs), -dense))[:k]
            np.testing.assert_array_equal(rows[i], order)
            np.testing.assert_allclose(scores[i], dense[order], rtol=1e-6)
    assert ways == {("sparse", False), ("dense", False), ("dense", True)}


def test_scratch_is_reused_per_thread(real_index, questions):
    from concurrent.futures import ThreadPoolExecutor

    want = real_index.search_rows(questions[:30], 20)
    with ThreadPoolExecutor(4) as pool:                    # each thread its own scratch
        got = list(pool.map(lambda q: real_index.search_rows([q], 20), questions[:30]))
    np.testing.assert_array_equal(np.concatenate([r for r, _ in got]), want[0])
    assert not real_index._scratch.value.acc.any()                 # left zero between calls


@pytest.mark.parametrize("cfg", [BM25Config(), BM25Config(stemmer=None), BM25Config(stopwords=None, lower=False)],
                         ids=["stemmed", "unstemmed", "cased-no-stop-words"])
def test_query_tokens_equal_bm25s_tokenize(questions, cfg):
    """The query tokenizer is bm25s's ``tokenize`` (stop words, lower-casing, stems) on real
    questions, one at a time and batched, and on odd strings."""
    index = BM25Index.build(["Paris is the capital of France", "The Running of the Bulls"], ["a", "b"], cfg)
    odd = ["", "  ", "The THE the", "naïve café façade, Zürich's 1st 2nd", "a b c x1 __init__ don't", "running runs ran"]
    texts = questions + odd
    assert index.tokenize(texts) == index.tokenize_bm25s(texts)
    assert [index.tokenize([t])[0] for t in texts[:50]] == index.tokenize_bm25s(texts[:50])
    assert index.tokenize([]) == []
    assert any(t != u for t, u in zip(index.tokenize(texts), (x.split() for x in texts)))      # not a plain split
