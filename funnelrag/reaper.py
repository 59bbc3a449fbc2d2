"""Stop what a killed run leaves behind: its processes, and its temp and scratch directories.

* The ephemeral Prefect API a flow run starts (a uvicorn subprocess), the ``multiprocessing``
  forkserver, the pool workers and the resource tracker outlive a ``kill -9`` of the process that
  started them (re-parented to pid 1). :func:`ensure_reaper` (called by the CLI, and by the
  shard runner's pool for a flow run from Python or by a Prefect worker) launches a small watcher
  process (its own session, so the same kill does not reach it) that records the process's
  descendants every ``interval`` seconds and, once the process is gone, terminates those still
  running (matched by pid and start time, never by name), and their own children.
* Every temp and scratch name of the stores carries its owner's pid in a fixed position,
  ``.tmp-<pid>-<label>`` / ``.old-<pid>-<label>`` (:func:`data_contracts.base.temp_name`, parsed
  in that one place): stage builds, cache entries written by pool workers, the memos'
  :func:`data_contracts.base.atomic_directory`, the removed entries of cache retention and a
  build's scratch directories (:func:`scratch_dir`). A killed run leaves them;
  :func:`sweep_stale_temp_dirs` removes those whose pid is no longer running.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from data_contracts.base import parse_temp_name, temp_name

log = logging.getLogger(__name__)

REAPER_INTERVAL_S = 1.0
"""Seconds between two looks of the watcher at its process's descendants (a process started less
than this before a ``kill -9`` may be missed; the pool's workers live for the whole stage)."""
REAPER_GRACE_S = 5.0
"""Seconds the watcher waits for the left processes to end after SIGTERM before it SIGKILLs them."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (zombies count as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sweep_stale_temp_dirs(stage_dir: Path) -> list[Path]:
    """Remove the temp directories and files in ``stage_dir`` (:func:`data_contracts.base.temp_name`:
    ``.tmp-<pid>-<label>``, ``.old-<pid>-<label>``) whose owner pid is not running: a killed stage
    build's, pool worker's, :func:`data_contracts.base.atomic_directory`'s or scratch directory's.
    A run killed between that function's two renames leaves the last good directory (``.old``),
    the new complete one (``.tmp``) and nothing at ``<label>``: both are kept then, for an operator
    to move one back.

    Returns
    -------
    list of Path
        What was removed (the work of live processes, e.g. a concurrent build, is kept).
    """
    removed: list[Path] = []
    if not Path(stage_dir).is_dir():
        return removed
    for entry in Path(stage_dir).iterdir():
        name = parse_temp_name(entry.name)
        if name is None or name.pid == os.getpid() or pid_alive(name.pid):
            continue
        if not (entry.parent / name.label).exists() and (entry.parent / temp_name(name.label, name.pid, "old")).is_dir():
            continue   # killed between atomic_directory's two renames: keep the old and the new directory
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        log.info("removed %s left by a killed run (pid %s)", entry, name.pid)
        removed.append(entry)
    return removed


def scratch_dir(parent: Path, label: str) -> Path:
    """A new scratch directory ``parent/.tmp-<pid>-<label>-<uuid>`` of this process, made after the
    scratch and temp directories of dead owners in ``parent`` are swept
    (:func:`sweep_stale_temp_dirs`): what a killed run left there is gone by the next run's first
    scratch directory. The caller removes it when done.

    Raises
    ------
    OSError
        ``parent`` cannot be created or written.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    sweep_stale_temp_dirs(parent)
    path = parent / temp_name(f"{label}-{uuid.uuid4().hex}")
    path.mkdir()
    return path


_REAPED: dict[int, subprocess.Popen] = {}
"""This process's watcher (:func:`ensure_reaper`), by the pid it watches (a forked child's pid differs)."""


def start_reaper(interval: float = REAPER_INTERVAL_S) -> subprocess.Popen:
    """Watch this process; when it dies, terminate the descendants it had (e.g. the ephemeral
    Prefect server). Returns the watcher process (it exits on its own)."""
    return subprocess.Popen([sys.executable, "-m", "funnelrag.reaper", str(os.getpid()), str(interval)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def ensure_reaper(interval: float = REAPER_INTERVAL_S) -> subprocess.Popen:
    """The watcher of this process (:func:`start_reaper`), started on the first call and reused
    while it runs: the CLI starts it before the ephemeral API, and the shard runner's pool for a
    flow run from Python or by a Prefect worker (one watcher per process whoever asks first)."""
    me = os.getpid()
    running = _REAPED.get(me)
    if running is None or running.poll() is not None:
        running = _REAPED[me] = start_reaper(interval)
    return running


def _descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def watch(parent: int, interval: float, grace: float = REAPER_GRACE_S) -> None:
    """Body of the watcher: remember ``parent``'s descendants until it is gone, then stop them
    (SIGTERM, SIGKILL after ``grace`` seconds) and the children they have then (a forkserver's
    workers forked after the last look)."""
    me = os.getpid()
    known: dict[int, float] = {}
    try:
        proc = psutil.Process(parent)
    except psutil.NoSuchProcess:
        return
    while pid_alive(parent) and proc.is_running():
        for child in _descendants(proc):
            try:
                if child.pid != me:
                    known[child.pid] = child.create_time()
            except psutil.Error:
                continue
        time.sleep(interval)
    left: dict[int, psutil.Process] = {}
    for pid, created in known.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                left[pid] = p
                left.update((c.pid, c) for c in _descendants(p) if c.pid != me)
        except psutil.Error:
            continue
    for p in left.values():
        try:
            p.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(list(left.values()), timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            continue


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]))
