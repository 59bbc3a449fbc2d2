"""The shortlist's passage BM25 lookup (:class:`tasks.funnel.fusion.PassageBM25`, compiled by
:func:`tasks.funnel.bm25_rows.score_rows`) against bm25s's own ``get_scores`` over the whole
corpus: the same float32 scores, bit for bit, for every BM25 variant, for one index and for
shards, whatever rows are asked for and in whatever order."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.corpus.index import BM25Config, BM25Index
from tasks.corpus.sharded.sharded_index import ShardedBM25, build_shard, merge_stats, shard_stats
from tasks.funnel.bm25_rows import score_rows
from tasks.funnel.fusion import PassageBM25

# A Zipf-like vocabulary: a few words in most passages (long posting lists, the galloping
# search's case), many in a handful (short ones, merged); "zz*" words only in the
# last 40 passages (the last shard below), "qq*" words in no passage.
WORDS = [f"w{i:03d}x" for i in range(300)]
N_PASSAGES = 640
CUTS = [150, 300, 600]                      # four shards: 150, 150, 300 and 40 passages


def _corpus() -> tuple[list[str], list[str]]:
    rng = np.random.default_rng(7)
    p = 1.0 / np.arange(1, len(WORDS) + 1) ** 1.1
    p /= p.sum()
    texts = []
    for i in range(N_PASSAGES):
        words = list(rng.choice(WORDS, size=int(rng.integers(3, 40)), p=p))
        if i >= CUTS[-1] and i % 3:
            words.append(f"zz{i % 5}y")
        texts.append(" ".join(words))
    return texts, [f"p{i}" for i in range(N_PASSAGES)]


def _questions() -> list[str]:
    rng = np.random.default_rng(11)
    out = ["w000x w000x w000x", f"{WORDS[0]} zz1y qq2y", "qq1y qq7y", "the and of", "",
           "zz0y zz1y zz2y zz3y zz4y w001x"]
    for _ in range(30):
        n = int(rng.integers(1, 12))
        out.append(" ".join(rng.choice(WORDS[:60] + WORDS[:5] + ["zz2y", "qq3y"], size=n)))   # repeats included
    return out


def _flat_scores(index: BM25Index, question: str) -> np.ndarray:
    """bm25s's scores of every passage, ``(n,)`` float32: the reference."""
    tokens = [t for t in index.tokenize([question])[0] if t in index.retriever.vocab_dict]
    if not tokens:                                                  # bm25s refuses a query of no token
        return np.zeros(len(index), np.float32)
    return np.asarray(index.retriever.get_scores(tokens), np.float32)


def _row_sets(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [np.arange(n), rng.permutation(n)[:37], rng.integers(0, n, size=200),          # any order, repeats
            np.sort(rng.choice(n, 5, replace=False)), np.asarray([n - 1, 0, n - 1]), np.zeros(0, np.int64),
            np.arange(CUTS[-1], n)[::-1]]                                                 # one shard only


@pytest.mark.parametrize("cfg", [BM25Config(), BM25Config(method="robertson", stemmer=None, stopwords=None),
                                 BM25Config(method="atire", k1=1.2, b=0.3), BM25Config(method="bm25l"),
                                 BM25Config(method="bm25+", stopwords=None)],
                         ids=["lucene", "robertson", "atire", "bm25l", "bm25plus"])
def test_scores_of_any_rows_are_the_flat_indexs(cfg):
    texts, ids = _corpus()
    index = BM25Index.build(texts, ids, cfg)
    lookup = PassageBM25(index, ids)
    for question in _questions():
        flat = _flat_scores(index, question)
        for rows in _row_sets(len(ids)):
            got = lookup.scores(question, rows)
            assert got.dtype == np.float32 and got.shape == rows.shape
            np.testing.assert_array_equal(got, flat[rows], err_msg=f"{cfg.method}: {question!r}")
    assert np.any(_flat_scores(index, "w020x") > 0)                 # the reference is not all zeros


def test_scores_over_shards_are_the_one_index_scores():
    """Shards with the corpus-wide statistics (tokens absent from some shards, one shard no
    wanted row falls in) give the single index's scores, through an id order of their own."""
    cfg = BM25Config()
    texts, ids = _corpus()
    one = BM25Index.build(texts, ids, cfg)
    parts = [(texts[a:b], ids[a:b]) for a, b in zip([0, *CUTS], [*CUTS, len(texts)])]
    stats = merge_stats([shard_stats(t, cfg) for t, _ in parts])
    sharded = ShardedBM25([build_shard(t, i, cfg, stats) for t, i in parts])
    assert "zz1y" not in sharded.shards[0].retriever.vocab_dict
    rng = np.random.default_rng(5)
    order = rng.permutation(len(ids))                               # position i is the passage ids[order[i]]
    lookup = PassageBM25(sharded, [ids[i] for i in order])
    for question in _questions():
        flat = _flat_scores(one, question)
        for rows in _row_sets(len(ids)):
            np.testing.assert_allclose(lookup.scores(question, rows), flat[order[rows]], rtol=1e-6, atol=0,
                                       err_msg=question)
            direct = PassageBM25(sharded, ids).scores(question, rows)
            np.testing.assert_array_equal(direct, _sharded_reference(sharded, question)[rows])


def _sharded_reference(sharded: ShardedBM25, question: str) -> np.ndarray:
    """bm25s's ``get_scores`` of each shard, stacked: the scores the sharded flat search ranks by."""
    tokens = sharded.shards[0].tokenize([question])[0]
    parts = []
    for s in sharded.shards:
        parts.append(_flat_scores(s, " ".join(tokens)) if tokens else np.zeros(len(s), np.float32))
    return np.concatenate(parts)


def test_the_kernel_by_hand_and_a_posting_list_out_of_order():
    # token 0: rows 1, 4, 9 (scores 1, 2, 3); token 1: rows 0..99 (0.5 each, galloped over);
    # token 2: none
    data = np.asarray([1, 2, 3] + [0.5] * 100, np.float32)
    indices = np.asarray([1, 4, 9] + list(range(100)), np.int32)
    indptr = np.asarray([0, 3, 103, 103], np.int64)
    want = np.asarray([0, 4, 4, 9, 57, 150], np.int64) + 1000       # base 1000, a repeat, a row in no list
    acc = np.zeros(6, np.float32)
    checked = np.zeros(3, np.bool_)
    assert score_rows(np.asarray([0, 2, 1, 0], np.int64), data, indices, indptr, want, 1000, acc, checked) == -1
    np.testing.assert_array_equal(acc, [0.5, 4.5, 4.5, 6.5, 0.5, 0])   # token 0 counted twice
    assert checked.tolist() == [True, True, False]                  # an empty posting list: nothing to check
    bad = indices.copy()
    bad[3:5] = [1, 0]
    for token_ids in ([1], [0, 1]):
        assert score_rows(np.asarray(token_ids, np.int64), data, bad, indptr, want, 1000, np.zeros(6, np.float32),
                          np.zeros(3, np.bool_)) == 1


def test_the_galloping_search_finds_every_row_of_a_long_posting_list():
    rng = np.random.default_rng(2)
    post = np.sort(rng.choice(100_000, 20_000, replace=False)).astype(np.int32)
    data = rng.random(post.size, dtype=np.float32)
    indptr = np.asarray([0, post.size], np.int64)
    for m in (1, 7, 300, 20_000, 60_000):                            # few rows to more rows than the list
        want = np.sort(rng.integers(0, 100_001, m))
        acc = np.zeros(m, np.float32)
        assert score_rows(np.zeros(1, np.int64), data, post, indptr, want, 0, acc, np.zeros(1, np.bool_)) == -1
        pos = np.minimum(np.searchsorted(post, want), post.size - 1)
        np.testing.assert_array_equal(acc, np.where(post[pos] == want, data[pos], 0))


def test_a_posting_list_out_of_order_is_refused():
    texts, ids = _corpus()
    index = BM25Index.build(texts, ids)
    t = index.retriever.vocab_dict[index.tokenize(["w000x"])[0][0]]
    lo, hi = int(index.retriever.scores["indptr"][t]), int(index.retriever.scores["indptr"][t + 1])
    index.retriever.scores["indices"][lo:hi] = index.retriever.scores["indices"][lo:hi][::-1].copy()
    with pytest.raises(ValueError, match=f"token {t} .*not in ascending row order"):
        PassageBM25(index, ids).scores("w000x", np.arange(5))
