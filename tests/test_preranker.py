"""Pre-ranker f(q, d) (FunnelRAG Eq. 1) on the real MiniLM weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models.preranker import (BiEncoderPreRanker, CrossEncoderPreRanker, PreRankerConfig, build_preranker,
                              load_preranker, save_preranker, score, score_pairs)

QUERY = "who painted the mona lisa"
DOCS = [
    "The Mona Lisa was painted by the Italian artist Leonardo da Vinci in the early sixteenth century.",
    "The football club won the league after a penalty shoot-out in the final match of the season.",
    "Photosynthesis converts light energy into chemical energy stored in glucose molecules.",
]


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


@pytest.fixture(scope="module")
def bi():
    return build_preranker(PreRankerConfig(kind="bi"))


@pytest.fixture(scope="module")
def cross():
    return build_preranker(PreRankerConfig(kind="cross", seed=7, max_length=128))


def test_bi_encoder_ranks_paraphrase_above_unrelated(bi):
    model, tok = bi
    s = score(model, tok, QUERY, DOCS)
    assert s.shape == (3,) and s.dtype == np.float32
    assert s[0] > s[1] and s[0] > s[2]
    assert np.all(s <= 1.0 + 1e-5) and np.all(s >= -1.0 - 1e-5)  # cosine
    paraphrase = score(model, tok, "how do plants turn sunlight into sugar", DOCS)
    assert int(np.argmax(paraphrase)) == 2


def test_bi_encoder_forward_typed_output_and_cosine(bi):
    model, tok = bi
    batch = model.tokenize(tok, [QUERY, QUERY], DOCS[:2])
    out = model(**batch)
    assert isinstance(model, BiEncoderPreRanker) and out.scores.shape == (2,)
    q = model.encoder(batch["query_input_ids"], batch["query_attention_mask"]).embeddings
    d = model.encoder(batch["doc_input_ids"], batch["doc_attention_mask"]).embeddings
    expected = torch.nn.functional.cosine_similarity(q, d, dim=-1)
    torch.testing.assert_close(out.scores, expected, rtol=1e-5, atol=1e-5)


def test_score_pairs_order_independent_of_batching(bi):
    model, tok = bi
    queries = [QUERY, "photosynthesis", QUERY]
    docs = [DOCS[0], DOCS[2], DOCS[1]]
    a = score_pairs(model, tok, queries, docs, batch_size=1)
    b = score_pairs(model, tok, queries, docs, batch_size=3)
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError):
        score_pairs(model, tok, queries, docs[:2])


def test_cross_encoder_head_is_seeded_and_uses_the_pair(cross):
    model, tok = cross
    assert isinstance(model, CrossEncoderPreRanker)
    s = score(model, tok, QUERY, DOCS)
    assert s.shape == (3,) and len(set(np.round(s, 6))) == 3   # depends on the document
    again, _ = build_preranker(PreRankerConfig(kind="cross", seed=7, max_length=128))
    np.testing.assert_array_equal(score(again, tok, QUERY, DOCS), s)
    other, _ = build_preranker(PreRankerConfig(kind="cross", seed=8, max_length=128))
    assert not np.allclose(score(other, tok, QUERY, DOCS), s)
    # only the head is new: the encoder weights are MiniLM's in both
    torch.testing.assert_close(other.model.bert.embeddings.word_embeddings.weight,
                               model.model.bert.embeddings.word_embeddings.weight)


@pytest.mark.parametrize("kind", ["bi", "cross"])
def test_save_load_round_trip(kind, bi, cross, tmp_path):
    model, tok = bi if kind == "bi" else cross
    save_preranker(model, tok, tmp_path / "m")
    loaded, tok2 = load_preranker(tmp_path / "m")
    assert loaded.kind == kind and loaded.cfg.max_length == model.cfg.max_length
    np.testing.assert_allclose(score(loaded, tok2, QUERY, DOCS), score(model, tok, QUERY, DOCS), rtol=1e-5, atol=1e-6)


def test_bad_kind_and_missing_directory(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        PreRankerConfig(kind="colbert")
    with pytest.raises(FileNotFoundError):
        load_preranker(tmp_path)
