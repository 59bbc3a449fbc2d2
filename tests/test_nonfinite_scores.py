"""Scores that are not finite fail loudly instead of ranking arbitrarily (damaged weights)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models.preranker import (NonFiniteScoresError, PreRankerConfig, build_preranker, require_finite, score_grouped,
                              score_pairs)


def test_require_finite_counts_bad_values():
    ok = np.array([0.5, -1.0], np.float32)
    assert require_finite(ok, "x") is ok
    with pytest.raises(NonFiniteScoresError, match="pre-ranker scores: 2 of 3 values are NaN or infinite"):
        require_finite(np.array([np.nan, 1.0, np.inf]), "pre-ranker scores")


@pytest.fixture(scope="module")
def damaged_preranker():
    """MiniLM with its word embeddings set to NaN, as a corrupted safetensors file can load."""
    from tasks.evaluate.models import MINILM

    model, tok = build_preranker(PreRankerConfig(kind="bi", name_or_path=MINILM))
    with torch.no_grad():
        model.encoder.backbone.embeddings.word_embeddings.weight.fill_(float("nan"))
    return model, tok


def test_damaged_weights_fail_scoring(damaged_preranker):
    model, tok = damaged_preranker
    with pytest.raises(NonFiniteScoresError):
        score_pairs(model, tok, ["who wrote hamlet"], ["Hamlet is a tragedy by Shakespeare."])
    with pytest.raises(NonFiniteScoresError):
        score_grouped(model, tok, ["who wrote hamlet"], ["Hamlet is a tragedy.", "Paris"], [(0, 0), (0, 1)])
