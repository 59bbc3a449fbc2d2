"""The R²AG flows on a small real HotpotQA sample under the Prefect test harness: features with
the real MiniLM weights, QDM training through the shared loop, ablations, joint Eq. 9 training
with a from-scratch generator, MLflow registration, and evaluation with <R> prompts."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from data_contracts import r2ag as R
from funnelrag.config import load_config


def _overrides(home, mirror) -> list[str]:
    return [f"workspace.home={home}", f"workspace.data_mirror={mirror}", "data.max_questions=16",
            "data.test_fraction=0.3", "encoder.max_length=64"]


@pytest.fixture(scope="module")
def trained(prefect_harness, data_mirror, tmp_path_factory):
    from flows.r2ag import TrainR2FormerConfig, train_r2former_flow

    home = tmp_path_factory.mktemp("r2ag-home")
    cfg = load_config(TrainR2FormerConfig, None, _overrides(home, data_mirror) + [
        "train.epochs=2", "train.batch_size=8", "model.n_layers=1",
        "joint.enabled=true", "joint.max_steps=2", "joint.max_lists=4", "joint.batch_size=2",
        "joint.prompt.max_length=256", "joint.generator.hidden_size=32", "joint.generator.n_layers=1",
        "joint.generator.n_heads=2", "joint.generator.intermediate_size=64"])
    return home, cfg, train_r2former_flow(cfg)


def test_train_r2former_compares_every_variant_with_the_retriever(trained):
    _, cfg, summary = trained
    assert summary["train_lists"] + summary["test_lists"] == 16 and summary["test_lists"] > 0
    rows = {r["ranking"]: r for r in summary["ranking (test lists, MAP / recall@k)"]}
    assert set(rows) == {"retriever", "relevance r_i", "qdm full", "qdm without_relevance",
                         "qdm without_precedent", "qdm without_neighbor", "qdm full after joint"}
    for r in rows.values():
        assert 0.0 < r["map"] <= 1.0 and r["recall@1"] <= r["recall@2"] <= r["recall@5"] <= 1.0
    # on HotpotQA the retriever is the bi-encoder, so its order is the r_i order
    assert rows["retriever"]["map"] == rows["relevance r_i"]["map"]
    assert summary["registered"] == {"name": "r2ag-r2former-hotpotqa", "version": "1", "promoted": True,
                                     "gate": "no_champion"}
    assert summary["joint"]["steps"] == 2 and math.isfinite(summary["joint"]["last_loss"])


def test_train_r2former_writes_contract_checked_artifacts(trained):
    from models.r2ag_generator import has_generator
    from models.r2former import load_r2former

    _, _, summary = trained
    run_dir = Path(summary["run_dir"])
    metrics = R.RANKING_METRICS.read(run_dir)
    scores = R.QDM_SCORES.read(run_dir)
    assert set(scores["variant"].to_pylist()) == {"full", "without_relevance", "without_precedent",
                                                  "without_neighbor", "full after joint"}
    assert metrics.num_rows == 7 * 5  # 7 rankings x (map + 4 recalls)
    model, feats = load_r2former(summary["model_dir"])
    assert feats == ("relevance", "precedent_similarity", "neighbor_similarity")
    assert has_generator(summary["model_dir"])
    ablated, feats2 = load_r2former(run_dir / "variants" / "without_neighbor")
    assert ablated.cfg.n_features == 2 and "neighbor_similarity" not in feats2


def test_mlflow_run_has_ranking_metrics_and_registered_model(trained):
    import mlflow

    home, _, summary = trained
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    run = client.get_run(summary["mlflow_run_id"])
    assert "test/qdm_full/map" in run.data.metrics and "test/retriever/recall_at_1" in run.data.metrics
    assert any(k.startswith("full/train/loss") for k in run.data.metrics)
    versions = client.search_model_versions("name='r2ag-r2former-hotpotqa'")
    assert [v.run_id for v in versions] == [summary["mlflow_run_id"]]
    assert float(versions[0].tags["metric.qdm_full/map"]) == pytest.approx(
        {r["ranking"]: r for r in summary["ranking (test lists, MAP / recall@k)"]}["qdm full"]["map"])
    assert versions[0].tags["data_version"] == summary["lists"]["data_version"]


def test_evaluate_r2ag_scores_held_out_lists_and_generates(trained, data_mirror):
    from flows.r2ag import EvaluateR2AGConfig, evaluate_r2ag_flow

    home, _, train_summary = trained
    assert (Path(train_summary["run_dir"]).parent / "LATEST-hotpotqa").read_text().strip() == train_summary["model_dir"]
    cfg = load_config(EvaluateR2AGConfig, None, _overrides(home, data_mirror) + [
        "model_uri=models:/r2ag-r2former-hotpotqa@champion",
        "prompt.max_length=256", "generation.max_lists=2", "generation.max_new_tokens=2"])
    summary = evaluate_r2ag_flow(cfg)
    assert Path(summary["model_dir"]).is_relative_to(home)  # downloaded from the registry
    assert summary["lists"]["cache_hit"] is True  # same features stage as training
    rows = {r["ranking"]: r for r in summary["ranking (test lists, MAP / recall@k)"]}
    train_rows = {r["ranking"]: r for r in train_summary["ranking (test lists, MAP / recall@k)"]}
    assert rows["retriever"] == train_rows["retriever"]  # the same held-out lists
    assert rows["qdm full"]["map"] == pytest.approx(train_rows["qdm full after joint"]["map"])
    gen = summary["generation"]
    assert gen["prompts"] == 2 and gen["n"] == 2 and 0.0 <= gen["accuracy"] <= 1.0
