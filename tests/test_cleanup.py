"""What a killed build leaves behind is cleaned up: the ephemeral Prefect
server stops with the CLI, and a later run removes ``.tmp-<key>-<pid>`` directories of dead pids."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from funnelrag.reaper import sweep_stale_temp_dirs
from funnelrag.store import StageCache

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_dirs_of_dead_pids_are_removed_by_the_next_build(tmp_path):
    stage = tmp_path / "cache" / "ingest"
    dead = stage / f".tmp-{'a' * 64}-{_dead_pid()}"
    live = stage / f".tmp-{'b' * 64}-1"  # pid 1 always runs: a concurrent build's directory
    for d in (dead, live):
        (d / "part").mkdir(parents=True)
        (d / "part" / "documents.parquet").write_bytes(b"x" * 1000)
    result = StageCache(tmp_path / "cache").run("ingest", "c" * 64, lambda out: (out / "f.txt").write_text("ok") and {})
    assert not dead.exists() and live.exists()
    assert (result.path / "f.txt").read_text() == "ok"
    assert sweep_stale_temp_dirs(stage) == []  # nothing more to remove; not-a-dir / missing is fine
    assert sweep_stale_temp_dirs(tmp_path / "missing") == []


def _cmdline(proc: psutil.Process) -> str:
    """The command line, or "" for a child that exited (or became a zombie) while we looked."""
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


@pytest.mark.slow
def test_kill_9_of_a_build_does_not_leave_the_ephemeral_prefect_server_running(tmp_path, data_mirror):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    cli = subprocess.Popen([sys.executable, "-m", "funnelrag.cli", "build-corpus", "--set", f"workspace.home={tmp_path / 'home'}",
                            "--set", f"workspace.data_mirror={data_mirror}"], cwd=ROOT, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        deadline = time.monotonic() + 180
        while server is None and time.monotonic() < deadline and cli.poll() is None:
            server = next((p for p in psutil.Process(cli.pid).children(recursive=True)
                           if "uvicorn" in _cmdline(p)), None)
            time.sleep(1)
        assert server is not None, "the CLI never started its ephemeral Prefect server"
        time.sleep(3)  # let the watcher record it
        os.kill(cli.pid, signal.SIGKILL)
        cli.wait()
        gone, alive = psutil.wait_procs([server], timeout=30)
        assert not alive, f"ephemeral server {server.pid} still running after kill -9 of the CLI"
    finally:
        if cli.poll() is None:
            cli.kill()
        if server is not None and server.is_running():  # do not leak it when the assertion fails
            server.kill()
