"""``funnelrag schedule``: a deployment's schedule turned on through the real Prefect API, with the
overrides kept as the schedule's parameters and checked against the flow's config first."""
from __future__ import annotations

from pathlib import Path

import pytest

from funnelrag.cli import main
from funnelrag.schedule import SLUG

ROOT = Path(__file__).resolve().parents[1]
NAME = "nightly-corpus-build-enwiki-box"


@pytest.fixture
def deployment(prefect_harness, tmp_path, monkeypatch):
    """The full-dump nightly deployed as prefect.yaml deploys it: its schedule off."""
    from prefect.client.orchestration import get_client  # noqa: PLC0415
    from prefect.client.schemas.actions import DeploymentScheduleCreate  # noqa: PLC0415
    from prefect.client.schemas.schedules import CronSchedule  # noqa: PLC0415

    monkeypatch.chdir(ROOT)   # a worker loads the entrypoint from the checkout
    params = {"config_file": "configs/corpus_full_enwiki.yaml", "home": str(tmp_path / "home"), "overrides": []}
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow_from_name("corpus-build-nightly")
        dep_id = client.create_deployment(
            flow_id=flow_id, name=NAME, entrypoint="flows/corpus_nightly.py:corpus_build_nightly", parameters=params,
            schedules=[DeploymentScheduleCreate(schedule=CronSchedule(cron="0 1 * * *", timezone="UTC"), active=True)])
    yield dep_id
    with get_client(sync_client=True) as client:
        client.delete_deployment(dep_id)


def _schedules(dep_id):
    from prefect.client.orchestration import get_client  # noqa: PLC0415

    with get_client(sync_client=True) as client:
        return client.read_deployment(dep_id).schedules


def test_a_schedule_keeps_its_overrides_and_is_the_only_one_on(deployment, capsys):
    mirror = "source.mirror=https://dumps.example.org"
    assert main(["schedule", NAME, "--cron", "30 3 * * *", "--set", mirror, "--set", "runner.workers=4"]) == 0
    ours = [s for s in _schedules(deployment) if s.slug == SLUG]
    assert len(ours) == 1 and ours[0].active and ours[0].schedule.cron == "30 3 * * *"
    assert ours[0].parameters["overrides"] == [mirror, "runner.workers=4"]
    assert ours[0].parameters["config_file"] == "configs/corpus_full_enwiki.yaml"
    assert [s.active for s in _schedules(deployment) if s.slug != SLUG] == [False]   # the shipped one paused
    assert "paused the deployment's other schedules: 0 1 * * *" in capsys.readouterr().out

    assert main(["schedule", f"corpus-build-nightly/{NAME}", "--cron", "0 4 * * *", "--set", mirror, "--off"]) == 0
    ours = [s for s in _schedules(deployment) if s.slug == SLUG]
    assert len(ours) == 1 and not ours[0].active and ours[0].schedule.cron == "0 4 * * *"   # updated, not added


def test_a_schedule_whose_overrides_do_not_resolve_is_refused(deployment, capsys):
    assert main(["schedule", NAME, "--cron", "0 1 * * *", "--set", "runner.workers=abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("funnelrag schedule: the schedule's parameters do not resolve") and "workers" in err
    assert [s.slug for s in _schedules(deployment)] == [None]   # nothing created
    assert main(["schedule", "no-such-deployment", "--cron", "0 1 * * *"]) == 2
    assert "no deployment 'no-such-deployment'" in capsys.readouterr().err
