"""BM25 tokenization (tasks.corpus.index.tokenize_ids): the fast split and numbering give the same
token ids and vocabulary as bm25s's own tokenize (tokenize_ids_bm25s), on real windows and odd text,
so every index built from them has the same bytes (tests/test_bm25_csc.py, the pinned corpus digests)."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.corpus.index import BM25Config, TokenIds, _stemmer, tokenize_ids, tokenize_ids_bm25s
from tests.test_tokenize import TRICKY, real_windows

ODD = [*TRICKY, "THE The the", "İstanbul ǅemal ß straße ΣΊΣΥΦΟΣ", "x y z 1 22 333 _ __ a_b", "the and of",
       "½ ² ³ ① ㊀ ٣٤ ๑๒ १२ hindi हिन्दी", "CamelCase snake_case kebab-case e.g. U.S.A."]


@pytest.mark.parametrize("cfg", [BM25Config(), BM25Config(stemmer=None), BM25Config(stopwords=None),
                                 BM25Config(lower=False, stemmer=None, stopwords=None)],
                         ids=["stem-stop", "stop", "stem", "raw"])
def test_fast_tokenize_ids_equal_bm25s_tokenize(data_mirror, cfg):
    texts = [*ODD, *real_windows(data_mirror, 30), *ODD[::-1]]
    fast = tokenize_ids(texts, cfg, _stemmer(cfg.stemmer))
    plain = tokenize_ids_bm25s(texts, cfg, _stemmer(cfg.stemmer))
    assert fast.vocab == plain.vocab and list(fast.vocab) == list(plain.vocab)       # same ids, same order
    assert [list(d) for d in fast.ids] == plain.ids and len(fast.ids) == len(texts)
    flat = TokenIds.from_tokenized(fast)
    assert flat.ids.dtype == np.int32 and flat.offsets.dtype == np.int64 and flat.offsets[-1] > 20_000
    same = TokenIds.from_tokenized(plain)
    assert np.array_equal(flat.ids, same.ids) and np.array_equal(flat.offsets, same.offsets) and flat.terms == same.terms


def test_fast_tokenize_ids_of_nothing_and_of_stop_words_only():
    cfg = BM25Config()
    for texts in ([], [""], ["the of and"], ["", "the", ""]):
        fast, plain = tokenize_ids(texts, cfg, _stemmer(cfg.stemmer)), tokenize_ids_bm25s(texts, cfg, _stemmer(cfg.stemmer))
        assert [list(d) for d in fast.ids] == plain.ids and fast.vocab == plain.vocab
        assert TokenIds.from_tokenized(fast).offsets.tolist() == [0] * (len(texts) + 1)

