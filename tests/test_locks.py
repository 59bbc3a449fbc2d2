"""One corpus build per corpus and home; the MLflow database created once when runs race."""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from funnelrag.locks import LockHeld, exclusive_lock


def test_second_holder_is_refused_with_the_holder_named(tmp_path):
    lock = tmp_path / "store" / ".build.lock"
    with exclusive_lock(lock, "corpus build of 'x'"):
        assert f"pid {os.getpid()} on " in lock.read_text()
        with pytest.raises(LockHeld, match=rf"corpus build of 'x' is already running: held by pid {os.getpid()} on "
                                           rf".* \(lock file {lock}\)"):
            with exclusive_lock(lock, "corpus build of 'x'"):
                pass
    assert lock.read_text() == ""                    # released cleanly
    with exclusive_lock(lock, "again"):              # and free again
        pass


def test_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
    lock = tmp_path / ".build.lock"
    # a child takes the lock and is killed with it held (kill -9: no clean-up runs)
    code = ("import os, sys, time; from funnelrag.locks import exclusive_lock\n"
            f"with exclusive_lock(__import__('pathlib').Path({str(lock)!r}), 'build'):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert child.stdout.readline().strip() == "held"
    with pytest.raises(LockHeld, match=f"pid {child.pid}"):
        with exclusive_lock(lock, "build"):
            pass
    child.kill()
    child.wait()
    assert f"pid {child.pid}" in lock.read_text()      # the stale holder line is still there
    with caplog.at_level("WARNING", logger="funnelrag.locks"):
        with exclusive_lock(lock, "build"):
            assert f"pid {os.getpid()}" in lock.read_text()
    assert f"taking over the lock left by pid {child.pid}" in caplog.text


def _configure(home: str, q) -> None:
    try:
        from funnelrag.tracking import configure, ensure_experiment
        from funnelrag.workspace import Workspace

        ws = Workspace(home)
        configure(ws)
        q.put(ensure_experiment(ws, "race"))
    except BaseException as exc:  # noqa: BLE001  (reported to the parent)
        q.put(f"error: {exc!r}")


@pytest.mark.slow  # three processes race to create one MLflow SQLite store
def test_mlflow_database_created_once_when_runs_race(tmp_path):
    """Three processes configure tracking on a fresh home at once: all succeed (no alembic race)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_configure, args=(str(tmp_path / "home"), q)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert not [r for r in results if str(r).startswith("error")], results
    assert len(set(results)) == 1                    # one experiment, the same id everywhere


def test_a_run_stopped_while_mlflow_creates_its_tables_leaves_no_half_created_database(tmp_path, monkeypatch):
    """A run stopped (SIGTERM) after MLflow created some of its tables, and the leftover of one
    killed with -9: the next run creates the database whole and logs to it. A half-created database
    in place would fail every later run with ``table datasets already exists``."""
    import sqlite3

    import mlflow.tracking
    from funnelrag.tracking import SQLITE_CREATING, ensure_sqlite_database

    db = tmp_path / "mlflow.db"
    uri = f"sqlite:///{db}"
    real_client = mlflow.tracking.MlflowClient

    def stopped_midway(tracking_uri):
        path = tracking_uri[len("sqlite:///"):]
        with sqlite3.connect(path) as con:          # the first of MLflow's tables, then the signal
            con.execute("CREATE TABLE datasets (dataset_uuid VARCHAR(36))")
        raise KeyboardInterrupt

    monkeypatch.setattr(mlflow.tracking, "MlflowClient", stopped_midway)
    ensure_sqlite_database.cache_clear()
    with pytest.raises(KeyboardInterrupt):
        ensure_sqlite_database(uri)
    assert not db.exists()
    assert not list(tmp_path.glob("*" + SQLITE_CREATING + "*"))

    (tmp_path / f"mlflow.db{SQLITE_CREATING}999999").write_bytes(b"left by a kill -9")
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", real_client)
    ensure_sqlite_database.cache_clear()
    ensure_sqlite_database(uri)
    assert db.exists() and not list(tmp_path.glob("*" + SQLITE_CREATING + "*"))
    client = real_client(uri)
    assert client.get_experiment(client.create_experiment("after-the-stop")).name == "after-the-stop"
    ensure_sqlite_database.cache_clear()


def test_second_build_of_a_corpus_in_one_home_is_refused(prefect_harness, workspace_home, data_mirror):
    """While a build holds the corpus's lock, another build of it in the same home is refused at
    once, naming the holder, before any stage or MLflow run starts."""
    from flows.corpus_build import BUILD_LOCK, corpus_build_flow, enwiki_sample_config
    from tasks.corpus.published import corpus_store
    from funnelrag.workspace import Workspace

    cfg = enwiki_sample_config(workspace={"home": workspace_home, "data_mirror": data_mirror})
    lock = corpus_store(Workspace(workspace_home), "enwiki-sample").root / BUILD_LOCK
    with exclusive_lock(lock, "a running build"):
        with pytest.raises(LockHeld, match=rf"corpus build of 'enwiki-sample' in {workspace_home} is already "
                                           rf"running: held by pid {os.getpid()}"):
            corpus_build_flow(cfg)
    assert not (workspace_home / "mlflow.db").exists() and not (workspace_home / "cache").exists()
