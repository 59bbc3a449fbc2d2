"""Inter-process locks on files of the funnelrag home: one corpus build per corpus and home, one
creator of the MLflow database.

The locks are ``fcntl.flock`` locks on a small file that also names its holder (pid, host,
start time) for the refusal message. The kernel releases a flock when its holder dies, so a
lock left by a killed process (``kill -9``, a lost worker) is taken over by the next run
without any clean-up; the next holder overwrites the stale holder line and logs it.
Local file systems only: flock over NFS depends on the mount.
"""
from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import socket
import time
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)


class LockHeld(RuntimeError):
    """Another live process holds the lock; the message names it and the lock file."""


def _holder_line() -> str:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return f"pid {os.getpid()} on {socket.gethostname()} since {started}"


@contextlib.contextmanager
def exclusive_lock(path: Path, what: str, *, wait: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) for the ``with`` block.

    Parameters
    ----------
    path : the lock file (its directory is created).
    what : what the lock protects, for messages, e.g. ``"corpus build of wikispeedia in /srv/home"``.
    wait : block until the lock is free instead of refusing.

    Raises
    ------
    LockHeld
        ``wait=False`` and a live process holds the lock (names its pid, host and start time).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "an unknown process"
            raise LockHeld(f"{what} is already running: held by {holder} (lock file {path}); "
                           "wait for it to finish or stop it") from None
        stale = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip()
        if stale:
            log.warning("%s: taking over the lock left by %s, which no longer holds it (%s)", what, stale, path)
        os.ftruncate(fd, 0)
        os.pwrite(fd, (_holder_line() + "\n").encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released cleanly: no holder line left behind
    finally:
        os.close(fd)  # closing the descriptor releases the flock
