"""CPU seconds each Python process spends in the cyclic garbage collector, per generation.

Put this directory first on ``PYTHONPATH`` and set ``FUNNELRAG_GC_TIME_DIR`` to an existing
directory: every Python process started with that environment (a build, its pool workers, the
Prefect API server it starts) times each collection through ``gc.callbacks`` (``time.process_time``,
so another thread's CPU during a collection counts too) and writes one line to
``<dir>/<pid>.txt`` after each full collection and at exit: its command line, collections and
CPU seconds per generation. Without the variable it does nothing. Example (one night 4 of the
nightly bench, ``docs/results/corpus-build.md``)::

    FUNNELRAG_GC_TIME_DIR=<dir> PYTHONPATH=benchmarks/gc_time:. python \
        benchmarks/bench_nightly_mirror.py --one-night --mirror-url URL --home HOME --workers 2 --no-gate
    cat <dir>/*.txt
"""
import atexit
import gc
import os
import sys
import time

_DIR = os.environ.get("FUNNELRAG_GC_TIME_DIR")
_start: dict[int, float] = {}
_seconds = [0.0, 0.0, 0.0]
_count = [0, 0, 0]


def _write() -> None:
    try:
        with open(os.path.join(_DIR, f"{os.getpid()}.txt"), "w") as out:
            out.write(f"{' '.join(sys.argv)[:100]!r} collections={_count} "
                      f"cpu_s={[round(s, 2) for s in _seconds]}\n")
    except OSError:
        pass


def _time_collection(phase: str, info: dict) -> None:
    generation = info["generation"]
    if phase == "start":
        _start[generation] = time.process_time()
        return
    _seconds[generation] += time.process_time() - _start.pop(generation, time.process_time())
    _count[generation] += 1
    if generation == 2:
        _write()


if _DIR:
    gc.callbacks.append(_time_collection)
    atexit.register(_write)
