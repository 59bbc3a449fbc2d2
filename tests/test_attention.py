"""Eq. 3 passage scores on a hand-computed tensor, Table 7/8 variants, and a loop reference."""
from __future__ import annotations

import itertools

import pytest
import torch

from tasks.attention import AttentionScoreConfig, passage_scores

# (n_layers=2, batch=1, n_heads=2, n_passages=2, seq_len=5); tokens 0-1 are question tokens,
# passage 1's last token is padding.
ATTN = torch.tensor([
    [[[[0.50, 0.40, 0.10, 0.30, 0.20], [0.90, 0.05, 0.60, 0.20, 0.70]],     # layer 0, head 0
      [[0.10, 0.10, 0.20, 0.60, 0.40], [0.30, 0.30, 0.10, 0.10, 0.90]]]],   # layer 0, head 1
    [[[[0.00, 0.00, 0.30, 0.10, 0.10], [0.00, 0.00, 0.20, 0.40, 0.00]],     # layer 1, head 0
      [[0.00, 0.00, 0.05, 0.05, 0.80], [0.00, 0.00, 0.50, 0.30, 0.00]]]],   # layer 1, head 1
])
PASSAGE_MASK = torch.tensor([[[0, 0, 1, 1, 1], [0, 0, 1, 1, 0]]], dtype=torch.bool)
ATTENTION_MASK = torch.tensor([[[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]], dtype=torch.bool)


def scores(**kw):
    cfg = AttentionScoreConfig(**{"n_representative": 2, **kw})
    return passage_scores(ATTN, PASSAGE_MASK, cfg, attention_mask=ATTENTION_MASK)


def test_shape_of_hand_example():
    assert ATTN.shape == (2, 1, 2, 2, 5)


def test_eq3_hand_computed():
    # top-2 passage tokens per (layer, head): p0 -> .25 .5 .2 .425 ; p1 -> .4 .1 .3 .4
    torch.testing.assert_close(scores(), torch.tensor([[0.34375, 0.30]]))


def test_query_tokens_are_excluded_and_representatives_chosen_per_layer_head():
    loud_query = ATTN.clone()
    loud_query[..., :2] = 50.0                       # question tokens dominate if they counted
    cfg = AttentionScoreConfig(n_representative=2)
    torch.testing.assert_close(passage_scores(loud_query, PASSAGE_MASK, cfg), scores())
    # choosing the representatives once for all layers and heads (by mean attention: tokens 3
    # and 4 of p0) would give (0.2625 + 0.375) / 2 = 0.31875, not Eq. 3's 0.34375
    assert not torch.isclose(scores()[0, 0], torch.tensor(0.31875))


def test_fewer_tokens_than_lr_averages_what_is_there_and_empty_passage_scores_zero():
    # lr=4: p1 has only 2 passage tokens -> mean over those 2 (= all-token mean for p1)
    got = scores(n_representative=4)
    torch.testing.assert_close(got[0, 1], torch.tensor(0.30))
    mask = PASSAGE_MASK.clone()
    mask[0, 1] = False
    out = passage_scores(ATTN, mask, AttentionScoreConfig(n_representative=2))
    assert out[0, 1] == 0.0 and torch.isclose(out[0, 0], torch.tensor(0.34375))


@pytest.mark.parametrize("kw,expected", [
    ({"layer_reduce": "max"}, [0.375, 0.35]),                 # Table 7: max over layers
    ({"head_reduce": "max"}, [0.4625, 0.40]),                 # Table 7: max over heads
    ({"token_reduce": "max"}, [0.50, 0.40]),                  # Table 7: max over tokens
    ({"last_layers": 1}, [0.3125, 0.35]),                     # Table 7: last layers only
    ({"n_representative": None}, [1.0666667 / 4, 0.30]),      # Table 8: all tokens w/o query
    ({"n_representative": None, "include_query": True}, [0.215, 0.246875]),  # Table 8: with query
])
def test_table7_table8_variants(kw, expected):
    torch.testing.assert_close(scores(**kw), torch.tensor([expected]), rtol=1e-5, atol=1e-6)


def _reference(attn, mask, lr):
    """Direct loops over (batch, passage, layer, head): sort the passage's tokens, average top lr."""
    n_layers, batch, n_heads, n_passages, _ = attn.shape
    out = torch.zeros(batch, n_passages)
    for b, p in itertools.product(range(batch), range(n_passages)):
        idx = mask[b, p].nonzero().flatten()
        if len(idx) == 0:
            continue
        total = 0.0
        for layer, h in itertools.product(range(n_layers), range(n_heads)):
            vals = sorted(attn[layer, b, h, p, idx].tolist(), reverse=True)[:lr]
            total += sum(vals) / len(vals)
        out[b, p] = total / (n_layers * n_heads)
    return out


def test_matches_loop_reference_on_random_softmax_attention():
    gen = torch.Generator().manual_seed(0)
    n_layers, batch, n_heads, n_passages, seq_len = 3, 2, 4, 5, 11
    logits = torch.randn(n_layers, batch, n_heads, n_passages * seq_len, generator=gen)
    attn = logits.softmax(-1).view(n_layers, batch, n_heads, n_passages, seq_len)  # (L, B, H, P, T)
    mask = torch.rand(batch, n_passages, seq_len, generator=gen) > 0.3
    mask[1, 4] = False
    for lr in (1, 4, 20):
        got = passage_scores(attn, mask, AttentionScoreConfig(n_representative=lr))
        torch.testing.assert_close(got, _reference(attn, mask, lr), rtol=1e-5, atol=1e-7)


def test_bad_inputs():
    with pytest.raises(ValueError, match="include_query"):
        passage_scores(ATTN, PASSAGE_MASK, AttentionScoreConfig(include_query=True))
    with pytest.raises(ValueError, match="shape"):
        passage_scores(ATTN, PASSAGE_MASK[:, :1], AttentionScoreConfig())
    with pytest.raises(ValueError):
        AttentionScoreConfig(layer_reduce="median")
    with pytest.raises(ValueError):
        passage_scores(ATTN[0], PASSAGE_MASK, AttentionScoreConfig())
