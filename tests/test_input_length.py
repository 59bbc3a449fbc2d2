"""One source for a pre-ranker's input length: the model's own, stored with the saved weights."""
from __future__ import annotations

import json

from models.encoders import resolve_model_path
from models.preranker import PreRankerConfig, build_preranker, load_preranker, native_max_length, save_preranker
from tasks.evaluate.models import load_preranker_ref


def test_minilm_runs_at_its_own_length_and_saved_models_keep_theirs(tmp_path):
    assert native_max_length(resolve_model_path("minilm")) == 256        # sentence_bert_config.json
    model, tok = build_preranker(PreRankerConfig(kind="bi"))
    assert model.cfg.max_length == 256 and model.encoder.cfg.max_length == 256
    baseline, _, _ = load_preranker_ref("minilm", tmp_path / "dl")
    assert baseline.cfg.max_length == 256
    short, stok = build_preranker(PreRankerConfig(kind="bi", max_length=96))
    saved = save_preranker(short, stok, tmp_path / "short")
    assert json.loads((saved / "preranker.json").read_text())["max_length"] == 96
    again, _ = load_preranker(saved)
    assert again.cfg.max_length == 96 and again.encoder.cfg.max_length == 96
    via_ref, _, _ = load_preranker_ref(str(saved), tmp_path / "dl")
    assert via_ref.cfg.max_length == 96


def test_native_length_falls_back_to_the_tokenizer_then_positions(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 384}))
    assert native_max_length(str(tmp_path)) == 384
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 10 ** 30}))
    assert native_max_length(str(tmp_path)) == 512
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 128}))
    assert native_max_length(str(tmp_path)) == 128
