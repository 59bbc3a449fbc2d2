"""Stop what a killed ``funnelrag`` command leaves behind.

* The ephemeral Prefect API the CLI starts (a uvicorn subprocess) outlives a ``kill -9`` of the
  CLI. :func:`start_reaper` launches a small watcher process (its own session, so the same kill
  does not reach it) that records the CLI's descendants every ``interval`` seconds and, once the
  CLI is gone, terminates those still running (matched by pid and start time, never by name).
* Stage builds stage their outputs in ``cache/<stage>/.tmp-<key>-<pid>/``, and
  :func:`data_contracts.base.atomic_directory` (the memos) in ``.<name>.tmp-<pid>/`` with the
  replaced directory moved to ``.<name>.old-<pid>/``; a killed run leaves them.
  :func:`sweep_stale_temp_dirs` removes those whose pid is no longer running.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

_TMP = re.compile(r"^\.tmp-.+-(\d+)$")
_ATOMIC = re.compile(r"^\.(.+)\.(tmp|old)-(\d+)$")   # data_contracts.base.atomic_directory's


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (zombies count as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sweep_stale_temp_dirs(stage_dir: Path) -> list[Path]:
    """Remove ``.tmp-<key>-<pid>``, ``.<name>.tmp-<pid>`` and ``.<name>.old-<pid>`` directories in
    ``stage_dir`` whose pid is not running (a killed stage build's or
    :func:`data_contracts.base.atomic_directory`'s). A run killed between that function's two
    renames leaves the last good directory (``.old``), the new complete one (``.tmp``) and
    nothing at ``<name>``: both are kept then, for an operator to move one back.

    Returns
    -------
    list of Path
        The directories removed (those of live processes, e.g. a concurrent build, are kept).
    """
    removed = []
    if not Path(stage_dir).is_dir():
        return removed
    for entry in Path(stage_dir).iterdir():
        m = _TMP.match(entry.name)
        a = None if m else _ATOMIC.match(entry.name)
        pid = int(m.group(1)) if m else int(a.group(3)) if a else None
        if pid is None or not entry.is_dir() or pid == os.getpid() or pid_alive(pid):
            continue
        if a and not (entry.parent / a.group(1)).exists() and (entry.parent / f".{a.group(1)}.old-{pid}").exists():
            continue   # killed between atomic_directory's two renames: keep the old and the new directory
        shutil.rmtree(entry, ignore_errors=True)
        log.info("removed %s left by a killed run (pid %s)", entry, pid)
        removed.append(entry)
    return removed


def start_reaper(interval: float = 2.0) -> subprocess.Popen:
    """Watch this process; when it dies, terminate the descendants it had (e.g. the ephemeral
    Prefect server). Returns the watcher process (it exits on its own)."""
    return subprocess.Popen([sys.executable, "-m", "funnelrag.reaper", str(os.getpid()), str(interval)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def watch(parent: int, interval: float) -> None:
    """Body of the watcher: remember ``parent``'s descendants until it is gone, then stop them."""
    me = os.getpid()
    known: dict[int, float] = {}
    try:
        proc = psutil.Process(parent)
    except psutil.NoSuchProcess:
        return
    while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
        try:
            for child in proc.children(recursive=True):
                if child.pid != me:
                    known[child.pid] = child.create_time()
        except psutil.NoSuchProcess:
            break
        time.sleep(interval)
    left = []
    for pid, created in known.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created:
                p.terminate()
                left.append(p)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(left, timeout=10)
    for p in alive:
        p.kill()


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]))
