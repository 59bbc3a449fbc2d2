"""DR-RAG flows on a small real HotpotQA sample under the Prefect test harness: train, register,
evaluate (Table 5), then evaluate again from the MLflow registry with every stage cached."""
from __future__ import annotations

import pytest

from data_contracts import dr_rag as C
from flows.dr_rag import COMMANDS, DRRAGConfig, dr_rag_flow, evaluate_dr_rag_flow
from funnelrag.config import load_config

OVERRIDES = [
    "data.max_questions=12", "data.split.dev_fraction=0.5",
    "classifier.max_length=64", "classifier.max_query_tokens=16",
    "train.max_steps=2", "train.batch_size=4", "train.trainable_layers=1", "train.warmup_steps=0",
    "sm.max_length=64", "eval.max_candidates=2",
]


@pytest.fixture
def config(workspace_home, data_mirror) -> DRRAGConfig:
    return load_config(DRRAGConfig, None, [*OVERRIDES, f"workspace.home={workspace_home}",
                                           f"workspace.data_mirror={data_mirror}"])


def test_commands_are_exported():
    assert {c.name for c in COMMANDS} == {"dr-rag", "dr-rag-train", "dr-rag-evaluate"}
    assert all(c.config_model is DRRAGConfig for c in COMMANDS)


def test_train_register_and_evaluate(prefect_harness, config):
    import mlflow
    from mlflow import MlflowClient

    summary = dr_rag_flow(config)
    assert summary["train"]["steps"] == 2 and summary["train"]["train_pairs"] > 0
    assert summary["registry"]["version"] == "1" and summary["registry"]["promoted"]
    wide = {row["method"]: row for row in summary["table5"]}
    assert list(wide) == ["BM25", "SM", "QDC", "CIS", "CFS"]
    for row in wide.values():
        for k in (3, 4, 6):
            assert 0.0 <= row[f"R@{k}"] <= 1.0 and 1.0 <= row[f"docs@{k}"] <= k
    for name in ("BM25", "SM", "QDC"):
        assert wide[name]["docs@6"] == 6.0  # the flat retrievers and QDC always fill the budget
    run = mlflow.get_run(summary["mlflow_run_id"])
    assert run.data.metrics["recall_qdc_k6"] == pytest.approx(wide["QDC"]["R@6"], abs=1e-4)
    out = config.workspace.home / "runs" / "dr-rag-evaluate" / summary["mlflow_run_id"]
    table = C.TABLE5.read(out)
    assert table.num_rows == 15
    sel = C.SELECTIONS.read(out)
    assert set(sel.column("method").to_pylist()) == {"bm25", "sm", "qdc", "cis", "cfs"}

    # Second evaluation: the registry's champion, every stage from the cache, the same table.
    again = evaluate_dr_rag_flow(config)
    assert again["cache_hits"] == {"collection": True, "embeddings": True, "rankings": True}
    assert again["table5"] == summary["table5"]
    mv = MlflowClient().get_model_version_by_alias(config.registry_name, "champion")
    assert str(mv.version) == "1"

    # A file of one's own, evaluated with the registered champion: every question evaluated (the
    # champion was not trained on it), although the config's split would hold half of them for dev.
    import dataclasses  # noqa: PLC0415
    own = config.workspace.home / "my_questions.jsonl"
    lines = (config.workspace.data_mirror / "hotpotqa" / "hotpotqa_dev_subsampled.jsonl").read_text().splitlines()
    own.write_text("\n".join(lines[20:27]) + "\n")
    mine = evaluate_dr_rag_flow(config.model_copy(update={"data": dataclasses.replace(config.data, path=str(own))}))
    assert mine["dev_questions"] == 7 and len(mine["table5"]) == 5


def test_a_split_without_dev_questions_is_refused_naming_the_file(tmp_path, data_mirror):
    from tasks.dr_rag.hotpotqa import SplitConfig  # noqa: PLC0415
    from tasks.dr_rag.stages import HotpotQADataConfig, run_collection  # noqa: PLC0415

    path = data_mirror / "hotpotqa" / "hotpotqa_dev_subsampled.jsonl"
    whole = run_collection(path, HotpotQADataConfig(max_questions=5, split=SplitConfig(dev_fraction=1.0)), tmp_path / "a")
    assert whole["dev_questions"] == 5 and whole["train_questions"] == 0   # evaluation only: allowed
    with pytest.raises(ValueError, match="hotpotqa_dev_subsampled.jsonl.*leaves no dev question"):
        run_collection(path, HotpotQADataConfig(max_questions=5, split=SplitConfig(dev_fraction=0.0)), tmp_path / "b")
