"""Memory of a long-lived worker host: what a pool worker or a build process does between tasks.

The corpus build runs many shard tasks one after another in the same processes (the coordinator
and its pool workers, :mod:`flows.runners`). Python's collector and glibc's allocator are tuned
for short scripts; these helpers keep such a host's collector time and resident memory flat:
:func:`release_memory` after each task, :func:`build_collector` around a build, and
:func:`status_mb` for the benchmarks' peak-RSS figures. None of them changes an artifact byte.
"""
from __future__ import annotations

import ctypes
import functools
import gc
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pyarrow as pa


def release_memory(freeze: bool = False) -> None:
    """Give the memory a finished shard task freed back to the operating system.

    A worker process runs many shard tasks one after another; the Python objects and Arrow
    buffers of one task are freed when it returns, but glibc's malloc arenas and Arrow's
    allocator keep the pages, and the next task's allocations fragment them, so a worker's RSS
    climbs from task to task (1M-page dump, 20,000-document segment shards, one worker:
    640–1,000 MB at the end of each task without this, ~300 MB with it; ``benchmarks/bench_memory.py
    reuse``). This runs a full garbage collection, releases Arrow's unused pool memory and calls
    glibc's ``malloc_trim(0)`` (Linux only; elsewhere the first two). Never raises.

    ``freeze`` (a worker process between shard tasks): what survives the collection is moved to
    the collector's permanent generation (``gc.freeze``), so the next call examines only the
    objects created since. A full collection over a worker's ~200K long-lived objects (Prefect,
    pydantic, the tokenizer) cost ~0.2 CPU s a task, ~8 s of a 200K-page nightly's ~55 shard
    tasks; what a task leaves in reference cycles is still collected at its end.
    """
    gc.collect()
    if freeze:
        gc.freeze()
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


YOUNG_COLLECTION_OBJECTS = 50_000
"""Allocations (net of frees) between two young collections during a corpus build (Python's
default: 700). Measured on one 200K-page night (``benchmarks/bench_nightly_mirror.py --one-night``),
the build process's collector time fell from 4.8 to 2.1-2.3 CPU s with the objects alive at the
start frozen and this threshold (``docs/results/corpus-build.md``)."""

_BUILD_COLLECTOR_DEPTH = 0


@contextmanager
def build_collector(young_objects: int = YOUNG_COLLECTION_OBJECTS) -> Iterator[None]:
    """The cyclic garbage collector of this process set for a corpus build, restored at exit.

    At entry the objects alive (the modules imported, the config: ~370K objects in a nightly's
    process) go to the collector's permanent generation (``gc.freeze``) after one collection, so
    the build's full collections no longer walk them, and the youngest generation is collected
    every ``young_objects`` net allocations instead of 700 (the build allocates millions of
    short-lived objects: titles, links, memo keys; most die by reference counting, and every
    young collection also walks the survivors of the last one). At exit the thresholds are
    restored and the frozen objects are given back to the collector (``gc.unfreeze``), so a
    process that lives on after the build (a test run, a notebook) collects as before; a process
    that had frozen objects before entry (its own choice) keeps everything frozen.
    Reference cycles made during the build are still collected, only less often. Nested use
    (the nightly's build subflow) acts at the outermost level only. Changes no artifact byte.

    Raises
    ------
    ValueError
        ``young_objects`` < 1.
    """
    global _BUILD_COLLECTOR_DEPTH
    if young_objects < 1:
        raise ValueError(f"build_collector: young_objects must be >= 1, got {young_objects}")
    outermost = _BUILD_COLLECTOR_DEPTH == 0
    old = gc.get_threshold()
    unfreeze = outermost and gc.get_freeze_count() == 0
    if outermost:
        gc.collect()
        gc.freeze()
        gc.set_threshold(young_objects, *old[1:])
    _BUILD_COLLECTOR_DEPTH += 1
    try:
        yield
    finally:
        _BUILD_COLLECTOR_DEPTH -= 1
        if outermost:
            gc.set_threshold(*old)
            if unfreeze:
                gc.unfreeze()


def in_build_collector() -> bool:
    """Whether this process is inside :func:`build_collector`."""
    return _BUILD_COLLECTOR_DEPTH > 0


def status_mb(field: str) -> float | None:
    """A memory field of this process from Linux ``/proc/self/status`` in MB (2**20 bytes):
    ``VmRSS`` (resident now), ``VmHWM`` (peak resident since start or since ``5`` was written to
    ``/proc/self/clear_refs``). ``None`` off Linux or when the field is not there. Benchmarks use it
    for the peak RSS of one process image (``ru_maxrss`` carries a parent's peak over ``execve``)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    prefix = field + ":"
    return next((int(line.split()[1]) / 1024 for line in status.splitlines() if line.startswith(prefix)), None)


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    """glibc's ``malloc_trim`` (None off Linux or without glibc, e.g. musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
