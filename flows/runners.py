"""The runner switch of the corpus build: where per-shard stages run.

``runner.kind: local`` (default) runs the per-shard Prefect tasks in processes on this box
(Prefect's ``ProcessPoolTaskRunner``); ``runner.kind: dask`` submits them to a Dask cluster through
``prefect-dask``'s ``DaskTaskRunner``: the scheduler at ``runner.address``
(e.g. ``tcp://scheduler:8786``), or a ``LocalCluster`` of ``runner.workers`` single-threaded worker
processes when no address is given. Shard outputs go to the stage cache under the workspace home,
which must be on storage shared by the workers (NFS, or the same disk for a LocalCluster).

The pure stage cores take ``submit(fn, *args) -> future``; :func:`submitter` makes one that runs
``fn(*args)`` as the Prefect task ``corpus-shard`` on the flow's task runner. It must be called in
the flow body (not inside a task), so the submissions reach the flow's runner.

Local workers start from a ``forkserver`` that has imported :mod:`flows.pool_worker` (Prefect's task
engine and the corpus stages), so each worker forks ready instead of importing them itself
(``spawn``, Prefect's own choice, where the platform has no forkserver: Windows).

One API for every worker: without ``PREFECT_API_URL`` the flow runs against the ephemeral API
server that Prefect starts in a subprocess, and each spawned worker (local processes, or a Dask
LocalCluster's) would start a server of its own (~10 s and ~220 MB each). The runners built here
submit under the parent's API URL (:func:`parent_api_url`), so the settings that Prefect hands to
each worker point at the parent's server.
"""
from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Literal

from prefect import task
from prefect.cache_policies import NONE as NO_CACHE
from prefect.context import FlowRunContext, SettingsContext, SyncClientContext, get_settings_context
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.task_runners import ProcessPoolTaskRunner
from pydantic import BaseModel, ConfigDict, Field

from funnelrag.config import RUN_LOGGERS
from flows.main_guard import check_main_guard
from funnelrag.reaper import ensure_reaper
from flows.shard_retry import ShardFuture
from funnelrag.memory import YOUNG_COLLECTION_OBJECTS, in_build_collector, release_memory

log = logging.getLogger(__name__)

INTERRUPT_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""Signals that stop a run's pool workers at once (:meth:`SharedAPIProcessPoolTaskRunner._chain_signal_handlers`)."""
WORKER_STOP_GRACE_S = 3.0
"""Seconds an interrupted run's pool workers get to end after SIGTERM before SIGKILL
(:meth:`SharedAPIProcessPoolTaskRunner.stop_workers`)."""


class RunnerConfig(BaseModel):
    """Where and how wide the per-shard stages run (none of it changes an artifact byte).

    kind : ``local`` (processes on this box) or ``dask`` (a Dask cluster via prefect-dask).
    workers : worker processes (local, or the LocalCluster's); None (``workers: null`` in YAML) = the
        CPUs this process may run on (its affinity mask, e.g. a container's or ``taskset``'s cores;
        ``os.cpu_count()`` where the platform has no mask), so one config follows the machine.
    address : Dask scheduler address (``tcp://host:8786``); None = start a LocalCluster.
    streams_per_piece : bz2 streams (100 pages each) per ingest piece of a multistream dump.
    docs_per_shard : documents per token-counting shard, and per task of the pass that splits the
        documents by segment / cluster-token shard (a ``doc_id`` range).
    tokens_per_shard : the most tokens (``clusters.parquet`` ``n_tokens``) of a segment or
        cluster-token shard (whole clusters, content-defined cuts:
        :func:`tasks.corpus.shards.cluster_ranges`); bounds a worker's memory (~27 bytes a token
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


def parent_api_url() -> str | None:
    """The URL of the ephemeral API this flow run talks to, when no ``PREFECT_API_URL`` is set.

    ``None`` when an API URL is configured (workers inherit it already), outside a flow run, or
    when the flow's client is not an HTTP client of a local server.
    """
    if PREFECT_API_URL.value():
        return None
    ctx = FlowRunContext.get()
    client = getattr(ctx, "client", None) if ctx else None
    url = str(getattr(client, "api_url", "") or "").rstrip("/")
    return url if url.startswith(("http://127.0.0.1:", "http://localhost:")) else None


def flow_run_api_url() -> str | None:
    """The HTTP(S) URL of the API this flow run talks to (``PREFECT_API_URL``, else the ephemeral
    server's, :func:`parent_api_url`); ``None`` outside a flow run with neither."""
    url = str(PREFECT_API_URL.value() or "") or parent_api_url()
    return url if url and url.startswith(("http://", "https://")) else None


# url -> (the settings it was made from, those settings with PREFECT_API_URL = url)
_API_SETTINGS: dict[str, tuple[Any, Any]] = {}


@contextmanager
def _settings_with_api_url(url: str) -> Iterator[None]:
    """Prefect's ``temporary_settings(updates={PREFECT_API_URL: url})``, with the updated settings
    made once per URL and current settings object: building them validates every Prefect setting
    (~40 ms of CPU), once per shard call before this, a second or more of a nightly's CPU."""
    ctx = get_settings_context()
    made = _API_SETTINGS.get(url)
    if made is None or made[0] is not ctx.settings:
        made = _API_SETTINGS[url] = (ctx.settings, ctx.settings.copy_with_update(updates={PREFECT_API_URL: url}))
    with SettingsContext(profile=ctx.profile, settings=made[1]):
        yield


def _submit_under_parent_api(submit: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a runner's ``submit`` with the parent's API URL in the settings Prefect serializes
    for the worker (its ``SettingsContext`` and environment), so the worker starts no server."""
    url = parent_api_url()
    if url is None:
        return submit(*args, **kwargs)

    with _settings_with_api_url(url):
        return submit(*args, **kwargs)


def build_task_runner(cfg: RunnerConfig):
    """The Prefect task runner for ``cfg``: ``ProcessPoolTaskRunner`` or prefect-dask's ``DaskTaskRunner``
    (local ones submit under the parent's API URL: :func:`parent_api_url`)."""
    if cfg.kind == "dask":
        from prefect_dask import DaskTaskRunner  # noqa: PLC0415  (heavy: dask, only for the dask runner)

        if cfg.address:  # remote workers cannot reach this box's 127.0.0.1: their own settings apply
            return DaskTaskRunner(address=cfg.address)

        class LocalDaskTaskRunner(DaskTaskRunner):
            def submit(self, *args: Any, **kwargs: Any) -> Any:
                return _submit_under_parent_api(super().submit, *args, **kwargs)

        return LocalDaskTaskRunner(cluster_class="distributed.LocalCluster",
                                   cluster_kwargs={"n_workers": cfg.n_workers(), "threads_per_worker": 1,
                                                   "processes": True, "dashboard_address": None})
    return SharedAPIProcessPoolTaskRunner(max_workers=cfg.n_workers(), initializer=init_worker,
                                          initargs=(run_log_levels(),))


def run_log_levels() -> dict[str, int]:
    """The levels set on our loggers in this process (the CLI sets INFO), for the workers."""
    return {n: logging.getLogger(n).level for n in RUN_LOGGERS if logging.getLogger(n).level}


def init_worker(levels: dict[str, int], api_url: str | None = None) -> None:
    """Pool initializer of a spawned worker: the parent's log levels (so a shard's progress lines
    reach the terminal and, through Prefect's forwarding, the task run logs), the young
    generation's collection threshold of :func:`funnelrag.memory.build_collector` (a worker
    freezes its survivors after each shard task: :func:`shard_call`) and, given the API URL of
    the flow run (:meth:`SharedAPIProcessPoolTaskRunner.__enter__`), one API client for the
    worker's life (:func:`keep_worker_client`)."""
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    gc.set_threshold(YOUNG_COLLECTION_OBJECTS, *gc.get_threshold()[1:])
    if api_url:
        keep_worker_client(api_url)


_WORKER_CLIENT: list[SyncClientContext] = []
"""The pool worker's kept client context (:func:`keep_worker_client`); empty elsewhere."""


def keep_worker_client(api_url: str) -> SyncClientContext | None:
    """Enter, for the rest of this worker process, a Prefect ``SyncClientContext`` on ``api_url``.

    Why: Prefect runs each task in a pool worker under a fresh ``SyncPrefectClient`` made twice
    (once restoring the flow's context, once by the task engine), and each one builds an SSL
    context from certifi's bundle (~17 ms of CPU measured here, for an ``http://`` API too) and a
    new connection. Both take the client of an open ``SyncClientContext`` when one is set with the
    same (default) HTTP settings, so one kept from the pool's start serves every task of the
    worker: a shard task's own cost 0.118 → 0.076 CPU s, the server's part included
    (``benchmarks/bench_task_overhead.py --server``), ~1.7 CPU s of an adds-changes night's ~40
    tasks. The URL is the flow run's, the one each task's client would use. The context is never
    left (the worker's exit closes the connection). Returns it; calling again returns the kept
    one; ``None`` when the API did not answer (logged: each task then makes its own client, as
    Prefect does, and fails or succeeds on its own)."""
    if _WORKER_CLIENT:
        return _WORKER_CLIENT[0]
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            ctx = SyncClientContext()
        ctx.__enter__()   # checks the API's version: one request
    except Exception as exc:  # noqa: BLE001  (an initializer that raises breaks the whole pool)
        log.warning("pool worker %d: no API client kept for %s (%s); each task makes its own", os.getpid(),
                    api_url, exc)
        return None
    _WORKER_CLIENT.append(ctx)
    return ctx


WORKER_PRELOAD = ("__main__", "flows.pool_worker")
"""What the forkserver of a local pool imports before it forks workers (``__main__``: the
script that runs the flow, which ``spawn`` imported in every worker; no-op for ``python -m``)."""


def worker_context() -> multiprocessing.context.BaseContext:
    """The ``multiprocessing`` context local pool workers start from: ``forkserver`` preloading
    :data:`WORKER_PRELOAD` where the platform has it (Linux, macOS), else ``spawn``.

    A forkserver is a single-threaded process that imports the preload once and forks each worker
    from itself: a worker then starts with Prefect's task engine and the corpus stages imported
    (copy-on-write pages) instead of importing them (~2.9 CPU s a worker on the build box), and
    inherits none of the flow process's threads or open clients, which is why Prefect's own pool
    spawns rather than forks. Each worker still gets the flow process's working directory,
    ``sys.path`` and (from Prefect, per task) its environment.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(WORKER_PRELOAD))
    return ctx


def _forkserver_pid() -> int | None:
    """The pid of this process's ``multiprocessing`` forkserver, None when none runs."""
    from multiprocessing import forkserver  # noqa: PLC0415  (stdlib; absent on Windows)

    return getattr(forkserver._forkserver, "_forkserver_pid", None)


def _stop_forkserver(kill: bool = False) -> None:
    """Stop this process's forkserver and wait for it (so its CPU time, and that of the workers it
    reaped, counts as this process's children's, and no process with stale imports lingers).
    ``ForkServer._stop`` is private, CPython's own tests use it; without it, nothing is done.

    ``kill``: SIGKILL it first, for an interrupted run whose workers are already gone. Stopped
    the ordinary way, the forkserver exits through a full interpreter shutdown of the modules it
    preloaded (Prefect, the stages), ~3 s of a loaded 2-core box in which the run's pool outlived
    its workers; it holds nothing that needs flushing (it only forks)."""
    from multiprocessing import forkserver  # noqa: PLC0415  (stdlib; absent on Windows)

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is None:
        return
    pid = _forkserver_pid()
    if kill and pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    stop()


class SharedAPIProcessPoolTaskRunner(ProcessPoolTaskRunner):
    """Prefect's ``ProcessPoolTaskRunner`` whose workers start from a preloaded forkserver
    (:func:`worker_context`), use the parent's API (no server each), whose process still exits
    after a worker was killed mid-message, and which stops at once when the run is interrupted.

    Interrupted (SIGTERM, Ctrl-C): the workers are terminated from the signal handler, before the
    flow unwinds, and on exit the queued shards are cancelled (:meth:`stop_workers`); Prefect's
    own exit waits for every in-flight task (a shard: minutes at full size). Measured (a real pool
    of 2 workers, each inside a shard, beside other jobs on the 2-core box): both workers gone
    0.05 s after SIGTERM, no cache entry written (``tests/test_flow_runners.py``). The pool also
    starts this process's reaper (:func:`funnelrag.reaper.ensure_reaper`) when none runs, so a
    ``kill -9`` of a flow run started from Python or by a Prefect worker, not only of the CLI,
    leaves no forkserver, worker, resource tracker or ephemeral API behind.

    Prefect's ``__enter__`` makes a ``spawn`` executor (it starts no process until the first
    submit); this runner replaces it with one of :func:`worker_context`, with the same initializer
    (Prefect's log and event forwarding to the parent, then :func:`init_worker`). A forkserver this
    runner started is stopped on exit, so each pool imports the code as it is then, as ``spawn`` did.

    The workers send their log records and events to the parent through one multiprocessing
    queue, whose write lock a worker holds while it sends. A worker killed then (the OOM killer,
    ``kill -9``; :mod:`flows.shard_retry` runs its shard again on a fresh pool) leaves that lock
    held for ever: on exit the runner cannot send the queue its stop message (Prefect waits 5 s,
    warns and leaves the queue), and at interpreter exit ``multiprocessing`` joins the queue's
    feeder thread, which waits for the lock, so the process never ended (a CLI build, or the test
    run, hung after its last line). :meth:`__exit__` tells such a queue not to be joined
    (``cancel_join_thread``); nothing is lost that was not already undeliverable.
    """

    def __enter__(self) -> "SharedAPIProcessPoolTaskRunner":
        check_main_guard()   # a main script without a __main__ guard: its workers would run it again and die
        ensure_reaper()   # a kill -9 of this process (from Python, a Prefect worker's run) leaves no worker behind
        super().__enter__()
        ctx = worker_context()
        self._owns_forkserver = ctx.get_start_method() == "forkserver" and _forkserver_pid() is None
        spawn_pool = self._executor
        initargs = spawn_pool._initargs
        if len(initargs) == 3 and initargs[1] is init_worker:
            # (queue, init_worker, (levels,)): the workers also keep one client of this flow run's API
            initargs = (initargs[0], init_worker, (*initargs[2][:1], flow_run_api_url()))
        self._executor = ProcessPoolExecutor(max_workers=self._max_workers, mp_context=ctx,
                                             initializer=spawn_pool._initializer, initargs=initargs)
        spawn_pool.shutdown(wait=False)
        self._chain_signal_handlers()
        return self

    def _chain_signal_handlers(self) -> None:
        """On SIGTERM or SIGINT, terminate the pool's workers first, then run the handler that was
        there (Prefect's, which raises ``TerminationSignal`` in the flow, or ``KeyboardInterrupt``):
        the workers stop at once, not after the flow's bookkeeping unwinds (MLflow run ended,
        Prefect state set), then :meth:`stop_workers` on exit. Only in the main thread (the only
        one that may set handlers) and over a Python handler (a default or ignored signal is left)."""
        self._chained: dict[int, tuple[Callable[..., Any], Callable[..., Any]]] = {}
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

    def _signal_workers(self) -> None:
        """SIGTERM to each worker process; only signals (no lock a signal handler could deadlock on)."""
        executor = getattr(self, "_executor", None)
        for p in list((getattr(executor, "_processes", None) or {}).values()):
            try:
                os.kill(p.pid, signal.SIGTERM)
            except OSError:
                continue

    def _restore_signal_handlers(self) -> None:
        for sig, (previous, ours) in getattr(self, "_chained", {}).items():
            if signal.getsignal(sig) is ours:
                signal.signal(sig, previous)
        self._chained = {}

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        return _submit_under_parent_api(super().submit, *args, **kwargs)

    def stop_workers(self, grace_s: float = WORKER_STOP_GRACE_S) -> list[int]:
        """Stop the pool now, for a run that was interrupted (SIGTERM, Ctrl-C): queued shard tasks
        are cancelled and the worker processes terminated (SIGKILL after ``grace_s`` seconds), so
        an in-flight shard stops where it is and writes no cache entry (entries are renamed into
        place only when complete: :func:`tasks.corpus.shards.put_cached`; its temp directory,
        named by the worker's pid, is swept later). Prefect's own exit would wait for every
        in-flight shard to finish (minutes each at full size). Returns the pids terminated."""
        executor = getattr(self, "_executor", None)
        if executor is None:
            return []
        processes = list((getattr(executor, "_processes", None) or {}).values())
        executor.shutdown(wait=False, cancel_futures=True)
        for p in processes:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + grace_s
        for p in processes:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1.0)
        if processes:
            log.warning("run interrupted: %d shard worker process(es) stopped, queued shards cancelled", len(processes))
        return [p.pid for p in processes]

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        queue = getattr(self, "_subprocess_message_queue", None)
        self._restore_signal_handlers()
        if exc_type is not None and not issubclass(exc_type, Exception):   # SIGTERM, Ctrl-C, SystemExit
            self.stop_workers()
            if getattr(self, "_owns_forkserver", False):   # no worker left: the forkserver now, not after
                self._owns_forkserver = False              # Prefect's exit (5 s on a queue a killed worker locked)
                _stop_forkserver(kill=True)
        try:
            super().__exit__(exc_type, exc_value, traceback)
        finally:
            if getattr(self, "_owns_forkserver", False):   # after the pool's shutdown: no worker left
                self._owns_forkserver = False
                _stop_forkserver()
            forwarder = getattr(self, "_message_forwarding_thread", None)
            if queue is not None and forwarder is not None and forwarder.is_alive():
                log.warning("a worker process died while sending its log records to this process (their "
                            "queue is locked for good); this process will not wait for that queue at exit")
                queue.cancel_join_thread()
                self._message_forwarding_thread = self._subprocess_message_queue = None


@task(name="corpus-shard", cache_policy=NO_CACHE, persist_result=False, retries=1, retry_delay_seconds=2)
def shard_call(fn: Callable[..., Any], args: list[Any]) -> Any:
    """Run one per-shard call ``fn(*args)`` of a stage core (ingest piece, token shard, ...), then
    give the memory it freed back to the OS (:func:`funnelrag.memory.release_memory`), so a
    worker that runs many shards holds one shard's memory at a time, not its high-water mark
    (in a worker process of the pool, or inside :func:`funnelrag.memory.build_collector`,
    which unfreezes at its end, the objects that outlive a task are frozen, so the next
    collection skips them; any other process, which may live on after the build, is never
    frozen)."""
    try:
        return fn(*args)
    finally:
        release_memory(freeze=multiprocessing.parent_process() is not None or in_build_collector())


def submitter() -> Callable[..., Any]:
    """``submit(fn, *args) -> ShardFuture`` (:mod:`flows.shard_retry`) on the current flow's task runner."""
    def submit(fn: Callable[..., Any], *args: Any):
        return ShardFuture(shard_call.submit, fn, args)   # a shard whose worker died: retried on a fresh pool

    return submit
