"""FiD reader (models/fid.py): input encoding, shapes, cross-attentions, first-token attention."""
from __future__ import annotations

import gzip
import json

import pytest
import torch

from funnelrag.datasets import default_mirror, resolve
from models.fid import FiDConfig, FiDReader, encode_fid_inputs, format_fid_input

MIRROR = default_mirror()
pytestmark = [pytest.mark.skipif(MIRROR is None, reason="no data mirror (../shared/data)"),
              pytest.mark.usefixtures("one_torch_thread")]
TINY = dict(d_model=64, n_layers=2, n_heads=4, d_ff=128)




@pytest.fixture(scope="module")
def tok_dir():
    return str(resolve("t5-tokenizer", MIRROR).parent)


@pytest.fixture(scope="module")
def oracle():
    """First 8 NQ-open oracle questions: (question, answers, gold (title, text))."""
    rows = []
    with gzip.open(resolve("nq-open-oracle", MIRROR), "rt", encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            rows.append((r["question"], r["answers"], (r["ctxs"][0]["title"], r["ctxs"][0]["text"])))
            if len(rows) == 8:
                break
    return rows


@pytest.fixture(scope="module")
def tiny(tok_dir):
    model, tok = FiDReader.from_config(FiDConfig(tokenizer=tok_dir, **TINY))
    return model.eval(), tok


def _batch(oracle, tok, n_passages=3, max_length=48, batch=2):
    questions = [q for q, _, _ in oracle[:batch]]
    passages = [[oracle[(i + k) % len(oracle)][2] for k in range(n_passages)] for i in range(batch)]
    return questions, passages, encode_fid_inputs(tok, questions, passages, max_length)


def test_scratch_build_is_seeded_eager_and_leaves_global_rng_alone(tok_dir):
    torch.manual_seed(0)
    expected_next = torch.rand(1)
    torch.manual_seed(0)
    a, _ = FiDReader.from_config(FiDConfig(tokenizer=tok_dir, seed=5, **TINY))
    assert torch.equal(torch.rand(1), expected_next)
    b, _ = FiDReader.from_config(FiDConfig(tokenizer=tok_dir, seed=5, **TINY))
    c, _ = FiDReader.from_config(FiDConfig(tokenizer=tok_dir, seed=6, **TINY))
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)
    assert a.t5.config._attn_implementation == "eager"
    assert a.t5.config.d_model == 64 and a.n_layers == 2
    with pytest.raises(ValueError, match="tokenizer"):
        FiDReader.from_config(FiDConfig(**TINY))


def test_forward_shapes_loss_and_cross_attentions(tiny, oracle):
    model, tok = tiny
    questions, passages, _ = _batch(oracle, tok)
    passages[1][2] = ("Kiss", "a rock band")  # short: its pair is padded
    enc = encode_fid_inputs(tok, questions, passages, 48)
    batch, n_passages, seq_len = enc.input_ids.shape
    assert (batch, n_passages, seq_len) == (2, 3, 48)
    labels = tok([oracle[0][1][0], oracle[1][1][0]], padding=True, return_tensors="pt").input_ids
    out = model(enc.input_ids, enc.attention_mask, labels=labels, output_attentions=True)
    tgt_len = labels.shape[1]
    assert out.loss.ndim == 0 and torch.isfinite(out.loss)
    assert out.logits.shape == (batch, tgt_len, len(tok))
    assert len(out.cross_attentions) == 2
    for att in out.cross_attentions:
        assert att.shape == (batch, 4, tgt_len, n_passages * seq_len)
        torch.testing.assert_close(att.sum(-1), torch.ones(batch, 4, tgt_len))
        # padded key positions get no attention
        pad = (enc.attention_mask.view(batch, 1, 1, n_passages * seq_len) == 0).expand_as(att)
        assert pad.any() and att[pad].max() < 1e-6
    assert model(enc.input_ids, enc.attention_mask, labels=labels).cross_attentions is None


def test_sdpa_is_refused(tiny, tok_dir):
    from transformers import T5ForConditionalGeneration

    model, _ = tiny
    sdpa_cfg = model.t5.config.__class__.from_dict(model.t5.config.to_dict())
    sdpa_cfg._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="eager"):
        FiDReader(T5ForConditionalGeneration(sdpa_cfg), FiDConfig(tokenizer=tok_dir, **TINY))


def test_missing_cross_attentions_raise(tok_dir, oracle):
    model, tok = FiDReader.from_config(FiDConfig(tokenizer=tok_dir, **TINY))
    _, _, enc = _batch(oracle, tok)
    model.t5.set_attn_implementation("sdpa")  # switched behind FiD's back: no weights come out
    with pytest.raises(RuntimeError, match="cross-attention"):
        model.first_token_cross_attention(enc.input_ids, enc.attention_mask)


def test_passage_token_mask_marks_title_and_context_tokens(tiny, oracle):
    _, tok = tiny
    q, _, (title, text) = oracle[0]
    q_ids = tok(f"question: {q}", add_special_tokens=False).input_ids
    p_ids = tok(f"title: {title} context: {text}", add_special_tokens=False).input_ids
    full, start = format_fid_input(q, title, text)
    assert full[start:].startswith("title:")
    # one long passage (truncated) and one short one (padded) in the same batch
    short = ("Kiss", "a rock band")
    enc = encode_fid_inputs(tok, [q], [[(title, text), short]], max_length=40)
    ids, mask, att = enc.input_ids[0], enc.passage_token_mask[0], enc.attention_mask[0]
    assert mask.dtype == torch.bool and ids.shape == (2, 40)
    # truncated pair: question tokens, then passage tokens up to the limit, then EOS
    assert ids[0, :len(q_ids)].tolist() == q_ids
    assert not mask[0, :len(q_ids)].any()
    assert ids[0][mask[0]].tolist() == p_ids[:40 - 1 - len(q_ids)]
    assert ids[0, -1].item() == tok.eos_token_id and not mask[0, -1]
    # short pair: exactly its passage tokens; EOS and padding excluded
    short_ids = tok(f"title: {short[0]} context: {short[1]}", add_special_tokens=False).input_ids
    assert ids[1][mask[1]].tolist() == short_ids
    n_real = int(att[1].sum())
    assert n_real == len(q_ids) + len(short_ids) + 1 and n_real < 40
    assert not mask[1, n_real - 1:].any()
    # a limit inside the question leaves no passage token
    tight = encode_fid_inputs(tok, [q], [[(title, text)]], max_length=len(q_ids) - 2)
    assert not tight.passage_token_mask.any()


def test_encode_rejects_ragged_passage_lists(tiny, oracle):
    _, tok = tiny
    with pytest.raises(ValueError, match="question 1 has 1 passages"):
        encode_fid_inputs(tok, ["a", "b"], [[oracle[0][2], oracle[1][2]], [oracle[2][2]]], 32)


def test_first_token_cross_attention_equals_teacher_forced_first_position(tiny, oracle):
    model, tok = tiny
    _, _, enc = _batch(oracle, tok)
    batch, n_passages, seq_len = enc.input_ids.shape
    first = model.first_token_cross_attention(enc.input_ids, enc.attention_mask)
    assert first.shape == (2, batch, 4, n_passages, seq_len)
    torch.testing.assert_close(first.sum((-1, -2)), torch.ones(2, batch, 4))
    labels = tok([oracle[0][1][0], oracle[1][1][0]], padding=True, return_tensors="pt").input_ids
    with torch.no_grad():
        full = model(enc.input_ids, enc.attention_mask, labels=labels, output_attentions=True).cross_attentions
    for layer, att in enumerate(full):   # att: (batch, n_heads, tgt_len, n_passages * seq_len)
        torch.testing.assert_close(first[layer], att[:, :, 0].reshape(batch, 4, n_passages, seq_len))


def test_generate_is_greedy_and_bounded(tiny, oracle):
    model, tok = tiny
    _, _, enc = _batch(oracle, tok)
    a = model.generate(enc.input_ids, enc.attention_mask, max_answer_tokens=5)
    b = model.generate(enc.input_ids, enc.attention_mask, max_answer_tokens=5)
    assert a.shape[0] == 2 and a.shape[1] <= 6 and torch.equal(a, b)
    assert (a[:, 0] == model.t5.config.decoder_start_token_id).all()
