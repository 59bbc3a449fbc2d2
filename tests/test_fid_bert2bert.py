"""The MiniLM-warm-started (BERT2BERT) FiD reader: warm start, Eq. 3 by hand, training, resume, save/load."""
from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from models.fid import encode_fid_inputs
from models.fid_bert2bert import Bert2BertFiDConfig, Bert2BertFiDReader
from tasks.funnel.attention import AttentionRunConfig, AttentionScoreConfig, passage_scores, score_candidates

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PASSAGES = [("Paris", "Paris is the capital and largest city of France."),
            ("Seine", "The Seine flows through Paris into the English Channel."),
            ("Berlin", "Berlin is the capital of Germany.")]


@pytest.fixture(scope="module")
def tiny_bert_dir(tmp_path_factory) -> Path:
    """A 2-layer, 32-dim BERT checkpoint with the real MiniLM (BERT uncased) tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from models.encoders import resolve_model_path

    out = tmp_path_factory.mktemp("tiny_bert")
    tok = AutoTokenizer.from_pretrained(resolve_model_path("minilm"))
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tiny(tiny_bert_dir):
    model, tok = Bert2BertFiDReader.from_config(Bert2BertFiDConfig(base=str(tiny_bert_dir), seed=3))
    return model.eval(), tok


def _layer0_first_token_attention(model, hidden, mask):
    """Cross-attention probabilities of decoder layer 0 at position 0, from the weights by hand.

    The decoder input is ``[CLS]`` alone: causal self-attention over one key has weight 1, so the
    self-attention output is the value projection of the embedding; then residual + LayerNorm,
    the cross-attention query, keys from the fused encodings, scaled dot products, masked softmax.
    """
    bert = model.model.decoder.bert
    layer = bert.encoder.layer[0]
    emb = bert.embeddings(input_ids=torch.tensor([[model.decoder_start_token_id]]))      # (1, 1, d)
    sa = layer.attention
    h = sa.output.LayerNorm(sa.output.dense(sa.self.value(emb)) + emb)                    # (1, 1, d)
    ca = layer.crossattention.self
    n_heads, d = ca.num_attention_heads, ca.attention_head_size
    q = ca.query(h).view(1, 1, n_heads, d).transpose(1, 2)                                # (1, H, 1, d)
    k = ca.key(hidden).view(1, -1, n_heads, d).transpose(1, 2)                            # (1, H, S, d)
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(d)                                     # (1, H, 1, S)
    logits = logits.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    return logits.softmax(-1)[0, :, 0]                                                    # (H, S)


def test_warm_start_copies_minilm_into_both_sides_and_asserts_eager():
    from safetensors.torch import load_file

    from models.encoders import resolve_model_path

    model, tok = Bert2BertFiDReader.from_config(Bert2BertFiDConfig())
    assert model.attn_implementation == "eager" and model.n_layers == 6
    src = load_file(str(Path(resolve_model_path("minilm")) / "model.safetensors"))
    name = next(k for k in src if k.endswith("encoder.layer.3.attention.self.query.weight"))
    torch.testing.assert_close(model.model.encoder.encoder.layer[3].attention.self.query.weight, src[name])
    torch.testing.assert_close(model.model.decoder.bert.encoder.layer[3].attention.self.query.weight, src[name])
    assert model.model.config.decoder.is_decoder and model.model.config.decoder.add_cross_attention
    model.model.config.decoder._attn_implementation = "sdpa"
    with pytest.raises(ValueError, match="eager"):
        Bert2BertFiDReader(model.model, model.cfg, tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)


def test_first_token_cross_attention_equals_hand_computation(tiny):
    model, tok = tiny
    enc = encode_fid_inputs(tok, ["what is the capital of france"], [PASSAGES], 24)
    attn = model.first_token_cross_attention(enc.input_ids, enc.attention_mask)   # (L, 1, H, 3, seq_len)
    n_layers, _, n_heads, n_passages, seq_len = attn.shape
    assert (n_layers, n_heads, n_passages) == (2, 4, 3)
    torch.testing.assert_close(attn.sum((-2, -1)), torch.ones(2, 1, 4))
    hidden, mask = model.encode(enc.input_ids, enc.attention_mask)                # (1, 3 * seq_len, d)
    by_hand = _layer0_first_token_attention(model, hidden, mask)                  # (H, 3 * seq_len)
    torch.testing.assert_close(attn[0, 0].reshape(n_heads, -1), by_hand, atol=1e-6, rtol=1e-5)
    # the same position of a teacher-forced forward (what the T5 reader documents too)
    labels = model.answer_labels(tok, ["paris"], 8)
    full = model(enc.input_ids, enc.attention_mask, labels=labels, output_attentions=True)
    for layer in range(n_layers):
        torch.testing.assert_close(full.cross_attentions[layer][0, :, 0].reshape(n_heads, n_passages, seq_len),
                                   attn[layer, 0], atol=1e-6, rtol=1e-5)


def test_eq3_scores_of_the_warm_started_reader_equal_a_loop_over_layers_heads_tokens(tiny):
    model, tok = tiny
    question = "what is the capital of france"
    rows = [{"question_id": "q1", "cluster_id": 1, "bm25_score": 1.0, "unit_id": "c0000001.u000", "unit_rank": 0,
             "prerank_score": 0.5, "unit_has_answer": True, "passage_id": f"c0000001.u000.p{i:03d}",
             "passage_position": i, "title": t, "text": x, "has_answer": i == 0} for i, (t, x) in enumerate(PASSAGES)]
    from data_contracts.funnel import CANDIDATES

    cands = CANDIDATES.validate(pa.Table.from_pylist(rows, schema=CANDIDATES.schema))
    lr = 3
    got = score_candidates(cands, pa.table({"question_id": ["q1"], "question": [question]}), model, tok,
                           AttentionScoreConfig(n_representative=lr), AttentionRunConfig(max_passage_tokens=24))
    enc = encode_fid_inputs(tok, [question], [PASSAGES], 24)
    attn = model.first_token_cross_attention(enc.input_ids, enc.attention_mask)[:, 0]  # (L, H, 3, seq_len)
    ids = enc.input_ids[0]
    expected = []
    for p in range(len(PASSAGES)):
        text = tok.decode(ids[p][enc.passage_token_mask[0, p]])
        assert text.startswith("title :") and "question" not in text        # query tokens excluded
        per_head = []
        for layer in range(attn.shape[0]):
            for head in range(attn.shape[1]):
                values = sorted((float(attn[layer, head, p, t]) for t in range(ids.shape[-1])
                                 if enc.passage_token_mask[0, p, t]), reverse=True)[:lr]
                per_head.append(sum(values) / len(values))
        expected.append(sum(per_head) / len(per_head))
    torch.testing.assert_close(torch.tensor(got["score"].to_pylist()), torch.tensor(expected), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(passage_scores(attn[:, None], enc.passage_token_mask, AttentionScoreConfig(
        n_representative=lr))[0], torch.tensor(expected), atol=1e-6, rtol=1e-5)


def test_answer_labels_end_with_sep_and_generation_starts_with_cls(tiny):
    model, tok = tiny
    labels = model.answer_labels(tok, ["paris", "the river seine flows"], 4)
    assert labels.tolist()[0][:2] == [tok.convert_tokens_to_ids("paris"), tok.sep_token_id]
    assert labels[0, 2:].eq(-100).all() and labels[1, -1] == tok.sep_token_id and labels.shape[1] == 4
    enc = encode_fid_inputs(tok, ["capital of france"], [PASSAGES], 24)
    ids = model.generate(enc.input_ids, enc.attention_mask, max_answer_tokens=5)
    assert ids[0, 0] == tok.cls_token_id and 2 <= ids.shape[1] <= 6
    with pytest.raises(ValueError, match="labels or decoder_input_ids"):
        model(enc.input_ids, enc.attention_mask)


# ---------------------------------------------------------------------------- training, resume, registry
def _examples(n=6):
    from tasks.funnel.reader import ReaderExample

    answers = ["paris", "seine", "berlin"]
    return [ReaderExample(f"question number {i} about {answers[i % 3]}", (answers[i % 3],),
                          tuple((f"p{i}.{j}", t, x) for j, (t, x) in enumerate(PASSAGES))) for i in range(n)]


def _reader_cfg(base: Path, out: Path, freeze: bool, **train_kw):
    from funnelrag.training import TrainConfig
    from tasks.funnel.reader import ReaderTrainConfig

    train = dict(output_dir=str(out), seed=2, epochs=2, batch_size=2, lr=1e-3, warmup_steps=1, log_every=1, cpu=True)
    return ReaderTrainConfig(fid=Bert2BertFiDConfig(base=str(base), seed=3, freeze_encoder=freeze, max_answer_tokens=4),
                             train=TrainConfig(**{**train, **train_kw}), n_passages=3, max_passage_tokens=24,
                             max_answer_tokens=4)


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


class Crash(RuntimeError):
    pass


@pytest.mark.slow  # trains the warm-started reader (straight, killed, resumed)
@pytest.mark.parametrize("freeze", [True, False])
def test_killed_reader_run_resumes_to_the_same_final_weights(tiny_bert_dir, tmp_path, freeze):
    from tasks.funnel.reader import load_reader, train_reader

    straight = train_reader(_examples(), _reader_cfg(tiny_bert_dir, tmp_path / "a", freeze))
    assert straight.train.global_step == 6 and straight.train.losses[-1] < straight.train.losses[0]

    def crash(metrics, step):
        if step == 4:
            raise Crash("killed at step 4")

    cfg = _reader_cfg(tiny_bert_dir, tmp_path / "b", freeze, checkpoint_every=3)
    with pytest.raises(Crash):
        train_reader(_examples(), cfg, log_metrics=crash)
    resumed = train_reader(_examples(), cfg)
    assert resumed.train.global_step == 6
    torch.testing.assert_close(torch.tensor(resumed.train.losses), torch.tensor(straight.train.losses))
    a, b = _weights(straight.model_dir), _weights(resumed.model_dir)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)
    model, tok, loaded_cfg = load_reader(resumed.model_dir)
    assert loaded_cfg.fid.kind == "minilm-bert2bert" and model.attn_implementation == "eager"
    src = _weights(tiny_bert_dir)
    enc_name = next(k for k in a if k.endswith("encoder.encoder.layer.0.attention.self.query.weight"))
    src_name = next(k for k in src if k.endswith("encoder.layer.0.attention.self.query.weight"))
    assert torch.equal(a[enc_name], src[src_name]) == freeze   # a frozen encoder stays the warm start


@pytest.mark.slow  # trains both reader kinds and registers them in MLflow
def test_both_reader_kinds_register_and_load_from_the_registry(tiny_bert_dir, tmp_path, data_mirror):
    from funnelrag.datasets import resolve
    from funnelrag.registry import model_uri, register_model
    from funnelrag.tracking import flow_run
    from funnelrag.training import TrainConfig
    from funnelrag.workspace import Workspace
    from models.fid import FiDConfig, FiDReader
    from tasks.evaluate.models import load_reader_ref
    from tasks.funnel.reader import ReaderTrainConfig, save_reader

    tok_dir = resolve("t5-tokenizer", data_mirror).parent
    t5_cfg = ReaderTrainConfig(fid=FiDConfig(tokenizer=str(tok_dir), d_model=32, n_layers=2, n_heads=2, d_ff=64),
                               train=TrainConfig(output_dir=""), n_passages=3, max_passage_tokens=24)
    b2b_cfg = _reader_cfg(tiny_bert_dir, tmp_path, freeze=True)
    ws = Workspace(tmp_path / "home")
    enc_inputs = {}
    for name, cfg in (("t5", t5_cfg), ("minilm-bert2bert", b2b_cfg)):
        from models.readers import build_reader

        model, tok = build_reader(cfg.fid)
        saved = save_reader(model, tok, cfg, tmp_path / f"saved-{name}")
        with flow_run(ws, "reader-registry-test", f"run-{name}", {"kind": name}):
            decision = register_model(saved, f"reader-{name}", config={"kind": name}, data_version="d",
                                      metrics={"dev_em": 0.1}, gate_metric="dev_em")
        assert decision.promoted
        loaded, ltok, resolved = load_reader_ref(model_uri(f"reader-{name}"), tmp_path / "dl", tok_dir)
        assert type(loaded) is type(model) and loaded.attn_implementation == "eager"
        enc = encode_fid_inputs(ltok, ["capital of france"], [PASSAGES], 24)
        torch.testing.assert_close(loaded.first_token_cross_attention(enc.input_ids, enc.attention_mask),
                                   model.eval().first_token_cross_attention(enc.input_ids, enc.attention_mask))
        enc_inputs[name] = enc.input_ids
    assert isinstance(build_reader(t5_cfg.fid)[0], FiDReader)
    assert not torch.equal(enc_inputs["t5"][..., :3], enc_inputs["minilm-bert2bert"][..., :3])  # two tokenizers


def test_reader_kind_in_the_distillation_config_picks_the_reader():
    from flows.funnel import Context, DistillationConfig

    def reader_cfg(over):
        cfg = DistillationConfig.model_validate(over)
        return Context(cfg, None, None, None, "", Path("/t5-tokenizer")).reader_config()

    assert reader_cfg({}).fid.kind == "t5" and reader_cfg({}).fid.tokenizer == "/t5-tokenizer"
    b2b = reader_cfg({"reader": {"kind": "minilm-bert2bert", "bert2bert": {"seed": 4, "freeze_encoder": True}}}).fid
    assert isinstance(b2b, Bert2BertFiDConfig) and b2b.seed == 4 and b2b.freeze_encoder
    with pytest.raises(ValueError):
        DistillationConfig.model_validate({"reader": {"kind": "gpt"}})


@pytest.mark.slow  # trains the warm-started reader
def test_reader_from_checkpoint_rebuilds_the_final_reader_and_an_earlier_one(tiny_bert_dir, tmp_path):
    """The learning curve's readers: the last checkpoint equals the saved reader; an earlier one differs."""
    from funnelrag.training import checkpoint_dirs
    from tasks.funnel.reader import reader_from_checkpoint

    cfg = _reader_cfg(tiny_bert_dir, tmp_path / "run", True, checkpoint_every=3, keep_checkpoints=5)
    from tasks.funnel.reader import train_reader

    final = train_reader(_examples(), cfg)
    ckpts = checkpoint_dirs(tmp_path / "run")
    assert [c.name for c in ckpts] == ["step_00000003", "step_00000006"]
    last = _weights(reader_from_checkpoint(ckpts[-1], cfg, tmp_path / "last"))
    saved = _weights(final.model_dir)
    assert last.keys() == saved.keys()
    for name in saved:
        torch.testing.assert_close(last[name], saved[name], msg=name)
    first = _weights(reader_from_checkpoint(ckpts[0], cfg, tmp_path / "first"))
    assert any(not torch.equal(first[n], saved[n]) for n in saved)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        reader_from_checkpoint(tmp_path, cfg, tmp_path / "none")
