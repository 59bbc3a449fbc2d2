"""A shard whose local worker process died is run again on a fresh process pool.

When a worker of Prefect's ``ProcessPoolTaskRunner`` dies (OOM killer, ``kill``), the
``ProcessPoolExecutor`` under it is broken: every future of it raises ``BrokenProcessPool``, the
task's own retries cannot run (they run inside the dead worker), and later submissions fail too.
:class:`ShardFuture` (what :func:`flows.runners.submitter` returns) catches that in ``result()``,
restarts the flow's task runner once per break (:func:`renew_broken_pool`) and submits the shard
again, at most :data:`WORKER_DEATH_RETRIES` times, each logged; then :class:`ShardWorkerDied`
names the shard (its stage function and arguments: input file, piece or range). The Dask runner
never raises ``BrokenProcessPool`` (it reschedules a lost worker's tasks itself).
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable

from prefect.context import FlowRunContext

from flows.main_guard import MainGuardMissing, guard_message, unguarded_main_script

log = logging.getLogger(__name__)

WORKER_DEATH_RETRIES = 2
_RENEW = threading.Lock()


class ShardWorkerDied(RuntimeError):
    """A shard's worker process died on every attempt (the message names the shard)."""


def describe_shard(fn: Callable[..., Any], args: tuple[Any, ...], width: int = 120) -> str:
    """``fn_name(arg, ...) of module``, each argument's repr cut to ``width`` characters."""
    shown = []
    for a in args:
        r = repr(str(a)) if type(a).__name__.endswith("Path") else repr(a)
        shown.append(r if len(r) <= width else f"{r[:width]}…")
    return f"{getattr(fn, '__name__', fn)}({', '.join(shown)}) of {getattr(fn, '__module__', '?')}"


def renew_broken_pool() -> bool:
    """Restart the current flow's task runner if its process pool is broken; True if it was."""
    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx is not None else None
    with _RENEW:
        executor = getattr(runner, "_executor", None)
        if executor is None or not getattr(executor, "_broken", False):
            return False   # renewed already (by another shard of the same break), or no process pool
        runner.__exit__(None, None, None)
        runner.__enter__()
        return True


class ShardFuture:
    """The future of one shard call; ``result()`` resubmits it when its worker process died."""

    def __init__(self, submit: Callable[[Callable[..., Any], list[Any]], Any], fn: Callable[..., Any],
                 args: tuple[Any, ...], retries: int = WORKER_DEATH_RETRIES):
        self._submit, self._fn, self._args, self._retries = submit, fn, args, retries
        self._attempt = 1
        self._future = submit(fn, list(args))

    def result(self, *a: Any, **kw: Any) -> Any:
        while True:
            try:
                return self._future.result(*a, **kw)
            except BrokenProcessPool as exc:
                shard = describe_shard(self._fn, self._args)
                if (script := unguarded_main_script()) is not None:   # its workers died running it again
                    raise MainGuardMissing(f"shard {shard}: its worker process died; {guard_message(script)}") from exc
                if self._attempt > self._retries:
                    raise ShardWorkerDied(
                        f"shard {shard}: a worker process of its pool died on each of {self._attempt} attempts, "
                        "each on a fresh pool (killed by the OOM killer or a signal? lower runner.workers or the "
                        "shard size)") from exc
                log.warning("shard %s: a worker process of its pool died (this shard's or one beside it: %s); "
                            "retrying it on a fresh process pool (retry %d of %d)", shard, exc, self._attempt,
                            self._retries)
                renew_broken_pool()
                self._attempt += 1
                self._future = self._submit(self._fn, list(self._args))

    def __getattr__(self, name: str) -> Any:   # cancel, wait, state, task_run_id: the current attempt's
        return getattr(self._future, name)
