"""Query-side MaxP distillation: a bi-encoder with a separate query tower, Eq. 6 over MaxP unit
scores from stored passage vectors, and the MaxP re-ranking of a unit pool, on a real mini corpus
(NQ-open oracle gold passages, 3 articles per cluster) with the real MiniLM weights."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from oracle_corpus import funnel_stage_dirs, oracle_clusters

from data_contracts.funnel import LABELS
from funnelrag.training import TrainConfig
from models.preranker import QUERY_ENCODER_DIR, PreRankerConfig, build_preranker, load_preranker, save_preranker, score
from tasks.corpus.segment import SegmentConfig, segment_cluster, segments_to_tables
from tasks.corpus.tokenize import WhitespaceCounter
from tasks.funnel import stages as S
from tasks.funnel.candidates import CandidatesConfig, build_candidates, rerank_pool, unit_passages
from tasks.funnel.distill import DistillConfig, MaxPBPRHooks, PairItem, bpr_loss, prepare_for_distillation
from tasks.funnel.embeddings import build_embedding_index, embed_queries, embed_texts, model_version
from tasks.qa.questions import QuestionsConfig, load_questions

SEG = SegmentConfig(passage_words=30, unit_max_tokens=70, tokenizer="whitespace")
QUERIES = ["who painted the mona lisa", "what is the capital of france"]
DOCS = ["Leonardo da Vinci painted the Mona Lisa.", "Paris is the capital of France.",
        "Penguins live in Antarctica."]


@pytest.fixture(scope="module")
def mini(data_mirror):
    path, clusters, index = oracle_clusters(data_mirror, 24)
    questions, _ = load_questions([path], QuestionsConfig(limit=8))
    segs = [segment_cluster(c, clusters[c], SEG, WhitespaceCounter()) for c in sorted(clusters)]
    _, passages = segments_to_tables(segs)
    return {"questions": questions, "index": index, "passages": passages,
            "members_of": lambda ids: {c: clusters[c] for c in ids}}


def _bi():
    return build_preranker(PreRankerConfig(kind="bi", max_length=64))


def test_separate_towers_score_as_shared_until_trained_and_round_trip(tmp_path, one_torch_thread):
    model, tok = _bi()
    base = np.stack([score(model, tok, q, DOCS) for q in QUERIES])          # (2, 3)
    version = model_version(model)
    model.separate_towers()
    assert model.cfg.towers == "separate" and model.query_encoder is not model.encoder
    np.testing.assert_allclose(np.stack([score(model, tok, q, DOCS) for q in QUERIES]), base, atol=1e-6)
    with torch.no_grad():   # train-like change of the query tower only
        for p in model.query_encoder.backbone.encoder.layer[-1].parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    moved = np.stack([score(model, tok, q, DOCS) for q in QUERIES])
    assert np.abs(moved - base).max() > 1e-3
    assert model_version(model) == version            # the document tower keys the embedding index
    np.testing.assert_allclose(embed_texts(model, tok, DOCS), embed_texts(_bi()[0], tok, DOCS), atol=1e-6)
    assert np.abs(embed_queries(model, tok, QUERIES) - embed_texts(model, tok, QUERIES)).max() > 1e-3
    save_preranker(model, tok, tmp_path / "pre")
    assert (tmp_path / "pre" / QUERY_ENCODER_DIR / "config.json").exists()
    loaded, ltok = load_preranker(tmp_path / "pre")
    assert loaded.cfg.towers == "separate" and loaded.cfg.max_length == 64
    np.testing.assert_allclose(np.stack([score(loaded, ltok, q, DOCS) for q in QUERIES]), moved, atol=1e-5)
    assert model_version(loaded) == version


def test_forward_with_stored_vectors_equals_encoded_documents(one_torch_thread):
    model, tok = _bi()
    model.separate_towers()
    batch = model.tokenize(tok, QUERIES, DOCS[:2])
    doc_query = torch.tensor([0, 1, 1])
    d = tok(DOCS, padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        encoded = model(batch["query_input_ids"], batch["query_attention_mask"], d["input_ids"], d["attention_mask"],
                        doc_query=doc_query).scores                                     # (3,)
        stored = model(batch["query_input_ids"], batch["query_attention_mask"],
                       doc_vectors=torch.from_numpy(embed_texts(model, tok, DOCS)), doc_query=doc_query).scores
        rows = model(**batch).scores                                                    # query i with doc i
    torch.testing.assert_close(stored, encoded, atol=1e-5, rtol=0)
    torch.testing.assert_close(rows, encoded[:2], atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="exactly one"):
        model(batch["query_input_ids"], batch["query_attention_mask"])
    with pytest.raises(ValueError, match="towers"):
        PreRankerConfig(kind="cross", towers="separate")


def test_maxp_hooks_loss_is_eq6_over_unit_maxima():
    """Unit score = max of its passages' scores; Eq. 6 averaged per question, then over questions."""
    vectors = np.eye(4, dtype=np.float32)
    hooks = MaxPBPRHooks(tokenizer=lambda *a, **k: {"input_ids": torch.zeros(2, 1, dtype=torch.long),
                                                     "attention_mask": torch.ones(2, 1, dtype=torch.long)},
                         max_length=8, scale=2.0, vectors=vectors)
    items = [PairItem("q0", ((0, 1), (2,), (3,)), ((0, 1), (0, 2))), PairItem("q1", ((1,), (0, 3)), ((0, 1),))]
    batch = hooks.collate(items)
    assert batch["doc_vectors"].shape == (7, 4)
    assert batch["doc_query"].tolist() == [0, 0, 0, 0, 1, 1, 1]
    assert batch["passage_unit"].tolist() == [0, 0, 1, 2, 3, 4, 4]
    assert batch["pair_pos"].tolist() == [0, 0, 3] and batch["pair_neg"].tolist() == [1, 2, 4]

    class Fixed(torch.nn.Module):   # passage scores stand in for the model
        def forward(self, **inputs):
            return type("Out", (), {"scores": torch.tensor([0.1, 0.9, 0.5, 1.2, 0.3, -0.2, 0.4])})()

    loss, extra = hooks.loss(Fixed(), batch)
    units = torch.tensor([0.9, 0.5, 1.2, 0.3, 0.4])     # max over each unit's passages
    q0 = (bpr_loss(units[0], units[1], 2.0) + bpr_loss(units[0], units[2], 2.0)) / 2
    q1 = bpr_loss(units[3], units[4], 2.0)
    torch.testing.assert_close(loss, (q0 + q1) / 2)
    assert extra["pair_accuracy"] == pytest.approx(1 / 3)


def _stage_dirs(mini, model, tok, tmp_path):
    """A MaxP candidates stage directory and answer-only labels (𝒦 = 0) of the mini corpus."""
    cfg = CandidatesConfig(n_clusters=3, n_units=3, batch_size=8, unit_scoring="maxp")
    cs = build_candidates(mini["questions"], mini["index"], mini["members_of"], SEG, WhitespaceCounter(),
                          model, tok, cfg)
    return (cs, *funnel_stage_dirs(cs, mini["questions"], tmp_path))


@pytest.mark.slow  # distils the MiniLM pre-ranker on the real mini funnel (module fixture)
def test_query_side_maxp_distillation_trains_the_query_tower_only(mini, tmp_path, one_torch_thread):
    model, tok = _bi()
    cs, cand_dir, label_dir = _stage_dirs(mini, model, tok, tmp_path)
    index, _ = build_embedding_index(mini["passages"], model, tok, "digest-a")
    cfg = DistillConfig(epochs=3, max_pairs_per_question=16, score_scale=20.0, unit_scoring="maxp", towers="query")
    train_cfg = TrainConfig(output_dir="", batch_size=4, lr=1e-4, cpu=True, seed=0)
    pre = PreRankerConfig(kind="bi", max_length=64)
    out = {}
    for name, idx in (("stored", index), ("computed", None)):
        out[name] = S.run_distill(cand_dir, label_dir, pre, cfg, train_cfg, tmp_path / f"run-{name}",
                                  tmp_path / f"out-{name}", index=idx)
    stored = out["stored"]
    assert stored["used"] >= 2 and stored["towers"] == "query" and stored["unit_scoring"] == "maxp"
    assert all(math.isfinite(x) for x in (stored["first_loss"], stored["last_loss"]))
    # the stored vectors are the frozen document tower's: the same training as computing them
    assert out["computed"]["last_loss"] == pytest.approx(stored["last_loss"], abs=1e-4)
    trained, ttok = load_preranker(tmp_path / "out-stored" / S.PRERANKER_DIR)
    assert trained.cfg.towers == "separate"
    assert model_version(trained) == model_version(model)            # the index stays valid
    base_q = dict(model.encoder.backbone.named_parameters())
    moved = [n for n, p in trained.query_encoder.backbone.named_parameters() if not torch.equal(p, base_q[n])]
    assert moved and not any("embeddings.word_embeddings" in n for n in moved)   # embeddings frozen
    # the distilled query tower ranks the trained positives higher (MaxP, stored vectors)
    units, questions = cs.unit_pool, mini["questions"]
    passages_of = unit_passages(mini["passages"], units["unit_id"].to_pylist())
    before = rerank_pool(units, cs.units, questions, model, tok, 8, passages_of, index)
    after = rerank_pool(units, cs.units, questions, trained, ttok, 8, passages_of, index)
    labels = LABELS.read(label_dir)
    pos = {(q, u) for q, u, p in zip(labels["question_id"].to_pylist(), labels["unit_id"].to_pylist(),
                                     labels["positive"].to_pylist()) if p}

    def mean_pos_rank(pool):
        ranks = [r for q, u, r in zip(pool["question_id"].to_pylist(), pool["unit_id"].to_pylist(),
                                      pool["prerank_rank"].to_pylist()) if (q, u) in pos]
        return float(np.mean(ranks))

    assert mean_pos_rank(after) <= mean_pos_rank(before)
    with pytest.raises(ValueError, match="bi-encoder"):
        prepare_for_distillation(build_preranker(PreRankerConfig(kind="cross", max_length=32))[0], cfg)


@pytest.mark.slow  # distils the MiniLM pre-ranker on the real mini funnel (module fixture)
def test_maxp_rerank_from_stored_vectors_equals_computed(mini, one_torch_thread):
    model, tok = _bi()
    cs = build_candidates(mini["questions"], mini["index"], mini["members_of"], SEG, WhitespaceCounter(), model, tok,
                          CandidatesConfig(n_clusters=3, n_units=2, batch_size=8, unit_scoring="maxp"))
    index, _ = build_embedding_index(mini["passages"], model, tok, "digest-a")
    passages_of = unit_passages(mini["passages"], cs.unit_pool["unit_id"].to_pylist())
    stored = rerank_pool(cs.unit_pool, cs.units, mini["questions"], model, tok, 8, passages_of, index)
    computed = rerank_pool(cs.unit_pool, cs.units, mini["questions"], model, tok, 8, passages_of)
    for name in ("question_id", "unit_id", "prerank_rank"):
        assert stored[name].to_pylist() == computed[name].to_pylist() == cs.unit_pool[name].to_pylist(), name
    np.testing.assert_allclose(stored["prerank_score"].to_numpy(), computed["prerank_score"].to_numpy(), atol=1e-5)
    first = rerank_pool(cs.unit_pool, cs.units, mini["questions"], model, tok, 8)   # from the unit text
    assert not np.allclose(first["prerank_score"].to_numpy(), stored["prerank_score"].to_numpy())


@pytest.mark.slow  # distils the MiniLM pre-ranker on the real mini funnel (module fixture)
def test_validation_search_measures_every_epoch_on_train_split_questions_only(mini, tmp_path, one_torch_thread):
    """The BPR search trains on the fit part, measures a checkpoint per epoch on the validation part
    (disjoint, by hash), and the last checkpoint is the run's trained pre-ranker."""
    from tasks.funnel.experiment_validation import (
        ValidationConfig,
        load_checkpoint_preranker,
        validation_curve,
        validation_ids,
        validation_table,
    )

    model, tok = _bi()
    _, cand_dir, label_dir = _stage_dirs(mini, model, tok, tmp_path)
    index, _ = build_embedding_index(mini["passages"], model, tok, "digest-a")
    cfg = ValidationConfig(fraction=0.5, seed=1, lrs=(1e-4, 1e-5), epochs=2)
    val = validation_ids(mini["questions"], cfg)
    assert val == validation_ids(mini["questions"], cfg) and 0 < len(val) < mini["questions"].num_rows
    d_cfg = DistillConfig(max_pairs_per_question=16, score_scale=20.0, unit_scoring="maxp", towers="query")
    t_cfg = TrainConfig(output_dir="", batch_size=3, cpu=True, seed=0)   # 4 fit questions: a short last batch
    pre = PreRankerConfig(kind="bi", max_length=64)
    curve = validation_curve(cand_dir, cand_dir, label_dir, mini["passages"], pre, d_cfg, t_cfg, cfg, tmp_path / "v",
                             [1, 2], index)
    assert curve["validation_questions"] == len(val) and curve["fit_questions"] >= 1
    fit_labels = LABELS.read(tmp_path / "v" / "fit_labels")
    assert not set(fit_labels["question_id"].to_pylist()) & val        # never trained on a validation question
    assert sorted({r["lr"] for r in curve["runs"]}) == [1e-5, 1e-4]
    assert all(set(r["ar"]) == {"1", "2"} for r in curve["runs"])
    for lr in (1e-4, 1e-5):   # 8 items (2 epochs x 4 questions) in batches of 3: checkpoints at steps 1, 2, 3
        runs = [r for r in curve["runs"] if r["lr"] == lr]
        assert [r["step"] for r in runs] == [1, 2, 3] and [r["epochs"] for r in runs] == [0.75, 1.5, 2.0]
    best = max(curve["runs"], key=lambda r: (r["ar"]["1"], -r["epochs"], -r["lr"]))
    assert curve["best"] == {"lr": best["lr"], "epochs": best["epochs"], "ar": best["ar"]}
    assert "chosen by validation AR@1" in validation_table(json.loads(json.dumps(curve)))
    from funnelrag.training import checkpoint_dirs
    last, _ = load_checkpoint_preranker(checkpoint_dirs(tmp_path / "v" / "lr-0.0001" / "train")[-1], pre, d_cfg)
    saved, _ = load_preranker(tmp_path / "v" / "lr-0.0001" / "out" / S.PRERANKER_DIR)
    for (name, a), (_, b) in zip(last.state_dict().items(), saved.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
