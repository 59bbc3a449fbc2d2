"""prefect.yaml: every deployment's entrypoint loads, its parameters validate against the flow,
schedules are valid crons, and the nightly corpus build runs one at a time."""
from pathlib import Path

import pytest
import yaml
from cronsim import CronSim
from prefect.flows import load_flow_from_entrypoint

ROOT = Path(__file__).resolve().parents[1]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = SPEC["deployments"]


@pytest.mark.parametrize("dep", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_deployment_entrypoint_and_parameters(dep, monkeypatch):
    monkeypatch.chdir(ROOT)
    flow = load_flow_from_entrypoint(dep["entrypoint"])
    validated = flow.validate_parameters(dep.get("parameters", {}))
    assert set(validated) >= set(dep.get("parameters", {}))
    for schedule in dep.get("schedules", []):
        from datetime import datetime
        next(CronSim(schedule["cron"], datetime(2026, 1, 1)))  # raises on an invalid expression
    assert dep["work_pool"]["name"] == "funnelrag-process"


def test_nightly_corpus_build_is_scheduled_with_concurrency_one():
    dep = next(d for d in DEPLOYMENTS if d["name"] == "nightly-corpus-build")
    assert dep["concurrency_limit"] == 1
    assert dep["schedules"][0]["cron"] == "0 2 * * *" and dep["schedules"][0]["active"]
    assert dep["entrypoint"].endswith(":corpus_build_flow")
