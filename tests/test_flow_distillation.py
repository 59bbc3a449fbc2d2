"""The distillation flows end to end on a small real sample under the Prefect harness.

Corpus: the real Wikipedia gold passages of the first NQ-open oracle records, built and
published by the ``corpus-build`` flow (JSON-lines ingest, whitespace tokens). Questions: the
same oracle records (train / dev split by hash). Reader: a tiny scratch FiD; pre-ranker: MiniLM.
"""
from __future__ import annotations

import dataclasses
import gzip
import json

import mlflow
import pytest

from data_contracts.funnel import ANSWER_RECALL, ATTENTION_SCORES, CANDIDATES, LABELS, READER_PREDICTIONS
from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
from flows.funnel import COMMANDS, DistillationConfig, distillation_run_flow, score_passages_flow, train_reader_flow
from funnelrag.datasets import resolve
from funnelrag.registry import champion_version, download_model, find_model_dir, model_uri
from funnelrag.tracking import configure
from funnelrag.workspace import Workspace
from tasks.corpus.published import open_corpus
from tasks.funnel.reader import READER_CONFIG

N_RECORDS = 60


@pytest.fixture
def sample(workspace_home, data_mirror, tmp_path, prefect_harness):
    oracle = resolve("nq-open-oracle", data_mirror)
    with gzip.open(oracle, "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(N_RECORDS), fh)]
    corpus_src = tmp_path / "gold_passages.jsonl"
    corpus_src.write_text("".join(json.dumps({"title": r["ctxs"][0]["title"], "text": r["ctxs"][0]["text"]}) + "\n"
                                  for r in records))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": r["question"], "answers": r["answers"]}) + "\n" for r in records))
    ws = {"home": str(workspace_home), "data_mirror": str(data_mirror)}
    corpus_build_flow(CorpusBuildConfig.model_validate({
        "name": "nq-gold", "source": {"datasets": [], "paths": [str(corpus_src)]}, "ingest": {"format": "jsonl"},
        "clustering": {"tokenizer": "whitespace"},
        "segment": {"tokenizer": "whitespace", "passage_words": 25, "unit_max_tokens": 60}, "workspace": ws}))
    cfg = DistillationConfig.model_validate({
        "workspace": ws, "corpus": "nq-gold", "questions": {"datasets": [], "paths": [str(questions)]},
        "split": {"dev_fraction": 0.3, "seed": 0}, "n_train": None, "n_eval": None,
        "candidates": {"n_clusters": 3, "n_units": 3, "batch_size": 32},
        "preranker": {"kind": "bi", "max_length": 64},
        "reader": {"fid": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64},
                   "train": {"max_steps": 2, "batch_size": 4, "lr": 1e-3, "cpu": True},
                   "n_passages": 4, "max_passage_tokens": 64},
        "attention_run": {"max_passage_tokens": 64, "batch_size": 2},
        "distill": {"epochs": 1, "max_pairs_per_question": 2, "score_scale": 20.0},
        "distill_train": {"batch_size": 8, "max_steps": 2, "lr": 5e-5, "cpu": True},
        "registry_name": "test-preranker", "reader_registry_name": "test-reader"})
    return cfg, Workspace(workspace_home)


def test_distillation_run_end_to_end_then_cached(sample, tmp_path):
    cfg, ws = sample
    out = distillation_run_flow(cfg)
    corpus = open_corpus(ws, "nq-gold")
    assert out["corpus_version"] == corpus.version and out["data_version"] == corpus.digest

    # answer recall of the pre-ranking stage, before and after, at 1..4 and N=3
    recall = out["answer_recall"]
    assert [r["k"] for r in recall] == [1, 2, 3, 4]
    for key in ("before", "after"):
        values = [r[key] for r in recall]
        assert all(0.0 <= v <= 1.0 for v in values) and values == sorted(values)
    assert recall[-1]["before"] > 0.3  # the gold passages are in the corpus

    # artifacts: attention scores for every candidate passage; labels per candidate unit
    scored = out["score_passages"]
    assert scored["attention"]["attention"] == "post_softmax" and scored["attention"]["passages"] > 0
    assert scored["labels"]["positives"] >= 1 and scored["labels"]["documents"] > scored["labels"]["positives"]
    train_pool = out["train_reader"]["candidates_train"]
    assert scored["attention"]["passages"] == train_pool["candidate_passages"]
    distill = out["distill_preranker"]["distill"]
    assert distill["steps"] == 2 and distill["used"] >= 1

    # registry: the first distilled pre-ranker is the champion, tagged with the data version
    assert out["gate"]["registered"] and out["gate"]["promoted"] and out["gate"]["reason"] == "no_champion"
    configure(ws)
    champ = champion_version("test-preranker")
    assert champ is not None and champ.tags["data_version"] == corpus.digest

    # the FiD reader: dev exact match measured on the dev candidates, registered and gated on it
    reader_eval = out["train_reader"]["reader_eval"]
    preds = READER_PREDICTIONS.read(_stage_dirs(ws, "reader_eval")[0])
    assert reader_eval["questions"] == preds.num_rows == out["distill_preranker"]["evaluate"]["questions"]
    assert reader_eval["em"] == sum(preds["exact_match"].to_pylist()) / preds.num_rows
    assert set(preds["n_passages"].to_pylist()) <= {1, 2, 3, 4}
    assert out["reader_gate"]["registered"] and out["reader_gate"]["promoted"]
    reader_champ = champion_version("test-reader")
    assert reader_champ.tags["data_version"] == corpus.digest
    assert float(reader_champ.tags["metric.dev_reader_em"]) == reader_eval["em"]
    reader_dir = download_model(model_uri("test-reader"), tmp_path / "reader-download")
    assert (find_model_dir(reader_dir, READER_CONFIG) / READER_CONFIG).exists()

    # one MLflow run per flow run: the parent and its three nested sub-flow runs
    client = mlflow.tracking.MlflowClient(f"sqlite:///{ws.mlflow_db}")
    parent = client.get_run(out["mlflow_run_id"])
    exp = parent.info.experiment_id
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert sorted(r.info.run_name for r in children) == ["distill-preranker", "score-passages", "train-reader"]
    assert parent.data.params["candidates.n_clusters"] == "3"
    distill_run = next(r for r in children if r.info.run_name == "distill-preranker")
    assert "evaluate.after_ar_at_3" in distill_run.data.metrics and "gate.promoted" in distill_run.data.metrics
    # every MLflow run carries its Prefect flow run; the parent has the summary figures; each
    # training step's loss and learning rate are logged (a 2-step run: 2 points, not 1)
    assert all(r.data.tags.get("prefect.flow_run_id") for r in (parent, *children))
    assert len({r.data.tags["prefect.flow_run_id"] for r in (parent, *children)}) == 4
    pm = parent.data.metrics
    assert pm["evaluate.after_ar_at_3"] == out["answer_recall"][2]["after"] and "reader_eval.em" in pm
    assert pm["gate.promoted"] == 1.0 and pm["distill.steps"] == 2
    for name in ("distill/loss", "distill/lr"):
        assert [h.step for h in client.get_metric_history(distill_run.info.run_id, name)] == [1, 2], name
    # per-question dev results as an artifact, their 95% intervals as metrics
    from funnelrag.tracking import read_question_scores

    scores = read_question_scores(distill_run.info.run_id).to_pylist()
    n_dev = int(distill_run.data.metrics["evaluate.questions"])
    after3 = [r["value"] for r in scores if r["metric"] == "evaluate.after_ar_at_3"]
    assert len(after3) == n_dev and sum(after3) / n_dev == pytest.approx(out["answer_recall"][2]["after"])
    m = distill_run.data.metrics
    assert m["evaluate.after_ar_at_3.ci95_low"] <= m["evaluate.after_ar_at_3"] <= m["evaluate.after_ar_at_3.ci95_high"]
    assert m["evaluate.after_ar_at_3.n"] == n_dev

    # one Prefect artifact per sub-flow, naming its MLflow run, with its figures
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect_client:
        artifacts = {a.key: str(a.data) for a in prefect_client.read_artifacts()}
    for child in children:
        assert child.info.run_id in artifacts[f"{child.info.run_name}-nq-gold"], child.info.run_name
    assert f"| reader_eval.em | {reader_eval['em']:.4g} |" in artifacts["train-reader-nq-gold"]
    assert "| labels.positives |" in artifacts["score-passages-nq-gold"]
    whole = artifacts["distillation-run-nq-gold"]   # the parent run's artifact: every step's run, the gates
    assert parent.info.run_id in whole and all(f"| {c.info.run_name} | `{c.info.run_id}`" in whole for c in children)
    assert f"dev exact match {reader_eval['em']:.3f}" in whole
    assert f"| {recall[0]['k']} | {recall[0]['before']:.3f} | {recall[0]['after']:.3f} |" in whole

    # a re-run reuses every stage and does not register the same model twice
    again = distillation_run_flow(cfg)
    assert again["answer_recall"] == recall
    assert all(v["cache_hit"] for k, v in again["train_reader"].items() if isinstance(v, dict) and k != "reader_gate")
    assert again["reader_gate"]["reason"] == "already_registered"
    assert again["gate"] == {"registered": False, "version": out["gate"]["version"], "reason": "already_registered",
                             "aliases": ["challenger", "champion"]}
    # a different reader (one more step) is a new version gated against the champion re-measured now
    cfg3 = cfg.model_copy(update={"reader": cfg.reader.model_copy(
        update={"train": dataclasses.replace(cfg.reader.train, max_steps=3)})})
    third = train_reader_flow(cfg3)
    gate = third["reader_gate"]
    assert gate["registered"] and gate["champion_version"] == out["reader_gate"]["version"]
    assert gate["champion_value"] == reader_eval["em"]  # the champion's dev EM, measured again on the same pool
    # promoted only on a paired gain whose lower 95% bound is above 0 (a tie never), with n and the interval
    assert gate["n"] == reader_eval["questions"] and gate["gain_low"] <= gate["gain"] <= gate["gain_high"]
    assert gate["promoted"] == (gate["gain_low"] > 0) and gate["reason"] in ("better", "no_measurable_gain", "worse")
    assert f"n={gate['n']:,}" in gate["description"]
    alone = score_passages_flow(cfg)
    assert alone["attention"]["cache_hit"] and alone["labels"]["cache_hit"]
    _check_stage_artifacts(ws)


def _stage_dirs(ws, stage):
    return [p.parent for p in (ws.cache_dir / "distillation" / stage).glob("*/COMPLETE")]


def _check_stage_artifacts(ws):
    """Every stage output satisfies its contract and the tables agree with each other."""
    (att_dir,), (labels_dir,), (eval_dir,) = _stage_dirs(ws, "attention"), _stage_dirs(ws, "labels"), _stage_dirs(ws, "eval")
    att, labels = ATTENTION_SCORES.read(att_dir), LABELS.read(labels_dir)
    cands = {d: CANDIDATES.read(d) for d in _stage_dirs(ws, "candidates")}
    train = next(c for c in cands.values() if c.num_rows == att.num_rows)
    assert set(att["passage_id"].to_pylist()) == set(train["passage_id"].to_pylist())
    pairs = set(zip(train["question_id"].to_pylist(), train["unit_id"].to_pylist()))
    assert set(zip(labels["question_id"].to_pylist(), labels["unit_id"].to_pylist())) == pairs
    recall = ANSWER_RECALL.read(eval_dir)
    assert set(recall["model"].to_pylist()) == {"before", "after"}


def test_commands_registered_for_the_cli():
    names = {c.name for c in COMMANDS}
    assert {"distill", "train-reader", "score-passages", "distill-preranker"} <= names
    cfg = DistillationConfig.model_validate({"distill_train": {"lr": 1e-4}, "reader": {"train": {"max_steps": 3}}})
    assert cfg.distill_train.lr == 1e-4 and cfg.distill_train.output_dir == ""
    assert cfg.reader.train.max_steps == 3 and cfg.recall_ks == [1, 2, 3, 4, 8]
    assert ANSWER_RECALL.name == "answer_recall"
