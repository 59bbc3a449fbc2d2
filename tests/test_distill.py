"""Eq. 6 BPR loss against the direct formula, pair sampling, and a real distillation step."""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from funnelrag.training import TrainConfig, train
from models.preranker import PreRankerConfig, build_preranker, score
from tasks.funnel.distill import (BPRHooks, DistillConfig, DistillExample, PairDataset, bpr_loss, build_examples,
                           prepare_for_distillation, sample_pairs)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


def test_bpr_matches_direct_formula_and_is_stable():
    pos = torch.tensor([2.0, -1.0, 0.3, 0.0])
    neg = torch.tensor([1.0, 1.5, 0.3, 0.0])
    direct = torch.tensor([-math.log(1 / (1 + math.exp(-(p - n)))) for p, n in zip(pos.tolist(), neg.tolist())])
    torch.testing.assert_close(bpr_loss(pos, neg), direct)
    scaled = torch.tensor([-math.log(1 / (1 + math.exp(-20 * (p - n)))) for p, n in zip(pos.tolist(), neg.tolist())])
    torch.testing.assert_close(bpr_loss(pos, neg, scale=20.0), scaled)
    far = bpr_loss(torch.tensor([-200.0]), torch.tensor([200.0]))     # naive log(sigmoid) = log(0) = -inf
    assert torch.isfinite(far).all() and far.item() == pytest.approx(400.0)


def _example(q="q1", n_pos=2, n_neg=5):
    return DistillExample(q, f"question {q}", tuple((f"p{i}", f"positive text {i}") for i in range(n_pos)),
                          tuple((f"n{i}", f"negative text {i}") for i in range(n_neg)))


def test_all_pairs_when_few_and_hash_sampled_when_many():
    ex = _example()
    item = sample_pairs(ex, 0, DistillConfig(max_pairs_per_question=100))
    assert len(item.pairs) == 10 and len(item.docs) == 7
    assert all(item.docs[a].startswith("positive") and item.docs[b].startswith("negative") for a, b in item.pairs)
    cfg = DistillConfig(max_pairs_per_question=4, seed=5)
    a0, a0_again, a1 = sample_pairs(ex, 0, cfg), sample_pairs(ex, 0, cfg), sample_pairs(ex, 1, cfg)
    assert len(a0.pairs) == 4 and a0 == a0_again
    named = lambda it: {(it.docs[p], it.docs[n]) for p, n in it.pairs}  # noqa: E731
    assert named(a0) != named(a1)   # another epoch draws another subset (fixed seed: deterministic)
    other_seed = sample_pairs(ex, 0, DistillConfig(max_pairs_per_question=4, seed=6))
    assert named(other_seed) != named(a0)


def test_dataset_expands_epochs():
    ds = PairDataset([_example("a"), _example("b")], DistillConfig(epochs=3, max_pairs_per_question=2))
    assert len(ds) == 6 and ds[1].question == "question b" and ds[5].question == "question b"
    with pytest.raises(ValueError):
        PairDataset([], DistillConfig())


def test_build_examples_skips_and_counts():
    labels = pa.table({"question_id": ["q1", "q1", "q1", "q2", "q3"],
                       "unit_id": ["u1", "u2", "u3", "u1", "u2"],
                       "positive": [True, False, False, True, False]})
    questions = pa.table({"question_id": ["q1", "q2", "q3"], "question": ["one", "two", "three"]})
    units = pa.table({"unit_id": ["u1", "u2", "u3"], "text": ["t1", "t2", "t3"]})
    examples, report = build_examples(labels, questions, units)
    assert [e.question_id for e in examples] == ["q1"]
    assert examples[0].positives == (("u1", "t1"),) and examples[0].negatives == (("u2", "t2"), ("u3", "t3"))
    assert report == {"questions": 3, "used": 1, "no_positive": 1, "no_negative": 1, "pairs": 2}
    with pytest.raises(KeyError, match="u9"):
        build_examples(pa.table({"question_id": ["q1"], "unit_id": ["u9"], "positive": [True]}), questions, units)


def test_hooks_loss_is_per_question_mean_of_eq6():
    class Fixed(torch.nn.Module):
        def forward(self, scores):
            return type("Out", (), {"scores": scores})()
    hooks = BPRHooks(tokenize=None, tokenizer=None)
    batch = {"scores": torch.tensor([1.0, 0.0, 2.0, 3.0, -1.0]),
             "pair_pos": torch.tensor([0, 0, 3]), "pair_neg": torch.tensor([1, 2, 4]),
             "pair_question": torch.tensor([0, 0, 1])}
    loss, extra = hooks.loss(Fixed(), batch)
    q0 = (bpr_loss(torch.tensor([1.0]), torch.tensor([0.0])) + bpr_loss(torch.tensor([1.0]), torch.tensor([2.0]))) / 2
    q1 = bpr_loss(torch.tensor([3.0]), torch.tensor([-1.0]))
    torch.testing.assert_close(loss, ((q0 + q1) / 2).squeeze())
    assert extra["pair_accuracy"] == pytest.approx(2 / 3)


@pytest.mark.slow  # trains the MiniLM pre-ranker through the shared loop
def test_distillation_through_shared_loop_moves_scores_toward_labels(tmp_path):
    """A few BPR steps on the real MiniLM cross-encoder raise s(d+) − s(d−) of the trained pairs."""
    model, tok = build_preranker(PreRankerConfig(kind="cross", max_length=64, seed=0))
    examples = [
        DistillExample("q1", "who painted the mona lisa",
                       (("u1", "Leonardo da Vinci painted the Mona Lisa in Florence."),),
                       (("u2", "The Nile is the longest river in Africa."), ("u3", "Penguins live in Antarctica."))),
        DistillExample("q2", "what is the capital of france",
                       (("u4", "Paris is the capital and largest city of France."),),
                       (("u5", "Mount Everest is the highest mountain."),)),
    ]

    def margin():
        m = []
        for ex in examples:
            s = score(model, tok, ex.question, [t for _, t in ex.positives + ex.negatives])
            m.append(s[0] - s[1:].max())
        return np.array(m)

    before = margin()
    cfg = DistillConfig(epochs=4, max_pairs_per_question=4)
    n_total = sum(p.numel() for p in model.parameters())
    n_trainable = prepare_for_distillation(model, cfg)
    assert n_trainable == n_total - model.model.bert.embeddings.word_embeddings.weight.numel()
    frozen = model.model.bert.embeddings.word_embeddings.weight.detach().clone()
    hooks = BPRHooks(model.tokenize, tok, cfg.score_scale)
    result = train(model, PairDataset(examples, cfg), hooks,
                   TrainConfig(output_dir=str(tmp_path / "run"), batch_size=2, lr=1e-3, cpu=True, seed=0))
    assert result.global_step == 4 and all(math.isfinite(x) for x in result.losses)
    after = margin()
    assert (after > before).all() and result.losses[-1] < result.losses[0]
    torch.testing.assert_close(model.model.bert.embeddings.word_embeddings.weight, frozen)
