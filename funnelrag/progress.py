"""Progress a person sees: a tqdm bar on a terminal, a log line at intervals elsewhere.

Every step that can run longer than ~30 s reports through :class:`Progress` (or the
:func:`progress` iterator wrapper): on an interactive terminal a ``tqdm`` bar with its unit and
rate, otherwise (Prefect workers, CI, log files) one ``INFO`` line at most every ``interval_s``
seconds and one when the step ends, e.g.::

    embed passages: 12,288/146,112 passages (41.3 passages/s, 298 s, ~54 min left) loss=0.412

(bm25s and sentence-transformers show tqdm bars the same way; ``show_bar=False`` turns the bar
off, as their ``show_progress`` does.)
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, TypeVar

from funnelrag.display import format_value

T = TypeVar("T")

_log = logging.getLogger("funnelrag.progress")

DEFAULT_INTERVAL_S = 30.0


def _fmt_seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class Progress:
    """Counts work done in one step and reports it with its unit and rate.

    Parameters
    ----------
    desc : what the step does, e.g. ``"embed passages"``; starts every line.
    total : units expected, or ``None`` when unknown (no percentage or time left then).
    unit : the unit counted, plural (``"pages"``, ``"documents"``, ``"passages"``, ``"steps"``,
        ``"questions"``).
    show_bar : ``True`` a tqdm bar, ``False`` log lines; ``None`` (default) a bar only when
        standard error is a terminal and this is not a worker process (the bars of parallel
        workers would overwrite each other).
    interval_s : seconds between log lines (and the bar's minimum refresh interval), > 0.
    logger : where log lines go (default ``funnelrag.progress``).
    clock : a monotonic clock in seconds (tests inject one).

    Raises
    ------
    ValueError
        ``interval_s`` ≤ 0 or a negative ``total``.
    """

    def __init__(self, desc: str, total: int | None = None, unit: str = "items", *,
                 show_bar: bool | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 logger: logging.Logger | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError(f"progress interval must be > 0 s, got {interval_s}")
        if total is not None and total < 0:
            raise ValueError(f"progress total must be >= 0, got {total}")
        self.desc, self.total, self.unit = desc, total, unit
        self.interval_s = float(interval_s)
        self.n = 0
        self.postfix: dict[str, Any] = {}
        self._log = logger or _log
        self._clock = clock
        self._start = clock()
        self._last_line = self._start
        self._closed = False
        if show_bar is None:
            show_bar = (bool(getattr(sys.stderr, "isatty", lambda: False)())
                        and multiprocessing.parent_process() is None)
        self._bar = None
        if show_bar:
            from tqdm.auto import tqdm  # noqa: PLC0415  (optional: only on a terminal)

            self._bar = tqdm(total=total, desc=desc, unit=f" {unit}", mininterval=min(1.0, interval_s),
                             dynamic_ncols=True, leave=True)

    @property
    def elapsed_s(self) -> float:
        """Seconds since the step started."""
        return self._clock() - self._start

    def line(self) -> str:
        """The status line: count, total, rate, time spent and left, postfix values."""
        elapsed = self.elapsed_s
        rate = self.n / elapsed if elapsed > 0 else 0.0
        done = f"{self.n:,}/{self.total:,}" if self.total is not None else f"{self.n:,}"
        speed = f"{rate:,.1f} {self.unit}/s" if rate >= 1 or rate == 0 else f"{1 / rate:,.1f} s each"
        parts = [speed, _fmt_seconds(elapsed)]
        if self.total is not None and rate > 0 and self.n < self.total:
            parts.append(f"~{_fmt_seconds((self.total - self.n) / rate)} left")
        text = f"{self.desc}: {done} {self.unit} ({', '.join(parts)})"
        if self.postfix:
            text += " " + " ".join(f"{k}={format_value(v)}" for k, v in self.postfix.items())
        return text

    def update(self, n: int = 1, **postfix: Any) -> None:
        """Add ``n`` units done; ``postfix`` values (e.g. ``loss=0.41``) are shown from now on."""
        self.n += n
        if postfix:
            self.postfix.update(postfix)
        if self._bar is not None:
            if postfix:
                self._bar.set_postfix({k: format_value(v) for k, v in self.postfix.items()}, refresh=False)
            self._bar.update(n)
            return
        if self.total is not None and self.n >= self.total:
            return   # the closing line follows
        now = self._clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            self._log.info(self.line())

    def close(self) -> None:
        """End the step: close the bar, or log the final line. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        self._log.info("%s (done)", self.line())

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(items: Iterable[T], desc: str, total: int | None = None, unit: str = "items",
             **kwargs: Any) -> Iterator[T]:
    """Yield ``items`` while reporting one unit per item (see :class:`Progress` for ``kwargs``).

    ``total`` defaults to ``len(items)`` when ``items`` has a length.
    """
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, total=total, unit=unit, **kwargs) as bar:
        for item in items:
            yield item
            bar.update(1)


@contextlib.contextmanager
def heartbeat(desc: str, interval_s: float = DEFAULT_INTERVAL_S,
              logger: logging.Logger | None = None) -> Iterator[None]:
    """A wait that cannot be counted (a server starting, a database created): ``desc`` is logged
    when it starts and, from a daemon thread, ``"desc: still waiting (N s)"`` every ``interval_s``
    seconds until the block ends; then one line with the seconds it took."""
    out = logger or _log
    done = threading.Event()
    start = time.monotonic()

    def beat() -> None:
        while not done.wait(interval_s):
            out.info("%s: still waiting (%s)", desc, _fmt_seconds(time.monotonic() - start))

    out.info("%s ...", desc)
    thread = threading.Thread(target=beat, name="funnelrag-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=1.0)
        out.info("%s: done in %s", desc, _fmt_seconds(time.monotonic() - start))
