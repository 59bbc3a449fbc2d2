"""Reader training stage (tasks/funnel/reader.py) on real NQ-open oracle questions and passages."""
from __future__ import annotations

import gzip
import json
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from funnelrag.datasets import default_mirror, resolve
from funnelrag.training import TrainConfig
from models.fid import FiDConfig, encode_fid_inputs
from tasks.funnel.reader import (READER_CONFIG, ReaderExample, ReaderHooks, ReaderTrainConfig, load_reader,
                                select_examples, train_reader)

MIRROR = default_mirror()
pytestmark = [pytest.mark.skipif(MIRROR is None, reason="no data mirror (../shared/data)"),
              pytest.mark.usefixtures("one_torch_thread")]




@pytest.fixture(scope="module")
def examples():
    """8 real oracle questions; passages = the gold passage + the next question's gold passage."""
    rows = []
    with gzip.open(resolve("nq-open-oracle", MIRROR), "rt", encoding="utf-8") as fh:
        for line in fh:
            rows.append(json.loads(line))
            if len(rows) == 8:
                break
    gold = [(f"oracle-{i}", r["ctxs"][0]["title"], r["ctxs"][0]["text"]) for i, r in enumerate(rows)]
    return [ReaderExample(r["question"], tuple(r["answers"]), (gold[i], gold[(i + 1) % 8]))
            for i, r in enumerate(rows)]


def _cfg(tmp_path, **train_kw):
    tok_dir = str(resolve("t5-tokenizer", MIRROR).parent)
    fid = FiDConfig(tokenizer=tok_dir, d_model=64, n_layers=2, n_heads=4, d_ff=128, dropout=0.0)
    tc = dict(output_dir=str(tmp_path), max_steps=40, batch_size=4, lr=1e-2, scheduler="constant", cpu=True)
    tc.update(train_kw)
    return ReaderTrainConfig(fid=fid, train=TrainConfig(**tc), n_passages=2, max_passage_tokens=64,
                             max_answer_tokens=16)


@pytest.mark.slow  # trains the FiD reader (40 steps)
def test_overfits_eight_real_questions_and_round_trips(tmp_path, examples):
    cfg = _cfg(tmp_path)
    logged = []
    res = train_reader(examples, cfg, log_metrics=lambda m, s: logged.append(m))
    losses = res.train.losses
    assert len(losses) == 40 and res.report.kept == 8
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert logged and all("train/answer_tokens" in m for m in logged)

    assert res.model_dir == tmp_path / "reader"
    names = {p.name for p in res.model_dir.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", READER_CONFIG} <= names
    assert not list(tmp_path.glob(".reader*"))  # no temp dir left behind

    model, tok, loaded_cfg = load_reader(res.model_dir)
    assert loaded_cfg.train == cfg.train and loaded_cfg.n_passages == 2
    assert loaded_cfg.fid.base == str(res.model_dir) and model.t5.config._attn_implementation == "eager"
    saved = load_file(str(res.model_dir / "model.safetensors"))
    for name, p in model.t5.state_dict().items():
        if name in saved:
            torch.testing.assert_close(p, saved[name])
    enc = encode_fid_inputs(tok, [e.question for e in examples],
                            [[(t, x) for _, t, x in e.passages] for e in examples], cfg.max_passage_tokens)
    answers = tok.batch_decode(model.generate(enc.input_ids, enc.attention_mask, 16), skip_special_tokens=True)
    memorised = sum(a.strip() == e.answers[0] for a, e in zip(answers, examples))
    assert memorised >= 6, list(zip(answers, [e.answers[0] for e in examples]))


@pytest.mark.slow  # trains the FiD reader (40 steps)
def test_reader_resume_after_crash_matches_straight_run(tmp_path, examples):
    class Crash(RuntimeError):
        pass

    def crash(metrics, step):
        if step == 5:
            raise Crash

    run = tmp_path / "b"
    cfg = _cfg(run, max_steps=6, lr=1e-3, scheduler="linear", checkpoint_every=3, log_every=1)
    # dropout on: the RNG state must come back from the checkpoint too
    cfg = replace(cfg, fid=replace(cfg.fid, dropout=0.1))
    straight_cfg = replace(cfg, train=replace(cfg.train, output_dir=str(tmp_path / "c"), checkpoint_every=0))
    straight = train_reader(examples, straight_cfg)
    with pytest.raises(Crash):
        train_reader(examples, cfg, log_metrics=crash)
    resumed = train_reader(examples, cfg)
    torch.testing.assert_close(torch.tensor(resumed.train.losses), torch.tensor(straight.train.losses))
    a = load_file(str(resumed.model_dir / "model.safetensors"))
    b = load_file(str(straight.model_dir / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k])


@pytest.mark.slow  # trains the FiD reader (40 steps)
def test_gradient_checkpointing_gives_the_same_losses(tmp_path, examples):
    from funnelrag.training import train
    from models.fid import FiDReader

    plain = train_reader(examples, _cfg(tmp_path / "plain", max_steps=2))
    cfg = _cfg(tmp_path / "gc", max_steps=2, gradient_checkpointing=True)
    model, tok = FiDReader.from_config(cfg.fid)
    assert not any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    ckpt = train(model, examples, ReaderHooks(tok, cfg), cfg.train)
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.modules())
    torch.testing.assert_close(torch.tensor(ckpt.losses), torch.tensor(plain.train.losses))


def test_labels_mask_padding_and_bad_examples_are_counted(tmp_path, examples):
    cfg = _cfg(tmp_path)
    bad = [ReaderExample("q without answer", (), examples[0].passages),
           ReaderExample("q with one passage", ("x",), examples[0].passages[:1])]
    kept, report = select_examples([*examples[:2], *bad], n_passages=2)
    assert len(kept) == 2 and report.kept == 2
    assert (report.skipped_no_answer, report.skipped_too_few_passages, report.skipped_examples) == (1, 1, [2, 3])
    with pytest.raises(ValueError, match="no usable reader example"):
        train_reader(bad, cfg)

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.fid.tokenizer)
    batch = ReaderHooks(tok, cfg).collate(examples[:4])
    assert batch["input_ids"].shape[:2] == (4, 2)
    for row, ex in zip(batch["labels"], examples[:4]):
        target = tok(ex.answers[0], max_length=16, truncation=True).input_ids  # ends with EOS
        assert row[:len(target)].tolist() == target
        assert (row[len(target):] == -100).all()
