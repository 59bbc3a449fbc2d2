"""MLflow tracking on the workspace's SQLite file (or a configured server): runs tagged with their
Prefect flow run, metrics, artifacts, and per-question results with their 95% intervals."""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator, Mapping

import psutil
import pyarrow as pa

from data_contracts.evaluation import QUESTION_SCORES
from funnelrag.config import flatten_params
from funnelrag.paired import mean_interval
from funnelrag.locks import exclusive_lock
from funnelrag.progress import heartbeat
from funnelrag.workspace import Workspace

log = logging.getLogger(__name__)


def configure(ws: Workspace, tracking_uri: str | None = None) -> str:
    """Point MLflow at ``tracking_uri`` or ``sqlite:///{home}/mlflow.db``; returns the URI.

    A SQLite database is created and migrated by one process at a time
    (:func:`ensure_sqlite_database`), so runs that start together on a fresh home do not race
    in MLflow's schema migration.
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when tracking)

    ws.home.mkdir(parents=True, exist_ok=True)
    uri = ws.tracking_uri(tracking_uri)
    if uri.startswith("sqlite:///"):
        ensure_sqlite_database(uri)
    with _environment_kept(_MLFLOW_URI_VARIABLES):
        mlflow.set_tracking_uri(uri)
        mlflow.set_registry_uri(uri)
    return uri


# mlflow.set_tracking_uri / set_registry_uri copy the URI into these for subprocesses to inherit; a
# home's store is this process's choice, not the environment's: a worker, a test or a script that
# starts a subprocess after a flow ran must pass on the user's setting (or none), never a home's.
_MLFLOW_URI_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")


@contextlib.contextmanager
def _environment_kept(names: tuple[str, ...]) -> Iterator[None]:
    """Restore the environment variables ``names`` to their values on entry (unset if they were)."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


SQLITE_CREATING = ".creating-"
"""Infix of the temporary file a new MLflow SQLite database is built in (``<db>.creating-<pid>``)."""


def resolve_run_context() -> dict[str, str]:
    """The tags MLflow's run-context providers give every run it starts (the user, the source and
    its git commit, whether this is a Databricks notebook or job, ...), resolved now and recorded
    nowhere. Resolving them the first time imports what the providers need (GitPython; IPython,
    where it is installed, to look for a notebook: 0.5-0.9 CPU s, beside other jobs), so a caller
    that resolves them ahead (:func:`funnelrag.cli.while_api_starts`) spares the first
    ``start_run`` that work.

    Returns
    -------
    dict
        ``{tag: value}``, e.g. ``mlflow.user``, ``mlflow.source.name``, ``mlflow.source.type``.
    """
    from mlflow.tracking.context.registry import resolve_tags  # noqa: PLC0415  (heavy: mlflow, only when tracking)

    return resolve_tags()


@functools.lru_cache(maxsize=None)
def ensure_sqlite_database(uri: str) -> None:
    """Create and migrate the MLflow SQLite database of ``uri`` under an inter-process lock
    (``<db>.lock`` beside it); other processes wait, then find it ready. Once per process and URI.

    A new database is built whole in ``<db>.creating-<pid>`` (MLflow creates its tables and runs
    its migrations there), then renamed into place: a run stopped while MLflow creates its tables
    (SIGTERM, kill -9, a full disk) leaves no database, never a half-created one, which every later
    run would fail on (``table ... already exists``). Leftover temporary files of such a run are
    removed by the next creator, under the same lock.

    Raises
    ------
    sqlalchemy.exc.SQLAlchemyError
        MLflow cannot create or read the database; a half-created temporary file is removed.
    """
    from mlflow.tracking import MlflowClient  # noqa: PLC0415  (heavy: mlflow, only when tracking)

    db = Path(uri[len("sqlite:///"):])
    with exclusive_lock(db.with_name(db.name + ".lock"), f"creating the MLflow database {db}", wait=True):
        if not db.exists():
            for stale in db.parent.glob(db.name + SQLITE_CREATING + "*"):
                stale.unlink(missing_ok=True)
            building = db.with_name(f"{db.name}{SQLITE_CREATING}{os.getpid()}")
            try:
                MlflowClient(f"sqlite:///{building}").search_experiments(max_results=1)  # creates the tables
                os.replace(building, db)
            finally:
                building.unlink(missing_ok=True)
        MlflowClient(uri).search_experiments(max_results=1)


def ensure_experiment(ws: Workspace, name: str) -> str:
    """Experiment id of ``name``, created with artifacts under ``home/mlruns`` if new."""
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    exp = mlflow.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    ws.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
    return mlflow.create_experiment(name, artifact_location=ws.mlflow_artifacts.as_uri() + f"/{name}")


@contextlib.contextmanager
def flow_run(ws: Workspace, experiment: str, run_name: str, config: Any,
             tracking_uri: str | None = None, tags: Mapping[str, str] | None = None) -> Iterator[Any]:
    """One MLflow run per flow run, with the config flattened into params.

    Yields the active ``mlflow.ActiveRun``; a failure inside marks the run FAILED, an interrupt
    (Ctrl-C, SIGTERM) KILLED. Inside a Prefect flow run the MLflow run is tagged with its id
    (:func:`prefect_run_tags`). The run is tagged with this process's pid, start time and host
    (:func:`process_tags`), so a run left RUNNING by a process killed with ``kill -9`` is marked
    KILLED by the next run of the same experiment on this host (:func:`end_stale_runs`).
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    fresh = tracking_uri is None and not ws.mlflow_db.exists()
    with heartbeat(f"MLflow: creating the tracking store {ws.mlflow_db}") if fresh else contextlib.nullcontext():
        configure(ws, tracking_uri)
        exp_id = ensure_experiment(ws, experiment)
    end_stale_runs(exp_id)
    tags = {**prefect_run_tags(), **process_tags(), **(tags or {})}
    with _sigterm_raises(), mlflow.start_run(experiment_id=exp_id, run_name=run_name, tags=tags) as run:
        try:
            params = flatten_params(config)
            # MLflow caps a param value at 6000 characters and a batch at 100 params.
            items = [(k, v[:6000]) for k, v in sorted(params.items())]
            for i in range(0, len(items), 100):
                mlflow.log_params(dict(items[i:i + 100]))
            yield run
        except BaseException as exc:
            if _is_interrupt(exc):
                log.warning("MLflow run %s (%s) interrupted (%s): ended KILLED", run.info.run_id, run_name,
                            type(exc).__name__)
                mlflow.end_run(status="KILLED")
            raise


class Terminated(BaseException):
    """SIGTERM received (raised by the handler :func:`flow_run` installs when none is set)."""


def _is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C, SIGTERM (ours or Prefect's ``ExternalSignal``)."""
    if isinstance(exc, (KeyboardInterrupt, Terminated)):
        return True
    from prefect.exceptions import ExternalSignal  # noqa: PLC0415  (heavy: prefect, only when a run ends with an exception)

    return isinstance(exc, ExternalSignal)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """In the main thread, with SIGTERM's default action (die at once), make SIGTERM raise
    :class:`Terminated` instead, so the run can end KILLED; restored afterwards. A handler set by
    someone else (Prefect's flow engine raises its own ``TerminationSignal``) is left alone."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def _raise(signum, _frame):
        raise Terminated(f"signal {signum} (SIGTERM)")

    signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def process_tags() -> dict[str, str]:
    """``funnelrag.pid``, ``funnelrag.pid_started`` (process start time, s) and ``funnelrag.host``."""
    return {"funnelrag.pid": str(os.getpid()), "funnelrag.pid_started": f"{psutil.Process().create_time():.2f}",
            "funnelrag.host": socket.gethostname()}


def _process_gone(tags: Mapping[str, str]) -> bool:
    """Whether the process recorded in ``tags`` (this host only) no longer runs: its pid is dead,
    or now belongs to a process started at another time."""
    if tags.get("funnelrag.host") != socket.gethostname() or not str(tags.get("funnelrag.pid", "")).isdigit():
        return False
    try:
        proc = psutil.Process(int(tags["funnelrag.pid"]))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
        started = tags.get("funnelrag.pid_started")
        return started is not None and abs(proc.create_time() - float(started)) > 1.0
    except psutil.NoSuchProcess:
        return True


def end_stale_runs(experiment_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs of ``experiment_id`` whose recorded process (this host) is
    gone, e.g. a CLI killed with ``kill -9``; returns their run ids."""
    from mlflow.tracking import MlflowClient  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    client = MlflowClient()
    ended = []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000):
        if _process_gone(run.data.tags):
            why = f"its process (pid {run.data.tags['funnelrag.pid']} on {run.data.tags['funnelrag.host']}) is dead"
            client.set_tag(run.info.run_id, "funnelrag.killed", why)
            client.set_terminated(run.info.run_id, status="KILLED")
            log.warning("MLflow run %s (%s) was left RUNNING but %s: marked KILLED", run.info.run_id,
                        run.data.tags.get("mlflow.runName", "?"), why)
            ended.append(run.info.run_id)
    return ended


def prefect_run_tags() -> dict[str, str]:
    """``{"prefect.flow_run_id": ..., "prefect.flow_run_name": ..., "prefect.deployment_id": ...}``
    of the Prefect flow run this code runs in (``{}`` outside one): the MLflow → Prefect link."""
    from prefect.runtime import deployment, flow_run  # noqa: PLC0415  (heavy: prefect, only inside a flow run)

    found = {"prefect.flow_run_id": flow_run.id, "prefect.flow_run_name": flow_run.name,
             "prefect.deployment_id": deployment.id}
    return {k: str(v) for k, v in found.items() if v}


def log_metrics(metrics: Mapping[str, float], step: int | None = None) -> None:
    """Log numeric metrics to the active run (non-numeric values are skipped)."""
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    if clean:
        mlflow.log_metrics(clean, step=step)


def log_artifact(path: Path, artifact_path: str | None = None) -> None:
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    mlflow.log_artifact(str(path), artifact_path=artifact_path)


def run_link(run: Any, tracking_uri: str | None = None) -> str:
    """Markdown naming an MLflow run, clickable when the tracking URI is an MLflow server.

    Parameters
    ----------
    run : an ``mlflow.ActiveRun`` / ``Run`` (``run.info.run_id``, ``run.info.experiment_id``).
    tracking_uri : the configured tracking URI (default: MLflow's current one).

    Returns
    -------
    str
        ``[<run id>](<server>/#/experiments/<id>/runs/<id>)`` for an ``http(s)`` URI; for a local
        SQLite store the run id and the ``mlflow ui`` command that serves it (its default address
        is http://127.0.0.1:5000).
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when tracking)

    uri = tracking_uri or mlflow.get_tracking_uri()
    run_id, exp_id = run.info.run_id, run.info.experiment_id
    if uri.startswith(("http://", "https://")):
        return f"[{run_id}]({uri.rstrip('/')}/#/experiments/{exp_id}/runs/{run_id})"
    return (f"`{run_id}` (serve it with `mlflow ui --backend-store-uri {uri}`, then "
            f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs/{run_id})")



QUESTION_SCORES_DIR = "per_question"   # the run artifact folder of :data:`QUESTION_SCORES`


def question_scores_table(scores: Mapping[str, Mapping[str, float]], questions: Mapping[str, str] | None = None,
                          prefix: str = "") -> pa.Table:
    """The :data:`data_contracts.evaluation.QUESTION_SCORES` table of ``{metric: {question id: value}}``
    (metric names get ``prefix``; ``questions``: question texts by id), sorted by metric and id."""
    rows = [(prefix + m, q, (questions or {}).get(q, ""), float(v))
            for m in sorted(scores) for q, v in sorted(scores[m].items())]
    return QUESTION_SCORES.validate(pa.table({"metric": [r[0] for r in rows], "question_id": [r[1] for r in rows],
                                              "question": [r[2] for r in rows], "value": [r[3] for r in rows]},
                                             schema=QUESTION_SCORES.schema))


def interval_metrics(table: pa.Table) -> dict[str, float]:
    """``<metric>.ci95_low``, ``<metric>.ci95_high`` and ``<metric>.n`` of every metric of a
    :data:`QUESTION_SCORES` table: the 95% percentile-bootstrap interval of its mean over the
    questions (:func:`funnelrag.paired.mean_interval`)."""
    values: dict[str, list[float]] = {}
    for m, v in zip(table["metric"].to_pylist(), table["value"].to_pylist()):
        values.setdefault(m, []).append(v)
    out: dict[str, float] = {}
    for m, vs in values.items():
        _, lo, hi = mean_interval(vs)
        out.update({f"{m}.ci95_low": lo, f"{m}.ci95_high": hi, f"{m}.n": float(len(vs))})
    return out


def log_question_scores(table: pa.Table, directory: Path) -> Path:
    """Write a :data:`QUESTION_SCORES` table into ``directory`` (atomic), log it to the active run
    as ``per_question/question_scores.parquet`` and its metrics' 95% intervals as metrics
    (:func:`interval_metrics`), so MLflow's compare view shows them; returns the file."""
    path = QUESTION_SCORES.write(table, directory)
    log_artifact(path, QUESTION_SCORES_DIR)
    log_metrics(interval_metrics(table))
    return path


def read_question_scores(run_id: str) -> pa.Table | None:
    """The :data:`QUESTION_SCORES` table a run logged (:func:`log_question_scores`), or None when it
    logged none.

    Raises
    ------
    data_contracts.base.ContractViolation
        The artifact is not a valid question-scores table.
    """
    from mlflow import MlflowClient  # noqa: PLC0415  (heavy: mlflow, only when a run is read)

    client = MlflowClient()
    if not any(f.path.endswith(QUESTION_SCORES.filename) for f in client.list_artifacts(run_id, QUESTION_SCORES_DIR)):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        local = client.download_artifacts(run_id, f"{QUESTION_SCORES_DIR}/{QUESTION_SCORES.filename}", tmp)
        return QUESTION_SCORES.read(Path(local))
