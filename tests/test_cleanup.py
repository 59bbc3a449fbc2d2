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


def test_atomic_directory_leftovers_of_dead_pids_are_swept_unless_they_are_the_last_good_output(tmp_path):
    """atomic_directory's ``.<name>.tmp-<pid>`` / ``.<name>.old-<pid>`` of a killed run: removed once
    ``<name>`` exists (or for a first write that never finished); kept, both, when the run died
    between the two renames (``<name>`` missing, the old directory beside the new one)."""
    dead, me = _dead_pid(), os.getpid()
    group = tmp_path / "corpus"
    (group / "memo-a").mkdir(parents=True)                       # replaced: leftovers are garbage
    for name in (f".memo-a.tmp-{dead}", f".memo-a.old-{dead}", f".memo-b.tmp-{dead}",   # b: a first write killed
                 f".memo-c.tmp-{dead}", f".memo-c.old-{dead}",   # c: killed between the renames
                 f".memo-d.tmp-{me}", ".memo-e.tmp-1"):          # this process, a live one
        (group / name).mkdir()
        (group / name / "keys.npy").write_bytes(b"x")
    removed = sweep_stale_temp_dirs(group)
    assert sorted(p.name for p in removed) == sorted([f".memo-a.tmp-{dead}", f".memo-a.old-{dead}", f".memo-b.tmp-{dead}"])
    assert sorted(p.name for p in group.iterdir()) == sorted(["memo-a", f".memo-c.tmp-{dead}", f".memo-c.old-{dead}",
                                                              f".memo-d.tmp-{me}", ".memo-e.tmp-1"])


def test_a_memo_write_killed_inside_atomic_directory_is_swept(tmp_path):
    """The names the sweeper matches are the ones :func:`data_contracts.base.atomic_directory`
    makes: a child killed (``os._exit``) while writing a directory leaves its temp, swept after."""
    code = ("import os, sys; from pathlib import Path; from data_contracts.base import atomic_directory\n"
            "with atomic_directory(Path(sys.argv[1])) as tmp:\n"
            "    (tmp / 'keys.npy').write_bytes(b'x'); os._exit(9)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "memo")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.wait() == 9
    assert [p.name for p in tmp_path.iterdir()] == [f".memo.tmp-{proc.pid}"]
    assert [p.name for p in sweep_stale_temp_dirs(tmp_path)] == [f".memo.tmp-{proc.pid}"] and not any(tmp_path.iterdir())
