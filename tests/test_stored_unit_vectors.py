"""Unit vectors kept by content: a bi-encoder pre-ranking units from their text reads each unit's
document-tower vector from the model version's vector store, so the same unit is embedded once
whatever step asks (both splits' pools, the re-ranking after query-side fine-tuning, the gate), on a
real mini corpus (NQ-open oracle gold passages) with the real MiniLM weights."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from oracle_corpus import funnel_stage_dirs, oracle_clusters

from data_contracts.funnel import LABELS
from models.preranker import PreRankerConfig, build_preranker, score_grouped
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.tokenize import WhitespaceCounter
from tasks.funnel import stages as S
from tasks.funnel.candidates import CandidatesConfig, build_candidates, rerank_pool
from tasks.funnel.distill import BPRHooks, DistillConfig, MaxPBPRHooks, PairDataset, build_examples
from tasks.funnel.unit_scoring import stored_text_scores
from tasks.qa.questions import QuestionsConfig, load_questions

SEG = SegmentConfig(passage_words=30, unit_max_tokens=70, tokenizer="whitespace")
PRE = PreRankerConfig(kind="bi", max_length=64)
CFG = CandidatesConfig(n_clusters=2, n_units=2, batch_size=8)
pytestmark = pytest.mark.slow   # the real MiniLM pre-ranker over a real mini funnel


@pytest.fixture(scope="module")
def mini(data_mirror):
    path, clusters, index = oracle_clusters(data_mirror, 16)
    questions, _ = load_questions([path], QuestionsConfig(limit=6))
    return {"questions": questions, "index": index, "members_of": lambda ids: {c: clusters[c] for c in ids}}


def _candidates(mini, model, tok, unit_store=None):
    return build_candidates(mini["questions"], mini["index"], mini["members_of"], SEG, WhitespaceCounter(),
                            model, tok, CFG, unit_store=unit_store)


def test_stored_unit_vectors_rank_as_computed_and_embed_each_unit_once(mini, tmp_path, one_torch_thread):
    model, tok = build_preranker(PRE)
    computed = _candidates(mini, model, tok)
    store = S.unit_vector_store(model, tmp_path)
    stored = _candidates(mini, model, tok, store)
    for name in ("question_id", "unit_id", "prerank_rank"):
        assert stored.unit_pool[name].to_pylist() == computed.unit_pool[name].to_pylist(), name
    np.testing.assert_allclose(stored.unit_pool["prerank_score"].to_numpy(),
                               computed.unit_pool["prerank_score"].to_numpy(), atol=1e-5)
    assert len(S.unit_vector_store(model, tmp_path)) == stored.units.num_rows    # each distinct unit once

    # query-side fine-tuning changes the query tower only: the same store, nothing embedded again
    model.separate_towers()
    with torch.no_grad():
        for p in model.query_encoder.backbone.encoder.layer[-1].parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    again = S.unit_vector_store(model, tmp_path)
    assert again.root == store.root
    questions, texts = mini["questions"]["question"].to_pylist(), stored.units["text"].to_pylist()
    pairs = [(i, j) for i in range(len(questions)) for j in range(len(texts))]
    scores, info = stored_text_scores(model, tok, questions, texts, pairs, again, 8)      # (n_pairs,)
    assert info["embedded"] == 0 and info["reused"] == len(texts)
    np.testing.assert_allclose(scores, score_grouped(model, tok, questions, texts, pairs, 8), atol=1e-5)
    reranked = rerank_pool(stored.unit_pool, stored.units, mini["questions"], model, tok, 8, unit_store=again)
    plain = rerank_pool(stored.unit_pool, stored.units, mini["questions"], model, tok, 8)
    for name in ("question_id", "unit_id", "prerank_rank"):
        assert reranked[name].to_pylist() == plain[name].to_pylist(), name
    with pytest.raises(ValueError, match="bi-encoder"):
        rerank_pool(stored.unit_pool, stored.units, mini["questions"], model, tok, 8, passages_of={}, unit_store=again)


def test_query_side_distillation_from_unit_text_reads_the_frozen_towers_vectors(mini, tmp_path, one_torch_thread):
    model, tok = build_preranker(PRE)
    cs = _candidates(mini, model, tok, S.unit_vector_store(model, tmp_path / "cache"))
    cand_dir, label_dir = funnel_stage_dirs(cs, mini["questions"], tmp_path, top_k=1)
    cfg = DistillConfig(epochs=1, max_pairs_per_question=4, score_scale=20.0, towers="query")
    held = len(S.unit_vector_store(model, tmp_path / "cache"))

    trained, ttok, _, data, hooks, report = S.distill_setup(cand_dir, label_dir, PRE, cfg, vector_cache=tmp_path / "cache")
    assert isinstance(hooks, MaxPBPRHooks) and hooks.vectors is not None and report["used"] >= 1
    assert len(S.unit_vector_store(model, tmp_path / "cache")) == held        # every unit read, none embedded
    # the same Eq. 6 loss as encoding each unit text with the frozen document tower
    examples, _ = build_examples(LABELS.read(label_dir), mini["questions"], cs.units)
    text_items = [PairDataset(examples, cfg)[i] for i in range(len(data))]
    text_hooks = BPRHooks(trained.tokenize, ttok, cfg.score_scale)
    trained.eval()
    with torch.no_grad():
        from_vectors, _ = hooks.loss(trained, hooks.collate([data[i] for i in range(len(data))]))
        from_texts, _ = text_hooks.loss(trained, text_hooks.collate(text_items))
    assert float(from_vectors) == pytest.approx(float(from_texts), abs=1e-4)
