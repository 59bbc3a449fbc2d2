"""MLflow tracking on the workspace's SQLite file (or a configured server)."""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Iterator, Mapping

from funnelrag.config import flatten_params
from funnelrag.workspace import Workspace

log = logging.getLogger(__name__)


def configure(ws: Workspace, tracking_uri: str | None = None) -> str:
    """Point MLflow at ``tracking_uri`` or ``sqlite:///{home}/mlflow.db``; returns the URI."""
    import mlflow  # noqa: PLC0415

    ws.home.mkdir(parents=True, exist_ok=True)
    uri = ws.tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def ensure_experiment(ws: Workspace, name: str) -> str:
    """Experiment id of ``name``, created with artifacts under ``home/mlruns`` if new."""
    import mlflow  # noqa: PLC0415

    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    ws.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    return mlflow.create_experiment(name, artifact_location=ws.mlflow_artifacts.as_uri() + f"/{name}")


@contextlib.contextmanager
def flow_run(ws: Workspace, experiment: str, run_name: str, config: Any,
             tracking_uri: str | None = None, tags: Mapping[str, str] | None = None) -> Iterator[Any]:
    """One MLflow run per flow run, with the config flattened into params.

    Yields the active ``mlflow.ActiveRun``; a failure inside marks the run FAILED. Inside a
    Prefect flow run the MLflow run is tagged with its id (:func:`prefect_run_tags`).
    """
    import mlflow  # noqa: PLC0415

    from funnelrag.progress import heartbeat  # noqa: PLC0415

    fresh = tracking_uri is None and not ws.mlflow_db.exists()
    with heartbeat(f"MLflow: creating the tracking store {ws.mlflow_db}") if fresh else contextlib.nullcontext():
        configure(ws, tracking_uri)
        exp_id = ensure_experiment(ws, experiment)
    tags = {**prefect_run_tags(), **(tags or {})}
    with mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags) as run:
        params = flatten_params(config)
        # MLflow caps a param value at 6000 characters and a batch at 100 params.
        items = [(k, v[:6000]) for k, v in sorted(params.items())]
        for i in range(0, len(items), 100):
            mlflow.log_params(dict(items[i:i + 100]))
        yield run


def prefect_run_tags() -> dict[str, str]:
    """``{"prefect.flow_run_id": ..., "prefect.flow_run_name": ..., "prefect.deployment_id": ...}``
    of the Prefect flow run this code runs in (``{}`` outside one): the MLflow → Prefect link."""
    from prefect.runtime import deployment, flow_run  # noqa: PLC0415

    found = {"prefect.flow_run_id": flow_run.id, "prefect.flow_run_name": flow_run.name,
             "prefect.deployment_id": deployment.id}
    return {k: str(v) for k, v in found.items() if v}


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log numeric metrics to the active run (non-numeric values are skipped)."""
    import mlflow  # noqa: PLC0415

    clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if clean:
        mlflow.log_metrics(clean, step=step)


def log_artifact(path: Path, artifact_path: str | None = None) -> None:
    import mlflow  # noqa: PLC0415

    mlflow.log_artifact(str(path), artifact_path=artifact_path)
