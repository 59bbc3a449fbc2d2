"""Where a corpus build's shards run: each stage drives its own executor, Prefect sees the stages.

A build opens one :class:`ShardRunner` (``runner`` of the config) around its stages; each stage
task (``ingest``, ``tokens``, ``segment``, ``index`` in :mod:`flows.corpus_build`) opens its own
pool from it (:meth:`ShardRunner.pool`) and hands the pool's ``submit(fn, *args) -> future`` to
the stage core, so Prefect shows one task run per stage (its shard count and seconds in its log)
and no Prefect engine, API client or log queue runs in a worker:

* ``runner.kind: local`` (default): a ``concurrent.futures.ProcessPoolExecutor`` of
  ``runner.workers`` processes forked from a ``forkserver`` that imported the stages once
  (:func:`worker_context`, :mod:`flows.pool_worker`); a shard whose worker died (the OOM killer,
  ``kill -9``) runs again on a fresh pool, at most :data:`WORKER_DEATH_RETRIES` times
  (:class:`ShardFuture`; each retry logged, then :class:`ShardWorkerDied` names the shard); SIGTERM
  or Ctrl-C stops the workers at once (:meth:`LocalShardPool.stop_workers`), and a pool broken by
  that interrupt is not renewed: its shards raise at once, so a caller that waits for its
  in-flight shards before re-raising (ingest's pass 1) ends within seconds.
* ``runner.kind: dask``: a ``distributed.Client`` per stage, on the scheduler at
  ``runner.address`` (e.g. ``tcp://scheduler:8786``) or on a ``LocalCluster`` of ``runner.workers``
  single-threaded worker processes started once for the build when no address is given. Dask
  reschedules a lost worker's shards itself.

Each shard runs as :func:`run_shard` (the call, then its freed memory given back to the OS:
:func:`funnelrag.memory.release_memory`). A local worker's log records below WARNING (progress lines of
a shard) go to its own stderr, which is the build process's (:func:`init_worker`); its warnings
come back with the shard's value and are logged by the build process
(:func:`run_shard_in_worker`), so they reach the Prefect task run's log with the stage's totals. Shard outputs go to the stage cache under the workspace home, which
must be on storage shared by the workers (NFS, or the same disk for a LocalCluster).
"""
from __future__ import annotations

import atexit
import gc
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Literal

import psutil
from pydantic import BaseModel, ConfigDict, Field

from flows.main_guard import MainGuardMissing, check_main_guard, guard_message, unguarded_main_script
from funnelrag.config import RUN_LOGGERS
from funnelrag.memory import YOUNG_COLLECTION_OBJECTS, in_build_collector, release_memory
from funnelrag.reaper import ensure_reaper

log = logging.getLogger(__name__)

INTERRUPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that stop a stage's pool workers at once (:meth:`LocalShardPool.__enter__`)."""
WORKER_STOP_GRACE_S = 3.0
"""Seconds an interrupted stage's pool workers get to end after SIGTERM before SIGKILL
(:meth:`LocalShardPool.stop_workers`)."""
WORKER_LOG_FORMAT = "%(asctime)s.%(msecs)03d | %(levelname)-7s | %(name)s - %(message)s"
"""The lines a pool worker writes to its stderr (the layout of Prefect's console lines)."""
WORKER_DEATH_RETRIES = 2
"""Fresh pools a shard whose worker died is run on again (:class:`ShardFuture`)."""


class RunnerConfig(BaseModel):
    """Where and how wide the per-shard steps run (none of it changes an artifact byte).

    kind : ``local`` (processes on this box) or ``dask`` (a Dask cluster, ``distributed``'s client).
    workers : worker processes (local, or the LocalCluster's); None (``workers: null`` in YAML) = the
        CPUs this process may run on (its affinity mask, e.g. a container's or ``taskset``'s cores;
        ``os.cpu_count()`` where the platform has no mask), so one config follows the machine.
    address : Dask scheduler address (``tcp://host:8786``); None = start a LocalCluster.
    streams_per_piece : bz2 streams (100 pages each) per ingest piece of a multistream dump.
    docs_per_shard : documents per token-counting shard, and per task of the pass that splits the
        documents by segment / cluster-token shard (a range of ``documents.parquet`` rows).
    tokens_per_shard : the most tokens (``clusters.parquet`` ``n_tokens``) of a segment or
        cluster-token shard (whole clusters, content-defined cuts:
        :func:`tasks.corpus.sharded.shards.cluster_ranges`); bounds a worker's memory (~27 bytes a token
        for segmentation, measured at 1M pages: ~0.9 GB + ~0.3 GB of process for the default).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["local", "dask"] = "local"
    workers: int | None = Field(default=None, ge=1)
    address: str | None = None
    streams_per_piece: int = Field(default=100, ge=1)
    docs_per_shard: int = Field(default=20_000, ge=1)
    tokens_per_shard: int = Field(default=32_000_000, ge=1)

    def n_workers(self) -> int:
        if self.workers:
            return self.workers
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()
        return len(cpus) or os.cpu_count() or 1


# ------------------------------------------------------------------ what runs in a worker

def run_shard(fn: Callable[..., Any], args: list[Any]) -> Any:
    """Run one shard call ``fn(*args)`` of a stage core (ingest piece, token shard, ...), then
    give the memory it freed back to the OS (:func:`funnelrag.memory.release_memory`), so a
    worker that runs many shards holds one shard's memory at a time, not its high-water mark.
    In a worker process (a child of a pool or a Dask nanny), or inside
    :func:`funnelrag.memory.build_collector` (which unfreezes at its end), the objects that outlive
    the call are frozen, so the next collection skips them; any other process, which may live on
    after the build, is never frozen. Returns what ``fn`` returns; raises what it raises."""
    try:
        return fn(*args)
    finally:
        release_memory(freeze=multiprocessing.parent_process() is not None or in_build_collector())


class _KeptRecords(logging.Handler):
    """Keeps the records at WARNING and above, ready to pickle (message formatted, no arguments,
    the exception as text)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.msg, record.args = record.getMessage(), None
        if record.exc_info:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_info = None
        self.records.append(record)


@dataclass(frozen=True)
class ShardReturn:
    """What a local pool worker sends back for one shard (:func:`run_shard_in_worker`): ``value``,
    what the shard call returned, and ``records``, the log records at WARNING and above that our
    loggers emitted while it ran (message formatted, no exception object), which
    :meth:`ShardFuture.result` hands to the same loggers in the build process: a worker's warning (a
    cache entry discarded and rebuilt, a page skipped) reaches the run's log and the Prefect UI."""

    value: Any
    records: tuple[logging.LogRecord, ...] = ()


def run_shard_in_worker(fn: Callable[..., Any], args: list[Any]) -> ShardReturn:
    """:func:`run_shard` in a local pool worker: ``fn``'s value with the records at WARNING and above
    that :data:`funnelrag.config.RUN_LOGGERS` emitted during the call, which the build process logs
    again (:meth:`ShardFuture.result`); the worker's stderr shows only the lines
    below WARNING (:func:`init_worker`), so each warning appears once. Raises what ``fn`` raises (the
    call's warnings are then lost with the worker's answer; the stage fails with the error)."""
    kept = _KeptRecords()
    loggers = [logging.getLogger(name) for name in RUN_LOGGERS]
    for logger in loggers:
        logger.addHandler(kept)
    try:
        value = run_shard(fn, args)
    finally:
        for logger in loggers:
            logger.removeHandler(kept)
    return ShardReturn(value, tuple(kept.records))


def _below_warning(record: logging.LogRecord) -> bool:
    return record.levelno < logging.WARNING


def run_log_levels() -> dict[str, int]:
    """The levels set on our loggers in this process (the CLI sets INFO), for the workers."""
    return {n: logging.getLogger(n).level for n in RUN_LOGGERS if logging.getLogger(n).level}


def init_worker(levels: dict[str, int], environ: dict[str, str], cwd: str) -> None:
    """Pool initializer of a local worker process.

    * ``levels``: the parent's levels of :data:`funnelrag.config.RUN_LOGGERS`; each of those loggers
      writes its records below WARNING to this worker's stderr (inherited from the build process, so
      a shard's progress lines reach the terminal or the flow-run process's output); its warnings go
      back with the shard's value (:func:`run_shard_in_worker`); no Prefect handler runs in a worker.
    * ``environ``, ``cwd``: the parent's environment and working directory when the stage's pool
      started (the forkserver lives as long as the build process and holds those of its own start).
    * the young generation's collection threshold of :func:`funnelrag.memory.build_collector` (a
      worker freezes its survivors after each shard: :func:`run_shard`).
    """
    os.environ.clear()
    os.environ.update(environ)
    try:
        os.chdir(cwd)
    except OSError as exc:
        log.warning("pool worker %d: cannot enter the build's directory %s (%s)", os.getpid(), cwd, exc)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(WORKER_LOG_FORMAT, datefmt="%H:%M:%S"))
    handler.addFilter(_below_warning)   # warnings go to the build process with the shard's value
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        if name in levels:
            logger.setLevel(levels[name])
    gc.set_threshold(YOUNG_COLLECTION_OBJECTS, *gc.get_threshold()[1:])


# ------------------------------------------------------------------ local processes

WORKER_PRELOAD = ("__main__", "flows.pool_worker")
"""What the forkserver of a local pool imports before it forks workers (``__main__``: the
script that runs the flow, which ``spawn`` imported in every worker; no-op for ``python -m``)."""


def worker_context() -> multiprocessing.context.BaseContext:
    """The ``multiprocessing`` context local pool workers start from: ``forkserver`` preloading
    :data:`WORKER_PRELOAD` where the platform has it (Linux, macOS), else ``spawn``.

    A forkserver is a single-threaded process that imports the preload once and forks each worker
    from itself: a worker then starts with the corpus stages imported (copy-on-write pages)
    instead of importing them (~2.9 CPU s a worker on the build box), and inherits none of the
    build process's threads or open clients. It lives as long as the build process (every stage
    pool forks from the same one), is killed when a stage is interrupted, and is stopped and waited
    for when the process exits (:func:`pool_processes`), so its CPU time counts as the process's
    children's.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(WORKER_PRELOAD))
    return ctx


def pool_processes() -> tuple[psutil.Process | None, list[psutil.Process]]:
    """``(forkserver, workers)``: this process's ``multiprocessing`` forkserver (None when none
    runs) and the pool workers it forked, or the spawned pool workers where there is no
    forkserver; read from the process table (psutil), so a signal handler can find them."""
    forkserver, workers = None, []
    spawned = "forkserver" not in multiprocessing.get_all_start_methods()   # else a spawned child is not a pool's
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return None, []
    for child in children:
        try:
            cmd = " ".join(child.cmdline())
            if "multiprocessing.forkserver" in cmd and child.status() != psutil.STATUS_ZOMBIE:
                forkserver = child
                workers += [w for w in child.children() if _running(w)]
            elif spawned and "multiprocessing.spawn" in cmd:
                workers.append(child)
        except psutil.Error:
            continue
    return forkserver, workers


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _stop_forkserver_at_exit() -> None:
    """At interpreter exit: stop this process's forkserver and wait for it (no pool runs then),
    so its CPU and that of the workers it reaped count as this process's children's."""
    forkserver, _ = pool_processes()
    if forkserver is None:
        return
    try:
        forkserver.terminate()
        forkserver.wait(5)
    except (psutil.Error, OSError):
        pass


class ShardWorkerDied(RuntimeError):
    """A shard's worker process died on every attempt (the message names the shard)."""


def describe_shard(fn: Callable[..., Any], args: tuple[Any, ...], width: int = 120) -> str:
    """``fn_name(arg, ...) of module``, each argument's repr cut to ``width`` characters (a
    ``Path`` shown as its string)."""
    shown = []
    for a in args:
        r = repr(str(a)) if type(a).__name__.endswith("Path") else repr(a)
        shown.append(r if len(r) <= width else f"{r[:width]}…")
    return f"{getattr(fn, '__name__', fn)}({', '.join(shown)}) of {getattr(fn, '__module__', '?')}"


class ShardFuture:
    """The future of one shard call of a :class:`LocalShardPool`; ``result()`` resubmits it when its
    worker process died (the pool's executor broke: every future of it raises ``BrokenProcessPool``).

    Raises (from ``result``)
    ------------------------
    concurrent.futures.process.BrokenProcessPool
        The pool broke after the run was interrupted (``pool.interrupted``): never retried.
    flows.main_guard.MainGuardMissing
        The pool broke under a main script without a ``__main__`` guard (never retried: it would
        fail the same way).
    ShardWorkerDied
        The shard's worker died on each of ``WORKER_DEATH_RETRIES + 1`` attempts, each on a fresh pool.
    """

    def __init__(self, pool: "LocalShardPool", fn: Callable[..., Any], args: tuple[Any, ...]):
        self._pool, self._fn, self._args = pool, fn, args
        self._attempt = 1
        self._executor, self._future = pool.submit_once(fn, args)

    def cancel(self) -> bool:
        """Cancel the shard if it has not started (``Future.cancel``); True if it was cancelled."""
        return self._future.cancel()

    def result(self) -> Any:
        """The shard call's value, once its worker's warnings are logged here (:class:`ShardReturn`)."""
        while True:
            try:
                returned: ShardReturn = self._future.result()
            except BrokenProcessPool as exc:
                if self._pool.interrupted:   # its workers were stopped on purpose: the run is ending
                    raise
                shard = describe_shard(self._fn, self._args)
                if (script := unguarded_main_script()) is not None:   # its workers died running it again
                    raise MainGuardMissing(f"shard {shard}: its worker process died; {guard_message(script)}") from exc
                if self._attempt > WORKER_DEATH_RETRIES:
                    raise ShardWorkerDied(
                        f"shard {shard}: a worker process of its pool died on each of {self._attempt} attempts, "
                        "each on a fresh pool (killed by the OOM killer or a signal? lower runner.workers or the "
                        "shard size)") from exc
                log.warning("shard %s: a worker process of its pool died (this shard's or one beside it: %s); "
                            "retrying it on a fresh process pool (retry %d of %d)", shard, exc, self._attempt,
                            WORKER_DEATH_RETRIES)
                self._pool.renew(self._executor)
                self._attempt += 1
                self._executor, self._future = self._pool.submit_once(self._fn, self._args)
                continue
            for record in returned.records:   # the worker's warnings, in this process's log (and Prefect's)
                logging.getLogger(record.name).handle(record)
            return returned.value


_EXIT_HOOK: list[int] = []   # the pid whose atexit hook is registered (a forked child has another)


class LocalShardPool:
    """One stage's ``ProcessPoolExecutor`` on this box; a context manager whose :meth:`submit`
    returns a :class:`ShardFuture`.

    On entry: the main script's ``__main__`` guard is checked (:func:`flows.main_guard.check_main_guard`),
    this process's reaper is started (:func:`funnelrag.reaper.ensure_reaper`: a ``kill -9`` of a
    flow run started from Python or by a Prefect worker leaves no forkserver or worker behind) and,
    in the main thread, a SIGTERM / SIGINT handler is put in front of the one there (Prefect's,
    which raises ``TerminationSignal`` in the flow, or Python's ``KeyboardInterrupt``): it sends
    SIGTERM to the pool's workers first, so they stop at once, not after the flow unwinds. The
    executor starts on the first :meth:`submit` (a stage that is a cache hit starts no process).

    On exit: the executor is shut down (its workers end); after an interruption
    (``BaseException`` that is not an ``Exception``) the workers are stopped instead and the
    queued shards cancelled (:meth:`stop_workers`), so an in-flight shard writes no cache entry.
    """

    def __init__(self, stage: str, workers: int):
        self.stage, self.workers = stage, workers
        self.shards = self.renewed = 0
        self.seconds = 0.0
        self.interrupted = False   # set by the signal handler: a broken pool is then not renewed
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self._chained: dict[int, tuple[Any, Callable[..., Any]]] = {}

    def __enter__(self) -> "LocalShardPool":
        check_main_guard()
        ensure_reaper()
        if _EXIT_HOOK != [os.getpid()]:
            _EXIT_HOOK[:] = [os.getpid()]
            atexit.register(_stop_forkserver_at_exit)
        self._ctx = worker_context()
        self._initargs = (run_log_levels(), dict(os.environ), os.getcwd())
        self._t0 = time.perf_counter()
        self._chain_signal_handlers()
        return self

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=self._ctx, initializer=init_worker,
                                   initargs=self._initargs)

    def submit(self, fn: Callable[..., Any], *args: Any) -> ShardFuture:
        """``fn(*args)`` in a worker (:func:`run_shard`); its future retries a dead worker's shard."""
        self.shards += 1
        return ShardFuture(self, fn, args)

    def submit_once(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[ProcessPoolExecutor, Future]:
        """One attempt: ``(executor, future)``; a pool already broken gives a future holding its error."""
        with self._lock:
            if self._executor is None:
                self._executor = self._new_executor()
            executor = self._executor
        try:
            return executor, executor.submit(run_shard_in_worker, fn, list(args))
        except BrokenProcessPool as exc:
            failed: Future = Future()
            failed.set_exception(exc)
            return executor, failed

    def renew(self, broken: ProcessPoolExecutor) -> bool:
        """Replace ``broken`` by a fresh executor, once per break (the other shards of the same
        break find it renewed); True if this call renewed it."""
        with self._lock:
            if self._executor is not broken:
                return False
            broken.shutdown(wait=False, cancel_futures=True)
            self._executor = self._new_executor()
            self.renewed += 1
            return True

    def _chain_signal_handlers(self) -> None:
        """Only in the main thread (the only one that may set handlers) and over a Python handler
        (a default or ignored signal is left as it is)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in INTERRUPT_SIGNALS:
            previous = signal.getsignal(sig)
            if callable(previous):
                def on_interrupt(signum: int, frame: Any, previous: Callable[..., Any] = previous) -> None:
                    self._signal_workers()
                    previous(signum, frame)
                self._chained[sig] = (previous, on_interrupt)
                signal.signal(sig, on_interrupt)

    def _restore_signal_handlers(self) -> None:
        for sig, (previous, ours) in self._chained.items():
            if signal.getsignal(sig) is ours:
                signal.signal(sig, previous)
        self._chained = {}

    def _signal_workers(self) -> None:
        """SIGTERM to each pool worker; only signals and the process table (no lock a signal
        handler could deadlock on); from then on the pool's broken futures are not retried."""
        self.interrupted = True
        if self._executor is None:
            return
        for p in pool_processes()[1]:
            try:
                p.send_signal(signal.SIGTERM)
            except psutil.Error:
                continue

    def stop_workers(self, grace_s: float = WORKER_STOP_GRACE_S) -> list[int]:
        """Stop the pool now, for a stage that was interrupted (SIGTERM, Ctrl-C): queued shards are
        cancelled, the workers terminated (SIGKILL after ``grace_s`` seconds) and the forkserver
        killed (it holds nothing to flush; the next pool starts a new one), so an in-flight shard
        stops where it is and writes no cache entry (entries are renamed into place only when
        complete: :func:`tasks.corpus.sharded.shards.put_cached`; its temp directory, named by the
        worker's pid, is swept later). Returns the pids of the workers stopped."""
        self.interrupted = True
        executor, self._executor = self._executor, None
        if executor is None:
            return []
        forkserver, workers = pool_processes()
        executor.shutdown(wait=False, cancel_futures=True)
        for p in workers:
            try:
                p.terminate()
            except psutil.Error:
                continue
        _, alive = psutil.wait_procs(workers, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                continue
        if forkserver is not None:
            try:
                forkserver.kill()
            except psutil.Error:
                pass
        if workers:
            log.warning("stage %s interrupted: %d shard worker process(es) stopped, queued shards cancelled",
                        self.stage, len(workers))
        return [p.pid for p in workers]

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._restore_signal_handlers()
        try:
            if exc_type is not None and not issubclass(exc_type, Exception):   # SIGTERM, Ctrl-C, SystemExit
                self.stop_workers()
            elif self._executor is not None:
                self._executor.shutdown(wait=True, cancel_futures=exc_type is not None)
        finally:
            self._executor = None
            self.seconds = time.perf_counter() - self._t0

    def report(self) -> str:
        """One line for the stage's log: shards, where, seconds, renewed pools."""
        renewed = f"; {self.renewed} broken pool(s) renewed" if self.renewed else ""
        return (f"stage {self.stage}: {self.shards} shard(s) on {self.workers} local worker process(es) "
                f"in {self.seconds:.2f} s{renewed}")


# ------------------------------------------------------------------ Dask

class DaskShardPool:
    """One stage's ``distributed.Client``; a context manager whose :meth:`submit` returns Dask's
    future. The client connects on the first :meth:`submit` (a cache hit connects nothing)."""

    def __init__(self, stage: str, runner: "ShardRunner"):
        self.stage, self._runner = stage, runner
        self.shards = 0
        self.seconds = 0.0
        self._client: Any = None

    def __enter__(self) -> "DaskShardPool":
        self._t0 = time.perf_counter()
        return self

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a Dask worker (:func:`run_shard`); ``pure=False``: every call runs."""
        if self._client is None:
            self._client = self._runner.dask_client()
        self.shards += 1
        return self._client.submit(run_shard, fn, list(args), pure=False)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        client, self._client = self._client, None
        self.seconds = time.perf_counter() - self._t0
        if client is not None:
            client.close()

    def report(self) -> str:
        where = self._runner.cfg.address or f"a LocalCluster of {self._runner.cfg.n_workers()} workers"
        return f"stage {self.stage}: {self.shards} shard(s) on Dask ({where}) in {self.seconds:.2f} s"


class ShardRunner:
    """The shard runner of one build (``runner`` of the config), opened by the flow around its
    stages; each stage opens its own pool with :meth:`pool`.

    For ``runner.kind: dask`` without an address, a ``LocalCluster`` of ``runner.workers``
    single-threaded worker processes is started on the first shard of the build and closed on
    exit, so the stages share its workers (and their imports); every stage has a client of its own.
    """

    def __init__(self, cfg: RunnerConfig):
        self.cfg = cfg
        self._cluster: Any = None

    def __enter__(self) -> "ShardRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.close()

    def pool(self, stage: str) -> LocalShardPool | DaskShardPool:
        """A new pool for ``stage`` (use it as a context manager, around the stage's core)."""
        if self.cfg.kind == "dask":
            return DaskShardPool(stage, self)
        return LocalShardPool(stage, self.cfg.n_workers())

    def dask_client(self) -> Any:
        """A new ``distributed.Client`` of the scheduler at ``address``, or of the build's LocalCluster."""
        from distributed import Client, LocalCluster  # noqa: PLC0415  (heavy: dask, only for the dask runner)

        if self.cfg.address:
            return Client(self.cfg.address)
        if self._cluster is None:
            self._cluster = LocalCluster(n_workers=self.cfg.n_workers(), threads_per_worker=1, processes=True,
                                         dashboard_address=None)
        return Client(self._cluster)
