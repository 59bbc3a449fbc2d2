"""What a killed build leaves behind is cleaned up: the ephemeral Prefect
server stops with the CLI, and a later run removes ``.tmp-<pid>-<label>`` directories of dead pids."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from data_contracts.base import parse_temp_name
from funnelrag.reaper import scratch_dir, sweep_stale_temp_dirs
from funnelrag.store import StageCache

ROOT = Path(__file__).resolve().parents[1]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_dirs_of_dead_pids_are_removed_by_the_next_build(tmp_path):
    stage = tmp_path / "cache" / "ingest"
    dead = stage / f".tmp-{_dead_pid()}-{'a' * 64}"
    live = stage / f".tmp-1-{'b' * 64}"  # pid 1 always runs: a concurrent build's directory
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
    """atomic_directory's ``.tmp-<pid>-<name>`` / ``.old-<pid>-<name>`` of a killed run: removed once
    ``<name>`` exists (or for a first write that never finished); kept, both, when the run died
    between the two renames (``<name>`` missing, the old directory beside the new one)."""
    dead, me = _dead_pid(), os.getpid()
    group = tmp_path / "corpus"
    (group / "memo-a").mkdir(parents=True)                       # replaced: leftovers are garbage
    for name in (f".tmp-{dead}-memo-a", f".old-{dead}-memo-a", f".tmp-{dead}-memo-b",   # b: a first write killed
                 f".tmp-{dead}-memo-c", f".old-{dead}-memo-c",   # c: killed between the renames
                 f".tmp-{me}-memo-d", ".tmp-1-memo-e"):          # this process, a live one
        (group / name).mkdir()
        (group / name / "keys.npy").write_bytes(b"x")
    removed = sweep_stale_temp_dirs(group)
    assert sorted(p.name for p in removed) == sorted([f".tmp-{dead}-memo-a", f".old-{dead}-memo-a", f".tmp-{dead}-memo-b"])
    assert sorted(p.name for p in group.iterdir()) == sorted(["memo-a", f".tmp-{dead}-memo-c", f".old-{dead}-memo-c",
                                                              f".tmp-{me}-memo-d", ".tmp-1-memo-e"])


def test_a_memo_write_killed_inside_atomic_directory_is_swept(tmp_path):
    """The names the sweeper matches are the ones :func:`data_contracts.base.atomic_directory`
    makes: a child killed (``os._exit``) while writing a directory leaves its temp, swept after."""
    code = ("import os, sys; from pathlib import Path; from data_contracts.base import atomic_directory\n"
            "with atomic_directory(Path(sys.argv[1])) as tmp:\n"
            "    (tmp / 'keys.npy').write_bytes(b'x'); os._exit(9)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "memo")], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.wait() == 9
    assert [p.name for p in tmp_path.iterdir()] == [f".tmp-{proc.pid}-memo"]
    assert [p.name for p in sweep_stale_temp_dirs(tmp_path)] == [f".tmp-{proc.pid}-memo"] and not any(tmp_path.iterdir())


def test_a_live_writer_s_temp_directory_survives_a_sweep_and_a_dead_one_s_is_swept(tmp_path):
    """The one temp-name scheme (``.tmp-<pid>-<label>``): a cache writer that is still running in
    another process keeps its directory through a sweep (cache retention's), a killed one's goes,
    and so do its temp files; names of another scheme are left alone."""
    cached = tmp_path / "segment-shards" / "k1"
    code = ("import sys, time; from pathlib import Path; from tasks.corpus.sharded.shards import put_cached\n"
            "def write(tmp):\n    (tmp / 'rows.arrow').write_bytes(b'x'); print(tmp.name, flush=True); time.sleep(60)\n"
            "put_cached(Path(sys.argv[1]), write)\n")
    writer = subprocess.Popen([sys.executable, "-c", code, str(cached)], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        live = cached.parent / writer.stdout.readline().strip()
        assert live.is_dir() and live.name.startswith(f".tmp-{writer.pid}-k1-")   # the pid first, then the thread
        dead = _dead_pid()
        (cached.parent / f".tmp-{dead}-k2-140063373495168").mkdir()     # a killed writer's (its thread id last)
        (cached.parent / f".tmp-{dead}-k3.parquet.abc123").write_bytes(b"x")   # a killed file write's
        (cached.parent / ".other-name").mkdir()
        removed = sweep_stale_temp_dirs(cached.parent)
        assert sorted(p.name for p in removed) == sorted([f".tmp-{dead}-k2-140063373495168", f".tmp-{dead}-k3.parquet.abc123"])
        assert live.is_dir() and (live / "rows.arrow").exists() and (cached.parent / ".other-name").is_dir()
    finally:
        writer.kill()
        writer.wait()
    assert [p.name for p in sweep_stale_temp_dirs(cached.parent)] == [live.name]   # its writer is gone now


def test_a_scratch_directory_carries_its_owner_s_pid_and_a_dead_owner_s_is_swept(tmp_path):
    dead = _dead_pid()
    left = tmp_path / f".tmp-{dead}-split-{'a' * 32}"   # a killed build's document split
    (left / "000000").mkdir(parents=True)
    (left / "000000" / "docs.parquet").write_bytes(b"x" * 1000)
    mine = scratch_dir(tmp_path, "split")
    assert parse_temp_name(mine.name).pid == os.getpid() and mine.name.startswith(f".tmp-{os.getpid()}-split-")
    assert not left.exists() and [p.name for p in tmp_path.iterdir()] == [mine.name]
