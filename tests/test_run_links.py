"""What a person sees: Prefect artifacts link their MLflow run; distillation has its own artifact."""
from __future__ import annotations

import os
from types import SimpleNamespace

from flows.funnel import distillation_markdown
from funnelrag.tracking import run_link

RUN = SimpleNamespace(info=SimpleNamespace(run_id="abc123", experiment_id="7"))


def test_run_link_is_clickable_for_a_server_and_says_how_to_serve_sqlite():
    assert run_link(RUN, "http://127.0.0.1:5000/") == "[abc123](http://127.0.0.1:5000/#/experiments/7/runs/abc123)"
    local = run_link(RUN, "sqlite:////srv/funnelrag/mlflow.db")
    assert local.startswith("`abc123`") and "mlflow ui --backend-store-uri sqlite:////srv/funnelrag/mlflow.db" in local
    assert "#/experiments/7/runs/abc123" in local


def test_distillation_artifact_shows_recall_before_after_and_the_gate():
    md = distillation_markdown("wikispeedia", "v1", 40, [{"k": 4, "before": 0.25, "after": 0.3},
                                                         {"k": 8, "before": 0.5, "after": 0.45}],
                               {"name": "funnelrag-preranker", "version": "2", "reason": "worse", "promoted": False},
                               "[abc](http://x)")
    assert "| 4 | 0.250 | 0.300 | +0.050 |" in md and "| 8 | 0.500 | 0.450 | -0.050 |" in md
    assert "funnelrag-preranker v2 — worse" in md and "champion" not in md and "MLflow run: [abc](http://x)" in md


def test_an_mlflow_server_in_the_environment_is_where_flows_track_and_link(monkeypatch):
    """A deployment's worker (or a user's shell) with ``MLFLOW_TRACKING_URI`` set tracks on that server
    and its artifacts link to the run; without it, the home's SQLite store."""
    from funnelrag.config import WorkspaceConfig  # noqa: PLC0415

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    ws = WorkspaceConfig()
    assert ws.tracking_uri == "http://127.0.0.1:5000"
    assert run_link(RUN, ws.tracking_uri) == "[abc123](http://127.0.0.1:5000/#/experiments/7/runs/abc123)"
    assert WorkspaceConfig(tracking_uri="sqlite:///x.db").tracking_uri == "sqlite:///x.db"   # a setting wins
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert WorkspaceConfig().tracking_uri is None


def test_a_uri_this_process_gave_mlflow_is_not_taken_for_the_users(tmp_path, monkeypatch):
    """``mlflow.set_tracking_uri`` copies the URI into ``$MLFLOW_TRACKING_URI``: a later flow of the
    same process (another home) must still track in its own home's store, and a subprocess started
    afterwards (a Prefect worker, a launched trainer) must not inherit the first home's store as if
    the user had set it. A user's server in the environment stays there."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import mlflow  # noqa: PLC0415

    from funnelrag.config import WorkspaceConfig  # noqa: PLC0415
    from funnelrag.tracking import configure  # noqa: PLC0415
    from funnelrag.workspace import Workspace  # noqa: PLC0415

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_REGISTRY_URI", raising=False)
    first = configure(Workspace(tmp_path / "a"))
    assert first.startswith("sqlite:///") and first.endswith("a/mlflow.db")
    assert mlflow.get_tracking_uri() == first and mlflow.get_registry_uri() == first   # this process uses it
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ
    assert WorkspaceConfig().tracking_uri is None        # not taken for the user's server
    child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('MLFLOW_TRACKING_URI'))"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "None"

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")   # the user's server
    second = configure(Workspace(tmp_path / "b"), "sqlite:///" + str(tmp_path / "b" / "other.db"))
    assert mlflow.get_tracking_uri() == second
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5000"
    assert WorkspaceConfig().tracking_uri == "http://127.0.0.1:5000"
