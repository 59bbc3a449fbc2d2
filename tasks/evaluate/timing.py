"""Per-query, per-stage wall-clock timing of a retrieval funnel (FunnelRAG Table 2's "Time").

Each question runs through its setting's stages one at a time (no work shared between
questions, no cache warmed by another question), so ``seconds`` is the latency one query pays
in that stage. Answer matching, metric computation and logging run outside the timed blocks.
"""
from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass(frozen=True)
class StageOutcome:
    """One stage of one query.

    name : ``retrieval`` | ``chunking`` | ``preranking`` | ``reranking`` | ``postranking``.
    unit : what the stage outputs: ``p`` passages, ``c`` clusters, ``d`` document units.
    n_in, n_out : candidates entering (the corpus size for the first stage) and leaving.
    seconds : wall-clock seconds of the stage for this query.
    hit : an answer (DPR ``has_answer``) is among the stage's output.
    """

    name: str
    unit: str
    n_in: int
    n_out: int
    seconds: float
    hit: bool


@dataclass
class StageClock:
    """Accumulates named stage times of one query (seconds, ``time.perf_counter``)."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the enclosed block and add it to stage ``name``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def __getitem__(self, name: str) -> float:
        return self.seconds.get(name, 0.0)


def compact_count(n: int) -> str:
    """``4598 → "4.6K"``, ``21015324 → "21M"``, ``80 → "80"``: candidate counts as in the paper."""
    for div, suffix in ((1_000_000, "M"), (1_000, "K")):
        if n >= div:
            v = n / div
            return f"{v:.1f}{suffix}" if v < 10 else f"{v:.0f}{suffix}"
    return str(n)


def funnel_label(stages, n_final: int | None = None) -> str:
    """``"160Kp→400p→4p"`` from stages with ``name``, ``unit``, ``n_in``, ``n_out``
    (:class:`StageOutcome` or its per-setting means): the corpus, then what each stage leaves (chunking, which changes
    granularity without filtering, is skipped), then the ``n_final`` passages handed to the
    generator when they are fewer than the last stage's output (a plain top-``n`` cut)."""
    if not stages:
        return ""
    first = stages[0]
    parts = [f"{compact_count(first.n_in)}{first.unit}"]
    parts += [f"{compact_count(s.n_out)}{s.unit}" for s in stages if s.name != "chunking"]
    last = stages[-1]
    if n_final is not None and (last.unit != "p" or last.n_out > n_final):
        parts.append(f"{n_final}p")
    return "→".join(parts)


def machine_info() -> dict[str, Any]:
    """CPU model, cores, torch threads and load average: the context of every timing."""
    import torch  # noqa: PLC0415  (heavy: torch, only for the machine description)

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(), "load_avg_1m": load}
