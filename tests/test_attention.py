"""Eq. 3 passage scores on a hand-computed tensor, Table 7/8 variants, and a loop reference."""
from __future__ import annotations

import itertools

import pytest
import torch

from tasks.funnel.attention import AttentionScoreConfig, passage_scores

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


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: 1 intra-op thread on shared cores


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


# ---------------------------------------------------------------------------- runner with a real (tiny) FiD
@pytest.fixture(scope="module")
def reader(data_mirror):
    from funnelrag.datasets import resolve
    from models.fid import FiDConfig, FiDReader

    tok_dir = resolve("t5-tokenizer", data_mirror).parent
    model, tok = FiDReader.from_config(FiDConfig(tokenizer=str(tok_dir), d_model=32, n_layers=2, n_heads=2, d_ff=64, seed=1))
    return model.eval(), tok


def _candidates(spec):
    import pyarrow as pa

    from data_contracts.funnel import CANDIDATES

    rows = []
    for q, units in spec.items():
        for rank, (uid, texts) in enumerate(units):
            for pos, text in enumerate(texts):
                rows.append({"question_id": q, "cluster_id": 1, "bm25_score": 1.0, "unit_id": uid, "unit_rank": rank,
                             "prerank_score": 0.5, "unit_has_answer": False, "passage_id": f"{uid}.p{pos:03d}",
                             "passage_position": pos, "title": f"Title {uid}", "text": text, "has_answer": False})
    return CANDIDATES.validate(pa.Table.from_pylist(rows, schema=CANDIDATES.schema))


SPEC = {
    "q1": [("c0000001.u000", ["Paris is the capital of France.", "The Seine flows through Paris."]),
           ("c0000002.u000", ["Berlin is in Germany."])],
    "q2": [("c0000003.u000", ["Mount Everest is high.", "K2 is the second highest mountain."])],
    "q3": [("c0000004.u000", ["Water boils at 100 degrees.", "Ice melts at 0 degrees.", "Steam is hot."])],
}


@pytest.mark.slow  # builds a T5 FiD reader and its tokenizer (module fixture)
def test_runner_matches_direct_eq3_and_batching(reader):
    import pyarrow as pa

    from models.fid import encode_fid_inputs
    from tasks.funnel.attention import AttentionRunConfig, score_candidates

    model, tok = reader
    questions = pa.table({"question_id": ["q1", "q2", "q3"],
                          "question": ["capital of france", "highest mountain", "boiling point of water"]})
    cands = _candidates(SPEC)
    cfg = AttentionScoreConfig(n_representative=4)
    one = score_candidates(cands, questions, model, tok, cfg, AttentionRunConfig(max_passage_tokens=48, batch_size=1))
    two = score_candidates(cands, questions, model, tok, cfg, AttentionRunConfig(max_passage_tokens=48, batch_size=2))
    assert one.num_rows == cands.num_rows and set(one["attention"].to_pylist()) == {"post_softmax"}
    assert one["passage_id"].to_pylist() == two["passage_id"].to_pylist()
    torch.testing.assert_close(torch.tensor(one["score"].to_pylist()), torch.tensor(two["score"].to_pylist()))

    enc = encode_fid_inputs(tok, ["capital of france"], [[("Title c0000001.u000", SPEC["q1"][0][1][0]),
                                                          ("Title c0000001.u000", SPEC["q1"][0][1][1]),
                                                          ("Title c0000002.u000", SPEC["q1"][1][1][0])]], 48)
    attn = model.first_token_cross_attention(enc.input_ids, enc.attention_mask)  # (L, 1, H, 3, seq_len)
    assert attn.shape[:4] == (2, 1, 2, 3)
    torch.testing.assert_close(attn.sum((-2, -1)), torch.ones(2, 1, 2))
    assert not enc.passage_token_mask[0, 0, 0]                                   # "question:" is not a passage token
    direct = passage_scores(attn, enc.passage_token_mask, cfg)[0]
    got = [r["score"] for r in one.to_pylist() if r["question_id"] == "q1"]      # sorted by passage id = same order
    torch.testing.assert_close(torch.tensor(got), direct)


@pytest.mark.slow  # builds a T5 FiD reader and its tokenizer (module fixture)
def test_runner_refuses_non_eager_attention(reader):
    import pyarrow as pa

    from tasks.funnel.attention import score_candidates

    model, tok = reader
    impl = model.t5.config._attn_implementation
    model.t5.config._attn_implementation = "sdpa"
    try:
        with pytest.raises(ValueError, match="eager"):
            score_candidates(_candidates(SPEC), pa.table({"question_id": ["q1"], "question": ["x"]}), model, tok)
    finally:
        model.t5.config._attn_implementation = impl
