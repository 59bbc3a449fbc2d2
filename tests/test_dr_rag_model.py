"""The DR-RAG classifier C(q, d1, d2): input layout and truncation, losses, freezing, save/load,
and a few steps of the shared accelerate training loop."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from models.dr_rag import ClassifierConfig, DRRAGClassifier, encode_triples, load_classifier, save_classifier
from tasks.dr_rag.classifier import ClassifierHooks, score_triples
from tasks.dr_rag.pairs import ClassifierPair


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from models.encoders import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path("minilm"))


def tiny(tokenizer, num_labels=1, seed=0, max_length=64) -> DRRAGClassifier:
    from transformers import BertConfig, BertForSequenceClassification

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        backbone = BertForSequenceClassification(BertConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=32, max_position_embeddings=max_length, num_labels=num_labels))
    return DRRAGClassifier(backbone, ClassifierConfig(num_labels=num_labels, max_length=max_length, max_query_tokens=12))


LONG = " ".join(f"word{i}" for i in range(200))


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


def test_encode_triples_layout_and_truncation(tokenizer):
    cfg = ClassifierConfig(max_length=64, max_query_tokens=12)
    q, short, long_ = "who wrote the origin of species", "Charles Darwin wrote it.", LONG
    enc = encode_triples(tokenizer, [(q, short, long_), (q, short, short), (LONG, long_, long_)], cfg)
    ids, mask, types = enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]
    assert ids.shape[0] == 3 and ids.shape[1] <= cfg.max_length
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    q_ids = tokenizer(q, add_special_tokens=False)["input_ids"]
    s_ids = tokenizer(short, add_special_tokens=False)["input_ids"]
    row0 = ids[0][mask[0].bool()].tolist()
    assert len(row0) == cfg.max_length  # the long document fills the budget
    assert row0[:len(q_ids) + 2] == [cls, *q_ids, sep]
    assert row0[len(q_ids) + 2:len(q_ids) + 2 + len(s_ids) + 1] == [*s_ids, sep]  # the short d1 is whole
    assert row0[-1] == sep and row0.count(sep) == 3
    assert types[0][:len(q_ids) + 2].tolist() == [0] * (len(q_ids) + 2)
    assert set(types[0][len(q_ids) + 2:len(row0)].tolist()) == {1}
    row1 = ids[1][mask[1].bool()].tolist()
    assert row1 == [cls, *q_ids, sep, *s_ids, sep, *s_ids, sep]  # nothing cut when it fits
    row2 = ids[2][mask[2].bool()].tolist()
    assert row2.index(sep) == 1 + cfg.max_query_tokens  # the question is cut to max_query_tokens
    seps = [i for i, t in enumerate(row2) if t == sep]
    assert abs((seps[1] - seps[0]) - (seps[2] - seps[1])) <= 1  # two long documents share equally
    with pytest.raises(ValueError):
        encode_triples(tokenizer, [], cfg)


@pytest.mark.parametrize("num_labels", [1, 2])
def test_forward_probs_and_loss(tokenizer, num_labels):
    model = tiny(tokenizer, num_labels)
    batch = encode_triples(tokenizer, [("q one", "doc a", "doc b"), ("q two", "doc c", "doc d")], model.cfg)
    out = model(**batch, labels=torch.tensor([1, 0]))
    assert out.logits.shape == (2, num_labels) and out.probs.shape == (2,)
    assert torch.all((out.probs > 0) & (out.probs < 1))
    out.loss.backward()
    assert out.loss.ndim == 0 and model.backbone.classifier.weight.grad is not None
    assert model(**batch).loss is None
    with pytest.raises(ValueError):
        DRRAGClassifier(model.backbone, ClassifierConfig(num_labels=3 - num_labels))


def test_freeze_lower_layers(tokenizer):
    model = tiny(tokenizer)
    total = sum(p.numel() for p in model.parameters())
    n = model.freeze_lower_layers(1)
    assert 0 < n < total
    assert not any(p.requires_grad for p in model.backbone.bert.embeddings.parameters())
    assert not any(p.requires_grad for p in model.backbone.bert.encoder.layer[0].parameters())
    assert all(p.requires_grad for p in model.backbone.bert.encoder.layer[1].parameters())


def test_save_load_roundtrip(tokenizer, tmp_path):
    model = tiny(tokenizer, seed=3).eval()
    triples = [("who?", "a doc", "another doc"), ("what?", LONG, "x")]
    before = score_triples(model, tokenizer, triples)
    save_classifier(model, tokenizer, tmp_path / "clf")
    loaded, tok2 = load_classifier(tmp_path / "clf")
    assert loaded.cfg == model.cfg
    np.testing.assert_allclose(score_triples(loaded, tok2, triples), before, rtol=1e-5, atol=1e-6)
    with pytest.raises(FileNotFoundError):
        load_classifier(tmp_path)


def test_hooks_train_with_the_shared_loop(tokenizer, tmp_path):
    from funnelrag.training import TrainConfig, train

    texts = {f"p{i}": f"paragraph number {i} about topic {i % 3}" for i in range(6)}
    questions = {"q": "which topic is zero?"}
    pairs = [ClassifierPair("q", f"p{i}", f"p{(i + 1) % 6}", "sup_sup" if i % 2 else "non_non", i % 2) for i in range(6)]
    model = tiny(tokenizer, seed=5)
    hooks = ClassifierHooks(tokenizer, model.cfg, questions, texts)
    batch = hooks.collate(pairs[:4])
    assert batch["labels"].tolist() == [0, 1, 0, 1] and batch["input_ids"].shape[0] == 4
    before = model.backbone.classifier.weight.detach().clone()
    result = train(model, pairs, hooks, TrainConfig(output_dir=str(tmp_path / "run"), max_steps=3, batch_size=2,
                                                    lr=1e-2, cpu=True, log_every=1))
    assert result.global_step == 3 and len(result.losses) == 3 and all(np.isfinite(result.losses))
    assert not torch.equal(before, model.backbone.classifier.weight.detach())
