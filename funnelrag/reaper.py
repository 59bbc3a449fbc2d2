"""Stop what a killed ``funnelrag`` command leaves behind.

* The ephemeral Prefect API the CLI starts (a uvicorn subprocess) outlives a ``kill -9`` of the
  CLI. :func:`start_reaper` launches a small watcher process (its own session, so the same kill
  does not reach it) that records the CLI's descendants every ``interval`` seconds and, once the
  CLI is gone, terminates those still running (matched by pid and start time, never by name).
* Stage builds stage their outputs in ``cache/<stage>/.tmp-<key>-<pid>/``; a killed run leaves
  that directory. :func:`sweep_stale_temp_dirs` removes those whose pid is no longer running.
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


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (zombies count as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def sweep_stale_temp_dirs(stage_dir: Path) -> list[Path]:
    """Remove ``.tmp-<key>-<pid>`` directories in ``stage_dir`` whose pid is not running.

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
        if m and entry.is_dir() and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            shutil.rmtree(entry, ignore_errors=True)
            log.info("removed %s left by a killed run (pid %s)", entry, m.group(1))
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
