"""The quality gate before ``current`` moves: a corpus built from a dump
that lost pages is published but does not become current, and the run fails with the figures."""
from __future__ import annotations

import json

import mlflow
import pytest

from flows.corpus_build import corpus_build_flow, enwiki_sample_config, summary_markdown
from funnelrag.workspace import Workspace
from infra.faults import corrupt_dump
from tasks.corpus.gate import GateConfig, GateRefused, VersionFigures, decide
from tasks.corpus.published import corpus_store

DUMP = "enwiki-sample/enwiki-20160501-pages-articles-shortened.xml.bz2"


def _figs(version="v", recall=0.5, pages=100, skipped=2, documents=90) -> VersionFigures:
    return VersionFigures(version=version, answer_recall=recall, pages=pages, skipped=skipped, documents=documents)


def test_first_version_passes_and_tolerances_bound_the_change():
    cfg = GateConfig(max_recall_drop=0.02, max_skipped_increase=0.05)
    assert decide(_figs(), None, cfg).passed
    current = _figs("old", recall=0.50, skipped=2)
    assert decide(_figs(recall=0.49, skipped=6), current, cfg).passed          # within both tolerances
    assert decide(_figs(recall=0.60, skipped=2), current, cfg).passed          # better is fine
    low = decide(_figs(recall=0.47), current, cfg)
    assert not low.passed and low.reasons == ["AR@20 dropped by 0.0300 (> 0.0200)"]
    lossy = decide(_figs(skipped=22), current, cfg)
    assert not lossy.passed and lossy.reasons == ["skipped fraction rose by 20.0% (> 5.0%)"]
    assert "current old" in lossy.describe() and "skipped 22/100 pages (22.0%)" in lossy.describe()
    with pytest.raises(ValueError, match="tolerances"):
        GateConfig(max_recall_drop=-0.1)


def test_gate_refuses_a_build_from_a_dump_with_20_percent_of_pages_corrupted(
        prefect_harness, workspace_home, data_mirror, tmp_path):
    ws_cfg = {"home": workspace_home, "data_mirror": data_mirror}
    gate = {"limit": 100}
    good = corpus_build_flow(enwiki_sample_config(workspace=ws_cfg, gate=gate))
    assert good["gate"]["passed"] and good["gate"]["current"] is None  # the first version
    store = corpus_store(Workspace(workspace_home), "enwiki-sample")
    assert store.current_version() == good["version"]
    published = [p for p in (store.versions_dir / good["version"]).rglob("*") if p.is_file()]
    assert len(published) > 10 and {oct(p.stat().st_mode & 0o777) for p in published} == {"0o644"}  # shared homes

    corrupt = tmp_path / "enwiki-corrupt-20.xml.bz2"
    corrupted, pages = corrupt_dump(data_mirror / DUMP, corrupt, 0.2)
    assert corrupted / pages == pytest.approx(0.2, abs=0.01)
    bad_cfg = enwiki_sample_config(workspace=ws_cfg, gate=gate, source={"datasets": [], "paths": [corrupt]})
    with pytest.raises(GateRefused, match=r"refused: .*skipped fraction rose by 1[89]\.\d%") as refused:
        corpus_build_flow(bad_cfg)
    decision = refused.value.decision
    # every corrupted page is skipped; a few of them were skipped already (redirects to nowhere, ...)
    assert 0.9 * corrupted <= decision.candidate.skipped - decision.current.skipped <= corrupted
    assert decision.current.version == good["version"]
    # published (kept for inspection) but not current
    assert store.current_version() == good["version"]
    assert decision.candidate.version in store.versions() and len(store.versions()) == 2

    # the failed run carries the figures in MLflow
    client = mlflow.tracking.MlflowClient(f"sqlite:///{workspace_home / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("corpus-build").experiment_id],
                              order_by=["attributes.start_time DESC"])
    assert runs[0].info.status == "FAILED" and runs[0].data.metrics["gate_passed"] == 0
    assert runs[0].data.metrics["gate_skipped_fraction"] == pytest.approx(decision.candidate.skipped_fraction)

    # an unchanged rebuild publishes nothing: the same version stays current, no gate runs
    again = corpus_build_flow(enwiki_sample_config(workspace=ws_cfg, gate=gate))
    assert again["unchanged"] and again["version"] == good["version"] and "gate" not in again
    assert store.current_version() == good["version"] and len(store.versions()) == 2
    md = summary_markdown(again)
    assert "**unchanged**" in md and "| ingest | cached | hit |" in md

    # a clean rebuild of other content (2% of pages damaged: within the skipped tolerance; the
    # recall tolerance opened so that only the comparison with current is under test) passes
    # the gate against current and moves current
    light = tmp_path / "enwiki-corrupt-2.xml.bz2"
    corrupt_dump(data_mirror / DUMP, light, 0.02)
    moved = corpus_build_flow(enwiki_sample_config(workspace=ws_cfg, gate={**gate, "max_recall_drop": 1.0},
                                                   source={"datasets": [], "paths": [light]}))
    assert moved["gate"]["passed"] and not moved["unchanged"] and store.current_version() == moved["version"]
    summary = json.loads((Workspace(workspace_home).run_dir("corpus-build", moved["mlflow_run_id"]) / "summary.json").read_text())
    assert summary["gate"]["current"]["version"] == good["version"]

    # Prefect <-> MLflow: the MLflow run names the Prefect flow run, the Prefect artifact names
    # the MLflow run, the store and S, and shows cache hits as cached (not the original seconds)
    tags = client.get_run(again["mlflow_run_id"]).data.tags
    assert again["prefect_flow_run_id"] and tags["prefect.flow_run_id"] == again["prefect_flow_run_id"]
    assert again["mlflow_run_id"] in md and again["store"] in md and "S (max cluster tokens): 4,096" in md
    assert "quality gate: passed" in summary_markdown(moved)
    assert again["stages"]["ingest"]["seconds"] == again["stages"]["ingest"]["wall_seconds"]
