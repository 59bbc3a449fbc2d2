"""R²-Former (Eq. 2) and QDM head/loss (Eqs. 7–8): shapes, masking, loss formula."""
from __future__ import annotations

import math

import pytest
import torch

from models.r2former import QDMHead, R2Former, R2FormerConfig, R2FormerQDM, qdm_loss

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


def _model(**kw) -> R2FormerQDM:
    torch.manual_seed(0)
    return R2FormerQDM(R2FormerConfig(**kw)).eval()


def test_output_shapes_follow_the_paper_sizes():
    cfg = R2FormerConfig()
    assert (cfg.hidden_size, cfg.n_heads, cfg.dropout) == (256, 4, 0.1)  # Appendix D
    model = _model()
    feats = torch.randn(3, 10, 3)
    mask = torch.ones(3, 10, dtype=torch.bool)
    out = model(feats, mask, labels=torch.zeros(3, 10))
    assert out.hidden.shape == (3, 10, 256)
    assert out.logits.shape == out.scores.shape == (3, 10)
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert R2Former(cfg)(feats, mask).hidden.shape == (3, 10, 256)
    assert QDMHead(256)(out.hidden).shape == (3, 10)


def test_padding_does_not_change_real_documents():
    model = _model(n_features=2, n_layers=1)
    feats = torch.randn(1, 4, 2)
    short = model(feats, torch.ones(1, 4, dtype=torch.bool))
    padded_feats = torch.cat([feats, torch.randn(1, 3, 2) * 100], dim=1)  # (1, 7, 2), junk padding
    mask = torch.tensor([[True] * 4 + [False] * 3])
    padded = model(padded_feats, mask)
    torch.testing.assert_close(padded.logits[:, :4], short.logits, rtol=1e-5, atol=1e-5)
    assert torch.all(padded.scores[:, 4:] == 0) and torch.all(torch.isinf(padded.logits[:, 4:]))


def test_positional_embeddings_make_rank_matter():
    model = _model(n_layers=1)
    same = torch.ones(1, 5, 3)  # identical features at every rank
    logits = model(same, torch.ones(1, 5, dtype=torch.bool)).logits
    assert len(set(logits.flatten().tolist())) > 1


def test_qdm_loss_is_eq8_summed_over_documents_and_averaged_over_lists():
    logits = torch.tensor([[2.0, -1.0, 0.5], [0.3, 0.0, 9.0]])
    labels = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    s = torch.sigmoid(logits)

    def bce(y, p):
        return -(y * math.log(p) + (1 - y) * math.log(1 - p))

    list1 = sum(bce(labels[0, i].item(), s[0, i].item()) for i in range(3))
    list2 = sum(bce(labels[1, i].item(), s[1, i].item()) for i in range(2))  # padded doc ignored
    assert qdm_loss(logits, labels, mask).item() == pytest.approx((list1 + list2) / 2, rel=1e-6)


def test_qdm_training_step_lowers_the_loss():
    model = _model(n_layers=1, hidden_size=32, n_heads=2)
    model.train()
    g = torch.Generator().manual_seed(1)
    feats = torch.randn(8, 6, 3, generator=g)
    labels = (feats[..., 0] > 0).float()  # relevance decides the label: learnable
    mask = torch.ones(8, 6, dtype=torch.bool)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    first = model(feats, mask, labels).loss.item()
    for _ in range(30):
        opt.zero_grad()
        model(feats, mask, labels).loss.backward()
        opt.step()
    assert model(feats, mask, labels).loss.item() < first


def test_bad_inputs_raise():
    model = _model(max_docs=4)
    with pytest.raises(ValueError, match="max_docs"):
        model(torch.randn(1, 5, 3), torch.ones(1, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(batch, n_docs, 3\)"):
        model(torch.randn(1, 3, 2), torch.ones(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one document"):
        model(torch.randn(2, 3, 3), torch.tensor([[True] * 3, [False] * 3]))
    with pytest.raises(ValueError, match="divisible"):
        R2FormerConfig(hidden_size=10, n_heads=4)
