"""DR-RAG selection: QDC ordering and de-duplication, CFS and CIS with a real (tiny) classifier."""
from __future__ import annotations

import pytest
import torch

from models.dr_rag import ClassifierConfig, DRRAGClassifier
from tasks.dr_rag.classifier import PairProbs, question_scorer
from tasks.dr_rag.selection import (Selected, cfs_candidate_pairs, cfs_first_pairs, cfs_select, cis_pairs, cis_select,
                                    qdc_select, split_budget)

# Hand-built case: first-stage ranking of q and the rankings of q ⊕ d* for its top documents.
FIRST = ["a", "b", "c", "d", "e"]
SECOND = {
    "a": ["a", "b", "x", "y", "z", "w"],   # its own d* and b come first: both already selected
    "b": ["x", "a", "y", "v", "w", "z"],   # x is taken by a in the same round
    "c": ["c", "z", "y", "v", "u", "t"],
}
TEXTS = {
    "a": "Johan Ludvig Heiberg: a Danish poet and critic, son of Peter Andreas Heiberg.",
    "b": "Peter Andreas Heiberg: a Danish author and philologist.",
    "c": "Copenhagen: the capital of Denmark.",
    "d": "Danish literature: the literature of Denmark.",
    "e": "Heiberg (surname): people with the surname Heiberg.",
    "x": "Johanne Luise Heiberg: a Danish actress, wife of Johan Ludvig Heiberg.",
    "y": "Royal Danish Theatre: a theatre in Copenhagen.",
    "z": "Vaudeville: a theatrical genre of variety entertainment.",
    "w": "Thomasine Gyllembourg: a Danish writer, mother of Johan Ludvig Heiberg.",
    "v": "Golden Age of Denmark: a period of Danish culture.",
    "u": "Poetry: a form of literature.",
    "t": "Critic: a professional who judges art.",
}
QUESTION = "Who is the spouse of the child of Peter Andreas Heiberg?"


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


def _ids(sel):
    return [s.paragraph_id for s in sel]


def test_split_budget():
    assert split_budget(3) == (2, 1) and split_budget(4) == (2, 2) and split_budget(6) == (3, 3)
    assert split_budget(6, 2) == (2, 4)
    with pytest.raises(ValueError):
        split_budget(0)
    with pytest.raises(ValueError):
        split_budget(3, 4)


def test_qdc_first_not_already_in_context():
    # k=4: D1 = [a, b]; a's first new result is x; b skips x (taken) and a, takes y.
    sel = qdc_select(FIRST, SECOND, k=4)
    assert _ids(sel) == ["a", "b", "x", "y"]
    assert [s.stage for s in sel] == [1, 1, 2, 2]
    assert [s.parent_id for s in sel] == [None, None, "a", "b"]
    # k=6: D1 = [a, b, c]; c skips its own id and takes z.
    assert _ids(qdc_select(FIRST, SECOND, k=6)) == ["a", "b", "c", "x", "y", "z"]
    # k=3: D1 = [a, b], one addition from a.
    assert _ids(qdc_select(FIRST, SECOND, k=3)) == ["a", "b", "x"]


def test_qdc_rounds_when_k2_exceeds_k1():
    # k=6, k1=2 -> k2=4: round 1 a->x, b->y; round 2 a->z (y taken), b->v.
    sel = qdc_select(FIRST, SECOND, k=6, k1=2)
    assert _ids(sel) == ["a", "b", "x", "y", "z", "v"]
    assert [s.parent_id for s in sel[2:]] == ["a", "b", "a", "b"]


def test_qdc_deduplicates_and_handles_exhaustion():
    first = ["a", "a", "b"]  # a repeated in the first ranking
    second = {"a": ["a", "b"], "b": ["b", "a", "q"]}
    sel = qdc_select(first, second, k=4)
    assert _ids(sel) == ["a", "b", "q"]  # a's ranking is exhausted, b adds q: fewer than k
    assert len(set(_ids(sel))) == len(sel)
    with pytest.raises(KeyError):
        qdc_select(FIRST, {"a": SECOND["a"]}, k=4)


@pytest.fixture(scope="module")
def tiny_classifier():
    """A real BERT sequence classifier (1 layer, 16 dims) with seeded random weights and the
    real MiniLM tokenizer: fixed weights, deterministic, fast."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from models.encoders import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("minilm"))
    cfg = ClassifierConfig(max_length=64, max_query_tokens=16, num_labels=1)
    with torch.random.fork_rng():
        torch.manual_seed(1234)
        backbone = BertForSequenceClassification(BertConfig(
            vocab_size=tok.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=64, num_labels=1))
    model = DRRAGClassifier(backbone, cfg).eval()
    return model, tok


def _probs(tiny_classifier) -> PairProbs:
    model, tok = tiny_classifier
    return PairProbs(question_scorer(model, tok, QUESTION, TEXTS))


def _constant_head(tiny_classifier, bias: float) -> PairProbs:
    model, tok = tiny_classifier
    head = model.backbone.classifier
    saved = head.weight.detach().clone(), head.bias.detach().clone()
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(bias)
    probs = PairProbs(question_scorer(model, tok, QUESTION, TEXTS))
    probs.prefetch(cfs_candidate_pairs(FIRST, SECOND, 6, max_candidates=3) + cis_pairs(qdc_select(FIRST, SECOND, 6)))
    with torch.no_grad():
        head.weight.copy_(saved[0])
        head.bias.copy_(saved[1])
    return probs


def test_classifier_scores_are_probabilities_and_deterministic(tiny_classifier):
    pairs = cfs_candidate_pairs(FIRST, SECOND, 6, max_candidates=3)
    p1, p2 = _probs(tiny_classifier), _probs(tiny_classifier)
    p1.prefetch(pairs)
    values = [p1[pair] for pair in pairs]
    assert all(0.0 < v < 1.0 for v in values)
    # scored one by one = scored in one batch, up to float reduction order (batched matmuls sum in
    # a different order than single rows; a loaded machine showed 0.5013389587 vs 0.5013388991)
    assert values == pytest.approx([p2[pair] for pair in pairs], abs=1e-6)
    assert len(set(values)) > 1  # the pair matters: a real model, not a constant


@pytest.mark.parametrize("k", [3, 4, 6])
def test_cfs_follows_algorithm(tiny_classifier, k):
    probs = _probs(tiny_classifier)
    pairs = cfs_candidate_pairs(FIRST, SECOND, k, max_candidates=3)
    probs.prefetch(pairs)
    values = sorted(probs[p] for p in pairs)
    threshold = values[len(values) // 2]  # the median: some candidates pass, some do not
    sel = cfs_select(FIRST, SECOND, probs, k, threshold, max_candidates=3)
    k1, k2 = split_budget(k)
    chosen = _ids(sel)
    assert chosen[:k1] == FIRST[:k1] and all(s.stage == 1 for s in sel[:k1])  # static-relevant d* kept
    assert len(chosen) == len(set(chosen)) <= k
    for s in sel[k1:]:
        assert s.stage == 2 and s.prob == probs[(s.parent_id, s.paragraph_id)] >= threshold
        ranking = SECOND[s.parent_id]
        # every candidate the parent passed over was selected by then, or was rejected
        for c in ranking[:ranking.index(s.paragraph_id)]:
            assert c in chosen or probs[(s.parent_id, c)] < threshold
    assert set(pairs) >= set(cfs_first_pairs(FIRST, SECOND, k, n_candidates=3))


def test_cfs_threshold_extremes_with_constant_head(tiny_classifier):
    accept_all = _constant_head(tiny_classifier, bias=3.0)   # P = sigmoid(3) ≈ 0.95 everywhere
    reject_all = _constant_head(tiny_classifier, bias=-3.0)  # P ≈ 0.05
    for k in (3, 4, 6):
        qdc = qdc_select(FIRST, SECOND, k)
        assert _ids(cfs_select(FIRST, SECOND, accept_all, k, 0.5, max_candidates=3)) == _ids(qdc)
        assert _ids(cfs_select(FIRST, SECOND, reject_all, k, 0.5, max_candidates=3)) == FIRST[:split_budget(k)[0]]
        assert _ids(cis_select(qdc, accept_all, 0.5)) == _ids(qdc)
        assert _ids(cis_select(qdc, reject_all, 0.5)) == ["a"]  # the top-1 anchor is always kept


def test_cfs_max_candidates_limits_the_walk():
    # Only (a, z) is acceptable; with max_candidates=2 a judges x, y and stops; with 3 it reaches z.
    probs = {pair: 0.0 for pair in cfs_candidate_pairs(FIRST, SECOND, 3, max_candidates=5)}
    probs[("a", "z")] = 0.9
    assert _ids(cfs_select(FIRST, SECOND, probs, 3, 0.5, max_candidates=2)) == ["a", "b"]
    assert _ids(cfs_select(FIRST, SECOND, probs, 3, 0.5, max_candidates=3)) == ["a", "b", "z"]
    with pytest.raises(KeyError):
        cfs_select(FIRST, SECOND, {}, 3, 0.5)


def test_cis_judges_each_document_with_its_anchor(tiny_classifier):
    qdc = qdc_select(FIRST, SECOND, 6)  # a b c | x(a) y(b) z(c)
    assert cis_pairs(qdc) == [("a", "b"), ("a", "c"), ("a", "x"), ("b", "y"), ("c", "z")]
    probs = _probs(tiny_classifier)
    values = sorted(probs[p] for p in cis_pairs(qdc))
    threshold = values[2]
    kept = cis_select(qdc, probs, threshold)
    expected = ["a"] + [d.paragraph_id for (anchor, _), d in zip(cis_pairs(qdc), qdc[1:])
                        if probs[(anchor, d.paragraph_id)] >= threshold]
    assert _ids(kept) == expected and 1 < len(kept) < len(qdc)
    assert all(isinstance(d, Selected) and d.prob is not None for d in kept[1:])
    assert cis_select([], probs, 0.5) == []
