"""A shard whose local worker process died is run again on a fresh process pool.

When a worker of a ``ProcessPoolExecutor`` dies (OOM killer, ``kill``), the executor is broken:
every future of it raises ``BrokenProcessPool`` and later submissions fail too.
:class:`ShardFuture` (what :meth:`flows.runners.LocalShardPool.submit` returns) catches that in
``result()``, has the stage's pool renew its executor once per break
(:meth:`flows.runners.LocalShardPool.renew`) and submits the shard again, at most
:data:`WORKER_DEATH_RETRIES` times, each logged; then :class:`ShardWorkerDied` names the shard
(its stage function and arguments: input file, piece or range). Dask reschedules a lost
worker's shards itself.

A pool broken because the run was interrupted (SIGTERM, Ctrl-C: the pool's signal handler stops
its workers first) is not renewed: its shards raise at once, so a caller that waits for its
in-flight shards before re-raising the interrupt (ingest's pass 1) ends within seconds instead of
parsing them again on a fresh pool.
"""
from __future__ import annotations

import logging
from concurrent.futures import Future
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from flows.main_guard import MainGuardMissing, guard_message, unguarded_main_script

log = logging.getLogger(__name__)

WORKER_DEATH_RETRIES = 2


class ShardWorkerDied(RuntimeError):
    """A shard's worker process died on every attempt (the message names the shard)."""


@dataclass(frozen=True)
class ShardReturn:
    """What a local pool worker sends back for one shard (:func:`flows.runners.run_shard_in_worker`):
    ``value``, what the shard call returned, and ``records``, the log records at WARNING and above
    that our loggers emitted while it ran (message formatted, no exception object), which
    :meth:`ShardFuture.result` hands to the same loggers in the build process: a worker's warning (a
    cache entry discarded and rebuilt, a page skipped) reaches the run's log and the Prefect UI, not
    only the worker's stderr."""

    value: Any
    records: tuple[logging.LogRecord, ...] = ()


class RenewablePool(Protocol):
    """What :class:`ShardFuture` needs of a pool: one attempt, a fresh executor for a broken one,
    and whether the run was interrupted (then a broken pool stays broken)."""

    interrupted: bool

    def submit_once(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Future]: ...

    def renew(self, broken: Any) -> bool: ...


def describe_shard(fn: Callable[..., Any], args: tuple[Any, ...], width: int = 120) -> str:
    """``fn_name(arg, ...) of module``, each argument's repr cut to ``width`` characters (a
    ``Path`` shown as its string)."""
    shown = []
    for a in args:
        r = repr(str(a)) if type(a).__name__.endswith("Path") else repr(a)
        shown.append(r if len(r) <= width else f"{r[:width]}…")
    return f"{getattr(fn, '__name__', fn)}({', '.join(shown)}) of {getattr(fn, '__module__', '?')}"


class ShardFuture:
    """The future of one shard call; ``result()`` resubmits it when its worker process died.

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

    def __init__(self, pool: RenewablePool, fn: Callable[..., Any], args: tuple[Any, ...]):
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
