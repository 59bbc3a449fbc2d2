"""The distillation experiment as a flow and a CLI command: its config, its cache keys (the same
as the earlier ``python -m tasks.funnel.experiment`` runner's, so cached homes are reused), and a
run twice on a real sample under the Prefect harness (the second run builds nothing)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from flows.experiment import COMMANDS, ExperimentConfig
from funnelrag.config import config_hash, deep_merge, load_config, parse_overrides, read_config_file
from tasks.funnel.experiment_steps import (attention_key, candidates_key, distill_key, labels_key, prerank_scores_key,
                                           reader_data_key, reader_key, recall_key, validation_key)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "configs/distillation_experiment_cpu.yaml"

# config_hash of every step's key config for the shipped YAML and SegmentConfig(), computed with
# the argparse runner (the former tasks/funnel/experiment.py) before it became this flow. A
# change here invalidates every cached experiment home: bump VERSION instead, on purpose.
PINNED_KEY_CONFIGS = {
    "questions": "351b2c56be31ad174d5763b6bdbffc0dfa99e5e2d18dd027ebcbf0f2de15fa6d",
    "candidates_dev": "4d906c34724a87ee6907ec71cf337696bffe84405176502156f9d5d0da8b4430",
    "candidates_train": "1e9535c8f63dbb28cb8d7c4fd54853b5590b3af7f4648bb43df62a4957f84f70",
    "reader_data": "1f653689901a80ec09116dab95789a970fd3f4db4942c95aa97d00848c50b8d8",
    "reader_dev_data": "8a1e7e1b2181e395d4d393beb8c0518cc3248dc63f4fcc1287a6f56adbb26810",
    "reader": "65a23ee5a52a04210db6e816bfbf7f58b53cc9958434c6c4224f5794269c56a2",
    "attention": "51a47659f1bcbeb2b5794787e0dfc5fbdd030ab6014326404148d9cadcc8ef56",
    "labels_l2g": "a51e5feb61e2b34bdb55a59a2eb8b5c2e53c94c64869f1a479e89fef7b47546c",
    "labels_answer_only": "b6632b60ef8944fb6eda23554e16ce0908703978b006e56dce6609d62f2c104a",
    "validation": "8f58d0543ca81c4147346ec2cab3e634c6c794cee8c81e6709941627088ffc0b",
    "distill": "7a651c5611aed4aeb7cca190899ec20f08f66b422d8fb84bf25afab0a077ebff",
    "prerank_passage_scores": "3c9c528161976c4dadf9e8ff19a998a093046797be8a8589c22935b7e5d3bb3e",
    "recall": "25f1a38f4ce9e058d598dfbf1a71c8f70de4d04f883a9c08ca02ba457d6d4abf",
}


def test_the_step_keys_of_the_shipped_config_are_those_of_the_earlier_runner():
    from tasks.corpus.segment import SegmentConfig

    c, seg = load_config(ExperimentConfig, SHIPPED), SegmentConfig()
    configs = {
        "questions": c.split, "candidates_dev": candidates_key(c, "dev", seg),
        "candidates_train": candidates_key(c, "train", seg), "reader_data": reader_data_key(c, "train"),
        "reader_dev_data": reader_data_key(c, "dev"), "reader": reader_key(c), "attention": attention_key(c),
        "labels_l2g": labels_key(c, True), "labels_answer_only": labels_key(c, False), "validation": validation_key(c),
        "distill": distill_key(c, c.distill, c.distill_train), "prerank_passage_scores": prerank_scores_key(c),
        "recall": recall_key(c)}
    assert {k: config_hash(v) for k, v in configs.items()} == PINNED_KEY_CONFIGS


def test_the_shipped_yaml_loads_and_inconsistent_settings_are_refused():
    cfg = load_config(ExperimentConfig, SHIPPED)
    assert cfg.train_vectors == "stored" and cfg.train_candidates.unit_scoring == "maxp"
    assert cfg.heldout_vectors == "stored" and cfg.candidates.unit_scoring == "maxp"   # the stored-vector funnel
    assert cfg.train_preranker.max_length is None and cfg.preranker.max_length is None   # the model's own length
    assert cfg.distill.unit_scoring == "maxp" and cfg.distill.towers == "query"
    assert cfg.distill_select and cfg.validation.lrs == (2e-5, 5e-5, 1e-4)   # chosen on the train split
    assert cfg.reader.fid.kind == "minilm-bert2bert" and cfg.reader.train.keep_checkpoints >= cfg.reader.train.epochs
    assert cfg.questions.datasets == ["nq-open-dev"] and cfg.parts[-1] == "report"
    one = load_config(ExperimentConfig, SHIPPED, ["distill.epochs=1"])   # what --set does
    assert one.distill.epochs == 1 and one.distill.score_scale == cfg.distill.score_scale and one.reader == cfg.reader
    raw = read_config_file(SHIPPED)
    partial = ExperimentConfig.model_validate(deep_merge(raw, parse_overrides(["reader.train.max_steps=3"])))
    assert partial.reader.train.max_steps == 3 and partial.reader.train.lr == cfg.reader.train.lr
    for bad, match in (({"train_vectors": "stored"}, "unit_scoring must be 'maxp'"),
                       ({"train_vectors": "cached"}, "train_vectors"),
                       ({"heldout_vectors": "stored"}, "heldout_vectors='stored'"),   # default pool: unit texts
                       ({"distill": {"towers": "document"}}, "towers"),
                       ({"distill_select": True}, "distill_select needs a validation"),
                       ({"parts": ["reader", "plots"]}, "parts")):
        with pytest.raises(ValueError, match=match):
            ExperimentConfig.model_validate(bad)


def test_the_cli_knows_the_command_and_prints_the_resolved_config(capsys):
    from funnelrag.cli import COMMAND_INDEX, main

    assert COMMAND_INDEX["experiment"] == "flows.experiment" and [c.name for c in COMMANDS] == ["experiment"]
    assert main(["experiment", "--config", str(SHIPPED), "--set", "n_distill=5", "--print-config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["n_distill"] == 5 and printed["reader"]["fid"]["kind"] == "minilm-bert2bert"


@pytest.fixture
def sample(workspace_home, data_mirror, tmp_path, prefect_harness):
    """60 NQ-open oracle gold passages published as corpus ``nq-gold``; their questions."""
    from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
    from funnelrag.datasets import resolve

    with gzip.open(resolve("nq-open-oracle", data_mirror), "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(60), fh)]
    corpus_src, questions = tmp_path / "gold_passages.jsonl", tmp_path / "questions.jsonl"
    corpus_src.write_text("".join(json.dumps({"title": r["ctxs"][0]["title"], "text": r["ctxs"][0]["text"]}) + "\n"
                                  for r in records))
    questions.write_text("".join(json.dumps({"question": r["question"], "answers": r["answers"]}) + "\n"
                                 for r in records))
    ws = {"home": str(workspace_home), "data_mirror": str(data_mirror)}
    corpus_build_flow(CorpusBuildConfig.model_validate({
        "name": "nq-gold", "source": {"datasets": [], "paths": [str(corpus_src)]}, "ingest": {"format": "jsonl"},
        "clustering": {"tokenizer": "whitespace"},
        "segment": {"tokenizer": "whitespace", "passage_words": 25, "unit_max_tokens": 60}, "workspace": ws}))
    return ExperimentConfig.model_validate({
        "workspace": ws, "corpus": "nq-gold", "questions": {"datasets": [], "paths": [str(questions)]},
        "parts": ["candidates"], "torch_threads": 1, "split": {"dev_fraction": 0.3, "seed": 0},
        "n_train": 4, "n_heldout": 3, "n_distill": 2,
        "candidates": {"n_clusters": 2, "n_units": 2, "batch_size": 16},
        "preranker": {"kind": "bi", "max_length": 64}})


def test_a_second_run_builds_nothing(sample):
    from flows.experiment import experiment_flow

    first = experiment_flow(sample)
    steps = ["questions", "candidates_dev", "candidates_train", "distill_data"]
    assert list(first["steps"]) == first["built"] == list(first["summaries"]) == steps
    assert first["summaries"]["candidates_train"]["questions"] == 4
    assert first["summaries"]["distill_data"]["questions"] == 2
    cache = Path(sample.workspace.home) / "cache" / "experiment"
    on_disk = sorted(str(p.relative_to(cache)) for p in cache.glob("*/*"))
    assert on_disk == sorted(f"{n}/{k}" for n, k in first["steps"].items())
    second = experiment_flow(sample)
    assert second["steps"] == first["steps"] and second["built"] == [] and second["summaries"] == first["summaries"]
