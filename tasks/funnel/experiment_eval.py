"""Held-out measures of the distillation experiment, with bootstrap 95% intervals.

* Pre-ranker answer recall AR@k per question (DPR has_answer of the top-k units of the pool).
* Passage answer recall of the post-ranking stage: the top-k passages of the same N units in
  pre-ranker order (unit rank, then position) vs in FiD Eq. 3 score order.
* Percentile bootstrap over questions (:mod:`funnelrag.paired`: the same resampled question sets
  for every row, so paired differences get their own interval).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pyarrow as pa

from funnelrag.paired import interval
from tasks.qa.metrics import first_hit, first_hit_ranks, recall_per_question


def per_question_unit_recall(pool: pa.Table, ks: Sequence[int], question_ids: Sequence[str]) -> dict[int, np.ndarray]:
    """``{k: (n_questions,) float 0/1}``: an answer unit among the top-k pre-ranked units
    (``prerank_rank < k``); a question without pool rows is a miss."""
    first = first_hit_ranks(pool["question_id"].to_pylist(), pool["prerank_rank"].to_pylist(),
                            pool["has_answer"].to_pylist())
    return recall_per_question([first.get(q) for q in question_ids], ks)


def per_question_passage_recall(candidates: pa.Table, ks: Sequence[int], question_ids: Sequence[str],
                                scores: Mapping[tuple[str, str], float] | None = None) -> dict[int, np.ndarray]:
    """``{k: (n_questions,) float 0/1}``: an answer passage among the top-k candidate passages,
    ordered by pre-ranker order (``scores=None``: unit rank, then passage position) or by
    ``scores[(question_id, passage_id)]`` descending (ties: pre-ranker order).

    Raises
    ------
    KeyError
        ``scores`` lacks a candidate passage (names it).
    """
    per_q: dict[str, list[tuple]] = {}
    for q, rank, pos, pid, hit in zip(candidates["question_id"].to_pylist(), candidates["unit_rank"].to_pylist(),
                                      candidates["passage_position"].to_pylist(), candidates["passage_id"].to_pylist(),
                                      candidates["has_answer"].to_pylist()):
        if scores is not None and (q, pid) not in scores:
            raise KeyError(f"no Eq. 3 score for question {q} passage {pid}")
        key = (rank, pos) if scores is None else (-scores[(q, pid)], rank, pos)
        per_q.setdefault(q, []).append((key, hit))
    first = [first_hit([h for _, h in sorted(per_q.get(q, []))]) for q in question_ids]
    return recall_per_question(first, ks)


def fmt(ci: tuple[float, float, float], scale: float = 100.0) -> str:
    """``"18.0 [14.2, 21.9]"`` (percent by default)."""
    m, lo, hi = (scale * v for v in ci)
    return f"{m:.1f} [{lo:.1f}, {hi:.1f}]"


def recall_table(title: str, rows: Mapping[str, dict[int, np.ndarray]], idx: np.ndarray,
                 baseline: str | None = None) -> tuple[str, dict]:
    """A text table of AR@k with intervals per row (and paired differences to ``baseline``)
    plus the same figures as a JSON-ready dict."""
    ks = sorted(next(iter(rows.values())))
    lines = [title, "  " + " | ".join([f"{'row':<28}"] + [f"AR@{k:<18}" for k in ks])]
    out: dict = {}
    for name, per_k in rows.items():
        cis = {k: interval(per_k[k], idx) for k in ks}
        out[name] = {f"ar@{k}": cis[k] for k in ks}
        lines.append("  " + " | ".join([f"{name:<28}"] + [f"{fmt(cis[k]):<21}" for k in ks]))
        if baseline is not None and name != baseline:
            diffs = {k: interval(per_k[k] - rows[baseline][k], idx) for k in ks}
            out[name].update({f"diff@{k}": diffs[k] for k in ks})
            lines.append("  " + " | ".join([f"{'  minus ' + baseline:<28}"] + [f"{fmt(diffs[k]):<21}" for k in ks]))
    return "\n".join(lines), out
