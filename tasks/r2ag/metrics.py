"""Ranking quality of a re-ranked list: MAP and recall@k over the documents of each list.

A list's relevant documents are those labelled 1 inside it (HotpotQA supporting paragraphs,
NQ passages with ``has_answer``). Lists with no relevant document cannot be ranked better or
worse and are left out of every mean; their number is reported.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

DEFAULT_KS = (1, 2, 3, 5)


def order_by_score(scores: np.ndarray) -> np.ndarray:
    """Indices sorting ``scores`` descending; ties keep the retriever order (lower index first)."""
    return np.lexsort((np.arange(len(scores)), -np.asarray(scores, dtype=np.float64)))


def average_precision(ranked_labels: np.ndarray) -> float:
    """AP of 0/1 labels in ranked order: mean of precision@i over the relevant positions i.

    Raises
    ------
    ValueError
        No relevant document in the list.
    """
    labels = np.asarray(ranked_labels, dtype=np.float64)
    n_rel = labels.sum()
    if n_rel == 0:
        raise ValueError("average precision is undefined for a list without relevant documents")
    precision = np.cumsum(labels) / np.arange(1, len(labels) + 1)  # (k,)
    return float((precision * labels).sum() / n_rel)


def recall_at(ranked_labels: np.ndarray, k: int) -> float:
    """Share of the list's relevant documents in its top ``k`` (ValueError if there are none)."""
    labels = np.asarray(ranked_labels, dtype=np.float64)
    n_rel = labels.sum()
    if n_rel == 0:
        raise ValueError("recall is undefined for a list without relevant documents")
    return float(labels[:k].sum() / n_rel)


def ranking_metrics(labels: Sequence[np.ndarray], scores: Sequence[np.ndarray] | None,
                    ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """MAP and recall@k of lists re-ranked by ``scores`` (None = keep the retriever order).

    Parameters
    ----------
    labels : per list, 0/1 labels ``(k_list,)`` in retriever order.
    scores : per list, scores ``(k_list,)`` aligned with ``labels`` (higher = more relevant).
    ks : cut-offs for recall@k.

    Returns
    -------
    dict
        ``{"map": ..., "recall@1": ..., ..., "n_lists": lists with >= 1 relevant document,
        "n_lists_without_relevant": ...}``; metrics are NaN when no list has a relevant document.
    """
    aps: list[float] = []
    recalls: dict[int, list[float]] = {k: [] for k in ks}
    without = 0
    for i, lab in enumerate(labels):
        lab = np.asarray(lab)
        if lab.sum() == 0:
            without += 1
            continue
        ranked = lab if scores is None else lab[order_by_score(scores[i])]
        aps.append(average_precision(ranked))
        for k in ks:
            recalls[k].append(recall_at(ranked, k))
    out = {"map": float(np.mean(aps)) if aps else float("nan")}
    for k in ks:
        out[f"recall@{k}"] = float(np.mean(recalls[k])) if recalls[k] else float("nan")
    out["n_lists"] = len(aps)
    out["n_lists_without_relevant"] = without
    return out
