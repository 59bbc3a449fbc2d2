"""A real corpus build in a child process, for the tests that interrupt one: started from Python
(the nightly flow), from the CLI (``funnelrag build-corpus``), watched (its process tree recorded
as it grows), signalled, and what it left afterwards (processes, cache entries, scratch bytes)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable
from pathlib import Path

import psutil

from data_contracts.base import parse_temp_name
from funnelrag.reaper import pid_alive

ROOT = Path(__file__).resolve().parents[1]
WIKI = "synwiki"
RUNNER = {"kind": "local", "workers": 2, "streams_per_piece": 2, "docs_per_shard": 50, "tokens_per_shard": 200_000}
TOKENS_STARTED = "token counts of documents"   # a token shard finished: the others are in flight

# The child of a run from Python: a script with a __main__ guard (the forkserver imports __main__).
NIGHTLY_SCRIPT = """\
import json, sys
from flows.corpus_build import CorpusBuildConfig
from flows.corpus_nightly import corpus_build_nightly

if __name__ == "__main__":
    summary = corpus_build_nightly(CorpusBuildConfig.model_validate(json.loads(sys.argv[1])))
    print("VERSION", summary["version"], flush=True)
"""


def build_config(home: Path, data_mirror: Path, **source) -> dict:
    """The corpus-build config of these runs (2 local workers, small shards, no gate), as JSON data."""
    return {"name": WIKI, "source": {"datasets": [], "wiki": WIKI, **source}, "ingest": {"format": "mediawiki"},
            "clustering": {"max_tokens": 4096}, "gate": {"enabled": False}, "runner": RUNNER,
            "workspace": {"home": str(home), "data_mirror": str(data_mirror)}}


def child_env(prefect_home: Path) -> dict[str, str]:
    """No API URL (each run starts its ephemeral Prefect API), a throwaway PREFECT_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(prefect_home), PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600", TOKENIZERS_PARALLELISM="false")
    return env


class ForeignProcess:
    """A process this test did not start (a Prefect worker's flow-run process) with the part of
    ``subprocess.Popen``'s interface :class:`Run` uses; its exit status is its parent's to read,
    so ``returncode`` says only ``"exited"``."""

    def __init__(self, proc: psutil.Process):
        self.pid, self._proc, self.returncode = proc.pid, proc, None

    def poll(self) -> str | None:
        try:
            gone = not self._proc.is_running() or self._proc.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            gone = True
        if gone:
            self.returncode = "exited"
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self._proc.send_signal(sig)

    def kill(self) -> None:
        try:
            self._proc.kill()
        except psutil.NoSuchProcess:
            pass

    def wait(self, timeout: float | None = None) -> str | None:
        deadline = time.monotonic() + (timeout if timeout is not None else float("inf"))
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode


@dataclass
class Run:
    """One child run: its process, its log file (read from ``offset``: a worker's log holds earlier
    runs too), and every descendant seen (pid → (start time, command))."""

    proc: subprocess.Popen | ForeignProcess
    log: Path
    seen: dict[int, tuple[float, str]] = field(default_factory=dict)
    offset: int = 0

    def look(self) -> None:
        """Record the child's descendants now."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return
        for c in children:
            try:
                self.seen.setdefault(c.pid, (c.create_time(), " ".join(c.cmdline())[:120]))
            except psutil.Error:
                continue

    def wait_for_line(self, text: str, timeout: float) -> float:
        """Record descendants until ``text`` appears in the log; returns the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.look()
            if text in self.log.read_text(errors="replace")[self.offset:]:
                return time.monotonic()
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended (rc {self.proc.returncode}) before {text!r}:\n{self.tail()}")
            time.sleep(0.3)
        raise AssertionError(f"no {text!r} after {timeout:.0f} s:\n{self.tail()}")

    def pool_processes(self) -> list[psutil.Process]:
        """The running forkserver and pool workers among the recorded descendants."""
        found = []
        for pid, (created, cmd) in self.seen.items():
            try:
                p = psutil.Process(pid)
                if "forkserver" in cmd and p.create_time() == created:
                    found.append(p)
            except psutil.Error:
                continue
        return found

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[self.offset:][-n:]

    def left_alive(self) -> list[str]:
        """The recorded descendants still running (same pid and start time), as ``pid command``."""
        alive = []
        for pid, (created, cmd) in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{pid} {cmd}")
            except psutil.Error:
                continue
        return alive

    def kill_left(self) -> None:
        """Do not leak processes into the rest of the session when a test fails."""
        for pid, (created, _) in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == created:
                    p.kill()
            except psutil.Error:
                continue
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def interrupt(run: Run, sig: int, after_s: float = 1.5,
              ready: Callable[[], bool] | None = None) -> tuple[float, float, float]:
    """Wait for token counting (:data:`TOKENS_STARTED`), ``after_s`` more and, with ``ready``, until
    ``ready()`` holds (at most 120 s more: a state the test needs at the signal, not a guess of how
    long the run takes to reach it), then send ``sig``; returns (POSIX time of the signal, seconds
    from the signal until the pool's processes (forkserver and workers) are gone, seconds from the
    signal to the run process's exit)."""
    run.wait_for_line(TOKENS_STARTED, timeout=1200)
    until = time.monotonic() + after_s
    deadline = until + 120
    while time.monotonic() < until or (ready is not None and not ready() and time.monotonic() < deadline):
        run.look()
        time.sleep(0.2)
    run.look()
    pool = run.pool_processes()
    sent, t0 = time.time(), time.monotonic()
    run.proc.send_signal(sig)
    while pool and time.monotonic() < t0 + 120 and any(pid_alive(p.pid) and p.is_running() for p in pool):
        time.sleep(0.05)
    pool_s = time.monotonic() - t0
    run.proc.wait(timeout=300)
    return sent, pool_s, time.monotonic() - t0


def start_from_python(config: dict, prefect_home: Path, log: Path) -> Run:
    """``corpus_build_nightly(config)`` called from a Python script in a child process."""
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-c", NIGHTLY_SCRIPT, json.dumps(config)], cwd=ROOT,
                            env=child_env(prefect_home), stdout=out, stderr=subprocess.STDOUT)
    out.close()
    return Run(proc, log)


def start_from_cli(config: dict, prefect_home: Path, log: Path) -> Run:
    """``funnelrag build-corpus --config <file>`` in a child process (the CLI starts its own reaper)."""
    cfg_file = log.with_suffix(".yaml")
    cfg_file.write_text(json.dumps(config))   # JSON is YAML
    out = open(log, "w")
    proc = subprocess.Popen([sys.executable, "-m", "funnelrag.cli", "build-corpus", "--config", str(cfg_file)],
                            cwd=ROOT, env=child_env(prefect_home), stdout=out, stderr=subprocess.STDOUT)
    out.close()
    return Run(proc, log)


def entries_written_after(cache: Path, since_epoch: float) -> list[str]:
    """Cache entries (``COMPLETE`` or ``piece.json`` markers) made after ``since_epoch`` (POSIX s)."""
    found = []
    for marker in (*cache.rglob("COMPLETE"), *cache.rglob("piece.json")):
        if marker.stat().st_mtime > since_epoch and not any(parse_temp_name(p) for p in marker.relative_to(cache).parts):
            found.append(str(marker.parent.relative_to(cache)))
    return found


def scratch_bytes(home: Path) -> tuple[int, list[str]]:
    """Bytes and names of every temp or scratch file and directory (``.tmp-<pid>-…``, ``.old-<pid>-…``) under ``home``."""
    total, names = 0, []
    for path in home.rglob("*"):
        if parse_temp_name(path.name) and not any(parse_temp_name(p) for p in path.relative_to(home).parts[:-1]):
            names.append(str(path.relative_to(home)))
            files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
            total += sum(f.stat().st_size for f in files)
    return total, names
