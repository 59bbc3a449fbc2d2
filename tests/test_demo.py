"""``funnelrag demo`` through the console entry point, on the enwiki sample with the smallest
settings: every step (corpus build, distillation, evaluation, DR-RAG, R²AG) runs its real flow
under the session's Prefect API, in one workspace."""
from __future__ import annotations

import json

import pytest

from flows.demo import CONFIG_DIR, COMMANDS, LAZY_IMPORTS, STEPS, DemoConfig, demo_sizes, run_demo, step_command, step_modules
from funnelrag.cli import main

TINY = {
    "distillation": [
        "corpus=enwiki-sample", "n_train=6", "n_eval=3", "preranker.max_length=48",
        "candidates={n_clusters: 1, n_units: 3, batch_size: 32}",
        "reader.fid={d_model: 32, n_layers: 1, n_heads: 2, d_ff: 64, max_answer_tokens: 8}",
        "reader.train={max_steps: 2, batch_size: 4, lr: 0.001, cpu: true}", "reader.n_passages=3",
        "reader.max_passage_tokens=48", "attention_run.max_passage_tokens=48",
        "distill={epochs: 1, max_pairs_per_question: 2, score_scale: 20.0}",
        "distill_train={batch_size: 4, max_steps: 2, lr: 0.00005, cpu: true}"],
    "evaluate": [
        "corpus=enwiki-sample", "questions.limit=3", "flat.n_retrieve=6",
        "progressive=[{n_clusters: 2, n_units: 2}]", "attention_run.max_passage_tokens=48",
        "generator.settings.max_answer_tokens=3", "block_questions=3"],
    "dr-rag": [
        "data.max_questions=12", "data.split.dev_fraction=0.5", "classifier.max_length=64",
        "classifier.max_query_tokens=16", "train.max_steps=2", "train.batch_size=4", "train.trainable_layers=1",
        "sm.max_length=64", "eval.max_candidates=2"],
    "r2ag": [
        "data.max_questions=16", "data.test_fraction=0.3", "encoder.max_length=64", "train.epochs=2",
        "train.batch_size=8", "train.ablations=false", "model.n_layers=1"],
}


def test_every_step_names_a_shipped_config():
    assert all((CONFIG_DIR / config).is_file() for _, _, config in STEPS.values())


def test_demo_sizes_sit_between_the_shipped_config_and_the_users_overrides(workspace_home):
    sizes = demo_sizes()
    assert set(sizes) <= set(STEPS) and sizes["distillation"]["n_train"] == 16
    cfg = DemoConfig(workspace={"home": workspace_home}, overrides={"distillation": {"n_eval": 7}})
    dist = step_command(cfg, "distillation")[1]
    # the demo's sizes over configs/distillation_wikispeedia_cpu.yaml (40 / 30, 3 clusters), the user's over both
    assert (dist.n_train, dist.n_eval, dist.candidates.n_clusters, dist.distill.towers) == (16, 7, 1, "query")
    corpus = step_command(cfg, "corpus-wikispeedia")[1]
    assert (corpus.gate.limit, corpus.runner.docs_per_shard) == (50, 2300)     # 4,598 articles: two T5-count shards
    assert step_command(cfg, "evaluate")[1].generator.settings.max_answer_tokens == 10


def test_the_steps_modules_are_imported_while_the_api_starts():
    """The CLI imports each step's flow module and its heavy first-use imports beside the API's start."""
    assert COMMANDS[0].imports is step_modules
    modules = step_modules(DemoConfig())
    assert modules[0] == "flows.corpus_build" and "flows.funnel" in modules and modules[-1] == "flows.evaluate"
    assert len(modules) == len(set(modules)) and set(LAZY_IMPORTS["evaluate"]) <= set(modules)
    assert step_modules(DemoConfig(steps=["dr-rag"])) == ["flows.dr_rag"]


def test_demo_sizes_name_known_steps(tmp_path):
    bad = tmp_path / "demo.yaml"
    bad.write_text("distilation: {n_train: 3}\n")
    with pytest.raises(ValueError, match="distilation"):
        demo_sizes(bad)


def test_unknown_step_is_refused(workspace_home):
    with pytest.raises(ValueError, match="unknown step"):
        run_demo(DemoConfig(steps=["corpus-enwiki-sample"], overrides={"nonsense": {}},
                            workspace={"home": workspace_home}))


def test_demo_runs_every_step_on_the_enwiki_sample(prefect_harness, workspace_home, data_mirror, tmp_path):
    steps = ["corpus-enwiki-sample", "distillation", "evaluate", "dr-rag", "r2ag"]
    argv = ["demo", "--set", f"workspace.home={workspace_home}", "--set", f"workspace.data_mirror={data_mirror}",
            "--set", f"steps=[{', '.join(steps)}]", "--json", str(tmp_path / "demo.json")]
    for step, pairs in TINY.items():
        argv += [a for p in pairs for a in ("--set", f"overrides.{step}.{p}")]
    assert main(argv) == 0
    out = json.loads((tmp_path / "demo.json").read_text())
    assert set(out) == set(steps) and all(out[s]["step_seconds"] > 0 for s in steps)  # JSON keys are sorted

    corpus = out["corpus-enwiki-sample"]
    assert (corpus["corpus"], corpus["counts"]["documents"], corpus["counts"]["passages"]) == ("enwiki-sample", 98, 4568)
    distilled = out["distillation"]
    assert distilled["corpus_version"] == corpus["version"]
    assert [r["k"] for r in distilled["answer_recall"]] == [1, 2, 3, 4]
    assert all(0.0 <= r[w] <= 1.0 for r in distilled["answer_recall"] for w in ("before", "after"))
    evaluated = out["evaluate"]
    assert evaluated["corpus_version"] == corpus["version"] and evaluated["questions"] == 3
    assert any(r["setting"].startswith("prog-2c-2d-distilled") for r in evaluated["table"])  # the distilled champion
    assert [r["method"] for r in out["dr-rag"]["table5"]] == ["BM25", "SM", "QDC", "CIS", "CFS"]
    r2ag = {r["ranking"]: r for r in out["r2ag"]["ranking (test lists, MAP / recall@k)"]}
    assert {"retriever", "qdm full"} <= set(r2ag) and 0.0 < r2ag["qdm full"]["map"] <= 1.0
    assert out["r2ag"]["registered"]["name"] == "r2ag-r2former-hotpotqa"
