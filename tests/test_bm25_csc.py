"""The counting-sort BM25 build (``tasks/corpus/bm25_csc.py``) against bm25s's own builder, byte for byte.

Real data: the enwiki sample's page text cut into pieces of 1 to 1,200 words (varied lengths, so
the length normalisation and term frequencies vary), with texts that hold no token left after stop
words at the start, in the middle and at the end.
"""
from __future__ import annotations

import bz2
import re

import bm25s
import numpy as np
import pytest
from bm25s.scoring import _build_idf_array, _select_idf_scorer

from data_contracts.base import sha256_file
from funnelrag import datasets
from tasks.corpus.bm25_csc import array_chunks, bm25_csc, idf_array
from tasks.corpus.index import (BM25Config, BM25Index, TokenIds, _stemmer, bm25_from_token_chunks, bm25_from_token_ids,
                                tokenize_ids)

PIECE_WORDS = (1, 7, 50, 300, 1200, 3)
CONFIGS = [BM25Config(), BM25Config(method="robertson", k1=1.5, b=0.75), BM25Config(method="robertson", stemmer=None),
           BM25Config(method="atire", k1=1.2, b=0.3), BM25Config(method="bm25l"), BM25Config(method="bm25+", stopwords=None)]
IDS = ["lucene", "robertson", "robertson-unstemmed", "atire", "bm25l-by-bm25s", "bm25plus-by-bm25s"]


@pytest.fixture(scope="module")
def texts(data_mirror) -> list[str]:
    raw = bz2.decompress(datasets.resolve("enwiki-sample", data_mirror).read_bytes()).decode()
    words = re.sub(r"<[^>]+>|\{\{[^}]*\}\}|\[\[|\]\]|'''?", " ", raw).split()[:120_000]
    pieces, at, k = [], 0, 0
    while at < len(words):
        n = PIECE_WORDS[k % len(PIECE_WORDS)]
        pieces.append(" ".join(words[at:at + n]))
        at, k = at + n, k + 1
    return ["the of and", *pieces[:200], "", *pieces[200:], "a the"]


def _files(directory):
    return {p.name: sha256_file(p) for p in sorted(directory.iterdir())}


def _bm25s_index(texts, cfg):
    """bm25s's own build: ``BM25.index`` over the token id lists of :func:`tokenize_ids`."""
    retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    retriever.index(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)), show_progress=False)
    return retriever


def _same(retriever, expected, texts, cfg, tmp_path):
    for name in ("data", "indices", "indptr"):
        got, want = retriever.scores[name], expected.scores[name]
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    assert retriever.scores["num_docs"] == expected.scores["num_docs"] == len(texts)
    ids = [f"d{i}" for i in range(len(texts))]
    BM25Index(retriever, ids, cfg).save(tmp_path / "new")
    BM25Index(expected, ids, cfg).save(tmp_path / "bm25s")
    assert _files(tmp_path / "new") == _files(tmp_path / "bm25s")


@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_flat_build_is_bm25s_own_build(texts, cfg, tmp_path, monkeypatch):
    """Same ``data``/``indices``/``indptr`` bytes and saved files as bm25s for every method; lucene,
    robertson and atire never reach bm25s's per-document loops (the others are bm25s's build)."""
    expected = _bm25s_index(texts, cfg)
    tokens = TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)))
    if cfg.method in ("lucene", "robertson", "atire"):
        monkeypatch.setattr(bm25s, "_calculate_doc_freqs", lambda *a, **k: pytest.fail("bm25s per-document loop used"))
    _same(bm25_from_token_ids(tokens, cfg), expected, texts, cfg, tmp_path)


@pytest.mark.parametrize("chunk_tokens", [1, 2, 299, 1 << 40])
def test_chunk_boundaries(texts, chunk_tokens, tmp_path):
    """Chunks of one text each (1, 2: every text is its own chunk, empty texts too), a few texts
    each, and all texts in one chunk give the same index."""
    cfg = BM25Config()
    tokens = TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)))
    _same(bm25_from_token_ids(tokens, cfg, chunk_tokens=chunk_tokens), _bm25s_index(texts, cfg), texts, cfg, tmp_path)


def test_irregular_chunks_and_empty_chunks(texts, tmp_path):
    """Chunks cut at arbitrary text boundaries, with chunks of no text, read as a stream
    (``bm25_from_token_chunks``) give the same index."""
    cfg = BM25Config(method="robertson")
    tokens = TokenIds.from_tokenized(tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)))
    cuts = [0, 0, 1, 2, 2, 57, 58, 201, 202, 203, 400, len(tokens), len(tokens)]

    def chunks():
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            offsets = tokens.offsets[lo:hi + 1]
            yield tokens.ids[offsets[0]:offsets[-1]], offsets - offsets[0]
    vocab = {t: i for i, t in enumerate(tokens.terms)}
    _same(bm25_from_token_chunks(chunks, len(tokens), vocab, cfg), _bm25s_index(texts, cfg), texts, cfg, tmp_path)


def test_array_chunks_cover_every_text_once():
    offsets = np.array([0, 0, 3, 3, 10, 11, 11], dtype=np.int64)
    ids = np.arange(11, dtype=np.int32)
    for size in (1, 3, 4, 100):
        parts = list(array_chunks(ids, offsets, size))
        assert sum(o.size - 1 for _, o in parts) == offsets.size - 1
        assert np.concatenate([i for i, _ in parts]).tolist() == ids.tolist()
        assert all(o[0] == 0 and o[-1] == i.size for i, o in parts)


@pytest.mark.parametrize("method", ["lucene", "robertson", "atire", "bm25l", "bm25+"])
def test_idf_per_distinct_df_is_bm25s_idf(method):
    df = np.array([0, 1, 5, 1, 0, 7, 5, 1000, 999, 3], dtype=np.int64)
    fn = _select_idf_scorer(method)
    want = _build_idf_array(doc_frequencies=dict(enumerate(df.tolist())), n_docs=1000, compute_idf_fn=fn)
    got = idf_array(df, 1000, fn)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()


def test_bad_input_raises():
    idf = _select_idf_scorer("lucene")
    ids, offsets = np.array([0, 1, 2], dtype=np.int32), np.array([0, 2, 3], dtype=np.int64)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        bm25_csc(lambda: [(ids, offsets)], 2, "lucene", 0.9, 0.4, idf)
    with pytest.raises(ValueError, match="do not span"):
        bm25_csc(lambda: [(ids, np.array([0, 2], dtype=np.int64))], 3, "lucene", 0.9, 0.4, idf)
    with pytest.raises(ValueError, match="not one of"):
        bm25_csc(lambda: [(ids, offsets)], 3, "bm25l", 0.9, 0.4, idf)
    calls = iter([[(ids, offsets)], [(np.array([0, 0, 2], dtype=np.int32), offsets)]])
    with pytest.raises(ValueError, match="second pass"):
        bm25_csc(lambda: next(calls), 3, "lucene", 0.9, 0.4, idf)
    with pytest.raises(ValueError, match="3 texts but"):
        bm25_from_token_chunks(lambda: [(ids, offsets)], 3, {"a": 0, "b": 1, "c": 2}, BM25Config())
