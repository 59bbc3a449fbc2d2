"""A real Prefect server, as the README's *Deploying* section runs it: infra/server/prefect-server.sh
starts it, ``prefect deploy`` registers prefect.yaml's deployments, the scheduler creates the
nightly cron runs, a process worker runs a triggered enwiki-sample build to completion, and the
evaluate-champion automation is started with that build's home and corpus version. The nightly
deployment run by a process worker is stopped with SIGTERM and with kill -9 and leaves nothing behind.

Nothing here is mocked; it takes a few minutes (marked ``slow``, runs in CI)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import httpx
import psutil
import pytest

from benchmarks.synth_dump import SAMPLE, write_mirror
from tasks.sources.dump_source import MIRROR_PASSWORD_ENV, MIRROR_USER_ENV
from tests.interrupted_run import RUNNER, WIKI, ForeignProcess, Run, interrupt, scratch_bytes
from tests.mirror_server import serve
from tests.test_mirror_credentials import PASSWORD, USER, _files_holding_the_password

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "infra" / "server" / "prefect-server.sh"
POOL = "funnelrag-process"
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(prefect_home: Path, port: int, **extra: str) -> dict[str, str]:
    # hermetic: no Prefect setting and no MLflow store of the shell that runs the tests
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("PREFECT_") and k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    env.update(PREFECT_HOME=str(prefect_home), PREFECT_SERVER_API_PORT=str(port), PREFECT_SERVER_WAIT="120",
               PREFECT_API_URL=f"http://127.0.0.1:{port}/api", PREFECT_LOGGING_LEVEL="WARNING",
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="5", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false", **extra)
    return env


def _stop(proc: subprocess.Popen) -> None:
    """Stop the script's process group (the server it left running in the background)."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)


def test_server_script_fails_loudly_when_the_server_cannot_start(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.Popen(["bash", str(SCRIPT), POOL], env=_env(tmp_path / "prefect", port),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=150)
        finally:
            _stop(proc)
    assert proc.returncode != 0
    assert "prefect-server.sh: the Prefect server exited during start-up" in err
    assert "already in use" in err  # the end of the server log says why
    assert "Traceback" not in err and "export PREFECT_API_URL" not in out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """prefect-server.sh on a free port with a throwaway PREFECT_HOME; yields (api_url, env, home)."""
    base = tmp_path_factory.mktemp("deploy")
    port = _free_port()
    home = base / "funnelrag-home"
    home.mkdir()
    env = _env(base / "prefect", port, FUNNELRAG_REPO=str(ROOT), FUNNELRAG_HOME=str(home))
    proc = subprocess.Popen(["bash", str(SCRIPT), POOL], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=200)
        assert proc.returncode == 0, f"prefect-server.sh failed:\n{out}\n{err}"
        api = f"http://127.0.0.1:{port}/api"
        assert f"export PREFECT_API_URL={api}" in out
        profiles = base / "prefect" / "profiles.toml"  # no `prefect config set` into a profile
        assert not profiles.exists() or "PREFECT_API_URL" not in profiles.read_text()
        yield api, env, home
    finally:
        _stop(proc)


def _post(api: str, path: str, body: dict | None = None) -> object:
    for attempt in range(5):   # a loaded 2-core box: the API answers 503 while it is busy
        r = httpx.post(f"{api}{path}", json=body or {}, timeout=30)
        if r.status_code != 503:
            break
        time.sleep(2 * (attempt + 1))
    r.raise_for_status()
    return r.json()


def _deployment(api: str, name: str) -> dict:
    found = _post(api, "/deployments/filter", {"deployments": {"name": {"any_": [name]}}})
    assert len(found) == 1, f"deployment {name} not registered"
    return found[0]


def _runs(api: str, deployment_id: str, states: list[str] | None = None) -> list[dict]:
    body: dict = {"flow_runs": {"deployment_id": {"any_": [deployment_id]}}}
    if states:
        body["flow_runs"]["state"] = {"type": {"any_": states}}
    return _post(api, "/flow_runs/filter", body)


def _wait(what: str, fn, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def test_deploy_schedule_worker_and_automation(server):
    api, env, home = server
    deployed = subprocess.run(
        ["prefect", "--no-prompt", "deploy", "--name", "nightly-corpus-build", "--name", "nightly-corpus-build-enwiki",
         "--name", "evaluate-champion", "--name", "embed-champion"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    # home templated from $FUNNELRAG_HOME at deploy time; the enwiki build takes its config file
    nightly = _deployment(api, "nightly-corpus-build")
    enwiki = _deployment(api, "nightly-corpus-build-enwiki")
    evaluate = _deployment(api, "evaluate-champion")
    assert nightly["parameters"]["home"] == enwiki["parameters"]["home"] == evaluate["parameters"]["home"] == str(home)
    assert enwiki["parameters"]["config_file"] == "configs/corpus_enwiki_sample.yaml"

    # the active cron schedule produces scheduled runs at 02:00 UTC (SQLAlchemy 2.1 made it 0)
    schedule = nightly["schedules"][0]
    assert schedule["active"] and schedule["schedule"]["cron"] == "0 2 * * *"
    scheduled = _wait("scheduled runs of nightly-corpus-build", lambda: _runs(api, nightly["id"], ["SCHEDULED"]), 120)
    starts = sorted(datetime.fromisoformat(r["expected_start_time"]).astimezone(timezone.utc) for r in scheduled)
    assert len(starts) >= 3 and all((t.hour, t.minute) == (2, 0) for t in starts)
    assert starts[0] > datetime.now(timezone.utc)
    assert not _runs(api, enwiki["id"])  # its schedule is inactive

    # a triggered run of the enwiki deployment completes through a process worker
    run = _post(api, f"/deployments/{enwiki['id']}/create_flow_run", {"parameters": {"overrides": ["gate.limit=50"]}})
    worker = subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL,
                             "--run-once", "--limit", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=500)

    def finished():
        state = httpx.get(f"{api}/flow_runs/{run['id']}", timeout=30).json()["state"]
        return state if state["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None
    state = _wait("the enwiki run to finish", finished, 300)
    assert state["type"] == "COMPLETED", f"{state}\n{worker.stdout[-3000:]}\n{worker.stderr[-3000:]}"
    current = (home / "stores" / "corpus" / "enwiki-sample" / "current").read_text().strip()
    assert (home / "stores" / "corpus" / "enwiki-sample" / "versions" / current / "manifest.json").exists()
    # funnelrag's own loggers (stage progress lines) reach the run's logs through the pool's env
    logs = _post(api, "/logs/filter", {"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200})
    progress = [log["message"] for log in logs if log["name"] == "funnelrag.progress"]
    assert any(line.endswith("(done)") for line in progress), sorted({log["name"] for log in logs})

    # the automation starts evaluate-champion with that build's home and corpus version
    triggered = _wait("the evaluate-champion automation", lambda: _runs(api, evaluate["id"]), 120)
    params = triggered[0]["parameters"]
    assert params["home"] == str(home)
    assert f"corpus_version={current}" in params["overrides"] and "corpus=enwiki-sample" in params["overrides"]
    assert params["config_file"] == "configs/evaluate_champion.yaml"

    # every run the automations started completes on this fresh home, where no distillation has
    # registered a champion yet: they say there is nothing to do (not Failed)
    embed = _deployment(api, "embed-champion")
    started = _wait("the embed-champion automation", lambda: _runs(api, embed["id"]), 120) + triggered
    for _ in started:
        subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--run-once",
                        "--limit", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    for auto_run in started:
        def done(run_id=auto_run["id"]):
            st = httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json()["state"]
            return st if st["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None
        st = _wait(f"automation run {auto_run['name']}", done, 300)
        assert st["type"] == "COMPLETED" and st["message"].startswith("nothing to "), st
        assert "has no version with alias 'champion' yet" in st["message"]

    # an unchanged rebuild publishes nothing and so starts no automation
    again = _post(api, f"/deployments/{enwiki['id']}/create_flow_run", {"parameters": {"overrides": ["gate.limit=50"]}})
    subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, "--run-once", "--limit", "1"],
                   cwd=ROOT, env=env, capture_output=True, text=True, timeout=500)

    def rebuilt():
        st = httpx.get(f"{api}/flow_runs/{again['id']}", timeout=30).json()["state"]
        return st if st["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None
    assert _wait("the unchanged rebuild", rebuilt, 300)["type"] == "COMPLETED"
    assert (home / "stores" / "corpus" / "enwiki-sample" / "current").read_text().strip() == current
    assert len(list((home / "stores" / "corpus" / "enwiki-sample" / "versions").iterdir())) == 1
    time.sleep(10)   # automations would have fired within seconds of the event
    assert len(_runs(api, evaluate["id"])) == 1 and len(_runs(api, embed["id"])) == 1

    # a distillation that promoted a champion emits its event: embed-champion runs on the corpus
    # and home the distillation trained on (not the deployment's defaults)
    emitted = subprocess.run(
        [sys.executable, "-c", "from flows.funnel import emit_champion_event; "
         f"emit_champion_event('funnelrag-preranker', '1', 'enwiki-sample', {str(home)!r})"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert emitted.returncode == 0, emitted.stderr
    runs = _wait("embed-champion after a new champion", lambda: len(_runs(api, embed["id"])) == 2 and
                 _runs(api, embed["id"]), 120)
    newest = max(runs, key=lambda r: r["created"])
    assert newest["parameters"]["home"] == str(home) and "corpus=enwiki-sample" in newest["parameters"]["overrides"]


FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def _state(api: str, run_id: str) -> dict:
    return httpx.get(f"{api}/flow_runs/{run_id}", timeout=30).json()["state"]


def _worker_command(queue: str | None = None) -> list[str]:
    """``prefect worker start`` on the pool (only its work queue ``queue`` when given)."""
    return [sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL, *(["--work-queue", queue] if queue else [])]


def _work_until_final(api: str, env: dict, run_id: str, tries: int = 4, log: Path | None = None,
                      queue: str | None = None) -> dict:
    """Run ``--run-once`` workers (of work queue ``queue`` when given) until run ``run_id`` is final
    (runs that a build's events started through the automations may be handed out first, one a
    worker); returns its final state. Their output is appended to ``log`` when one is given."""
    for _ in range(tries):
        with open(log or os.devnull, "a") as out:
            subprocess.run([*_worker_command(queue), "--run-once", "--limit", "1"], cwd=ROOT, env=env, stdout=out,
                           stderr=subprocess.STDOUT, timeout=600)
        if _state(api, run_id)["type"] in FINAL:
            break
    return _wait(f"run {run_id}", lambda: (st := _state(api, run_id))["type"] in FINAL and st, 300)


def _deploy_enwiki(api: str, env: dict[str, str]) -> dict:
    """``prefect deploy --name nightly-corpus-build-enwiki`` (the enwiki-sample build); its deployment."""
    deployed = subprocess.run(["prefect", "--no-prompt", "deploy", "--name", "nightly-corpus-build-enwiki"],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    return _deployment(api, "nightly-corpus-build-enwiki")


def test_worker_stopped_with_sigterm_leaves_no_run_blocking_the_queue(server):
    """A process worker that gets SIGTERM while its run builds a corpus: afterwards the run is
    final, or the recovery steps of docs/deploying.md (cancel, then delete a run stuck in
    CANCELLING) clear it; either way the next run of the deployment (concurrency limit 1) completes."""
    api, env, home = server
    enwiki = _deploy_enwiki(api, env)
    run = _post(api, f"/deployments/{enwiki['id']}/create_flow_run",
                {"parameters": {"overrides": ["gate.limit=50", "name=enwiki-sigterm", "segment.passage_words=91"]}})
    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", POOL], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait("the run to start", lambda: _state(api, run["id"])["type"] in ("RUNNING", *FINAL), 300)
        time.sleep(3)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=120)
        except subprocess.TimeoutExpired:   # it did not stop on SIGTERM: stopped hard, as an operator would
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
    finally:
        _stop(worker)
    time.sleep(10)
    if _state(api, run["id"])["type"] not in FINAL:          # the recovery steps of docs/deploying.md
        cancel = subprocess.run(["prefect", "flow-run", "cancel", run["id"]], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=120)
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        try:
            _wait("the cancelled run to end", lambda: _state(api, run["id"])["type"] in FINAL, 60)
        except AssertionError:
            delete = subprocess.run(["prefect", "flow-run", "delete", run["id"]], cwd=ROOT, env=env,
                                    capture_output=True, text=True, timeout=120, input="y\n")
            assert delete.returncode == 0, delete.stdout + delete.stderr

    # the queue is free: the next run of the deployment completes through a fresh worker
    again = _post(api, f"/deployments/{enwiki['id']}/create_flow_run",
                  {"parameters": {"overrides": ["gate.limit=50", "name=enwiki-after-sigterm", "segment.passage_words=92"]}})
    state = _work_until_final(api, env, again["id"])
    assert state["type"] == "COMPLETED", state


WORKER_SCRIPT = ROOT / "infra" / "server" / "prefect-worker.sh"


def test_worker_stop_script_lets_the_run_finish_and_takes_no_new_one(server):
    """``infra/server/prefect-worker.sh stop`` while the worker runs a build, with a second run
    queued behind it: the build completes, the worker never starts the queued run (a Prefect 3.8
    process worker given SIGTERM alone goes on to take it), the worker process is gone and the
    pool is resumed; the queued run then completes through a fresh worker."""
    api, env, home = server
    env = {**env, "FUNNELRAG_WORKER_STOP_WAIT": "600"}
    enwiki = _deploy_enwiki(api, env)
    first = _post(api, f"/deployments/{enwiki['id']}/create_flow_run",
                  {"parameters": {"overrides": ["gate.limit=50", "name=enwiki-stop", "segment.passage_words=93"]}})
    started = subprocess.run(["bash", str(WORKER_SCRIPT), "start", POOL], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stdout + started.stderr
    pid = int((Path(env["PREFECT_HOME"]) / "funnelrag-worker.pid").read_text())
    try:
        _wait("the first run to start", lambda: _state(api, first["id"])["type"] in ("RUNNING", *FINAL), 300)
        queued = _post(api, f"/deployments/{enwiki['id']}/create_flow_run",
                       {"parameters": {"overrides": ["gate.limit=50", "name=enwiki-stop", "segment.passage_words=94"]}})
        stopped = subprocess.run(["bash", str(WORKER_SCRIPT), "stop", POOL], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=900)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "paused" in stopped.stdout and f"worker {pid} stopped" in stopped.stdout, stopped.stdout
    assert _state(api, first["id"])["type"] == "COMPLETED"
    run = httpx.get(f"{api}/flow_runs/{queued['id']}", timeout=30).json()
    assert run["state"]["type"] == "SCHEDULED" and run["start_time"] is None, run["state"]
    assert not (Path(env["PREFECT_HOME"]) / "funnelrag-worker.pid").exists()
    assert httpx.get(f"{api}/work_pools/{POOL}", timeout=30).json()["is_paused"] is False

    state = _work_until_final(api, env, queued["id"])
    assert state["type"] == "COMPLETED", state


NIGHTLY_BOX = "nightly-corpus-build-enwiki-box"   # the nightly flow (flows/corpus_nightly.py) on local workers


KILL_QUEUE = "kill-test"   # the runs of the kill test: its worker takes no run another test left queued


def _flow_run_process(worker: subprocess.Popen, run_id: str, timeout: float) -> psutil.Process:
    """The worker's process of flow run ``run_id`` (``python -m prefect.engine``), once it runs."""
    def find():
        try:
            children = psutil.Process(worker.pid).children(recursive=True)
        except psutil.Error:
            return None
        for child in children:
            try:
                if "prefect.engine" in " ".join(child.cmdline()) and \
                        child.environ().get("PREFECT__FLOW_RUN_ID") == run_id:
                    return child
            except psutil.Error:
                continue
        return None
    return _wait("the worker's flow-run process", find, timeout, every=0.3)


def test_nightly_under_a_worker_stopped_by_sigterm_then_kill_9_leaves_nothing(server, tmp_path, data_mirror):
    """The nightly deployment, 2 local workers, a mirror with a login (given to the worker in its
    environment, as docs/deploying.md says) run by a process worker: its flow-run process gets
    SIGTERM during token counting, the next run kill -9 at the same point. 10 s after each signal
    no process of that run's tree (recorded before the signal: pid and start time) is alive, the
    run is final in Prefect (so the deployment's concurrency slot of 1 is free), and the next run
    completes and leaves no scratch byte in the home; no file of the home, of PREFECT_HOME (the
    server's database and its WAL) or the worker's output holds the password."""
    api, env, _ = server
    home, log = tmp_path / "home", tmp_path / "worker.log"
    write_mirror(tmp_path / "mirror", 500, 1, seed=3, wiki=WIKI, sample=data_mirror / SAMPLE)
    worker_env = {**env, MIRROR_USER_ENV: USER, MIRROR_PASSWORD_ENV: PASSWORD, "PREFECT_WORKER_QUERY_SECONDS": "1"}
    deployed = subprocess.run(["prefect", "--no-prompt", "deploy", "--name", NIGHTLY_BOX], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    nightly = _deployment(api, NIGHTLY_BOX)
    with serve(tmp_path / "mirror", auth=(USER, PASSWORD)) as mirror:
        runner = [f"runner.{k}={v}" for k, v in {**RUNNER, "docs_per_shard": 30}.items()]   # ~6 token shards
        params = {"home": str(home), "overrides": [f"name={WIKI}", f"source.wiki={WIKI}", f"source.mirror={mirror.url}",
                                                   f"workspace.data_mirror={data_mirror}", "gate.enabled=false",
                                                   "index.passage_shard_tokens=0", *runner]}
        new_run = {"parameters": params, "work_queue_name": KILL_QUEUE}
        rows = []
        with open(log, "w") as out:
            worker = subprocess.Popen(_worker_command(KILL_QUEUE), cwd=ROOT, env=worker_env, stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        runs: list[Run] = []
        try:
            for sig, words in ((signal.SIGTERM, 97), (signal.SIGKILL, 98)):
                # each interrupted run counts its own tokens (another window size): on a quiet box the
                # first run's counting can finish before its signal lands, and the second would then
                # take it from the cache and never count
                own = {**new_run, "parameters": {**params, "overrides": [*params["overrides"], f"segment.passage_words={words}"]}}
                flow_run = _post(api, f"/deployments/{nightly['id']}/create_flow_run", own)
                run = Run(ForeignProcess(_flow_run_process(worker, flow_run["id"], 300)), log,
                          offset=log.stat().st_size)
                runs.append(run)
                sent, pool_s, exit_s = interrupt(run, sig, after_s=1.0)
                time.sleep(max(0.0, sent + 10 - time.time()))
                left = run.left_alive()
                state = _wait("the interrupted run to be final", lambda r=flow_run: (
                    st := _state(api, r["id"]))["type"] in FINAL and st, 120)
                rows.append((signal.Signals(sig).name, pool_s, exit_s, len(run.seen), left, state))
                print(f"\n[worker] {signal.Signals(sig).name}: pool gone {pool_s:.2f} s, flow-run process exited "
                      f"{exit_s:.2f} s after the signal; {len(left)} of {len(run.seen)} processes alive 10 s after "
                      f"it; run {state['type']}: {state['message']!r}")
                commands = [cmd for _, cmd in run.seen.values()]
                assert any("forkserver" in cmd for cmd in commands), commands   # the pool had started
                assert any("funnelrag.reaper" in cmd for cmd in commands), commands   # and the run's reaper
                assert left == [], f"{left}\n{run.tail()}"
                assert exit_s < 10, run.tail()
        finally:
            for run in runs:
                run.kill_left()
            os.killpg(worker.pid, signal.SIGKILL)   # it has no run; SIGTERM would not stop it (docs/deploying.md)
            worker.wait(timeout=30)
        for name, *_, state in rows:
            assert state["type"] in ("CRASHED", "FAILED", "CANCELLED"), (name, state)
        assert scratch_bytes(home)[1]   # the killed runs' temp directories are there

        # the deployment's slot is free: the next run completes, and sweeps what the killed runs left
        again = _post(api, f"/deployments/{nightly['id']}/create_flow_run", new_run)
        state = _work_until_final(api, worker_env, again["id"], log=log, queue=KILL_QUEUE)
        assert state["type"] == "COMPLETED", f"{state}\n{log.read_text()[-4000:]}"
        assert mirror.refused == 0   # the worker's login reached the flow
    assert (home / "stores" / "corpus" / WIKI / "current").is_file()
    bytes_left, names_left = scratch_bytes(home)
    print(f"[worker] after the next run: {bytes_left} scratch bytes, {len(names_left)} temp names left")
    assert (bytes_left, names_left) == (0, [])
    prefect_home = Path(env["PREFECT_HOME"])
    assert list(prefect_home.glob("*.db")) and (home / "mlflow.db").is_file()
    assert _files_holding_the_password(home, prefect_home, log) == []
