"""DR-RAG document selection: QDC (Eq. 1), Classifier Forward Selection (CFS, Algorithm 1 / Eq. 4)
and Classifier Inverse Selection (CIS, Eq. 3). Pure functions over precomputed rankings.

Inputs
------
``first`` : the first-stage ranking of ``q`` (paragraph ids, best first).
``second`` : ``{d*: ranking of q ⊕ d*}`` for every first-stage document ``d*`` used.
``probs`` : ``{(anchor_id, doc_id): P(C(q, anchor, doc) = 1)}`` from the classifier (Eq. 2).

Budget: top-``k`` = ``k1`` static-relevant documents (first stage) + ``k2`` dynamic-relevant
documents (second stage), ``k1 + k2 = k``; ``k1`` defaults to ``ceil(k / 2)``.

QDC rule ("first not already in the context"). ``D1`` = the first ``k1`` distinct ids of
``first``. Then, in rounds, each ``d*`` of ``D1`` in rank order walks its own ranking of
``q ⊕ d*`` from where it stopped, skips every id already selected (``D1`` and earlier
additions) and adds the first remaining one, until ``k2`` documents were added or every
ranking is exhausted. Output order: ``D1`` in rank order, then the additions in the order
they were made. Ids never repeat.

CFS (our reading of Algorithm 1 / Eq. 4). ``D1`` is kept unconditionally (the static-relevant
``d*``). The walk is the QDC walk, but a candidate ``d'`` is added only if
``P(C(q, d*, d')) >= threshold``; rejected candidates are passed over (they stay available to
other ``d*``). Each pick of a ``d*`` examines at most ``max_candidates`` not-yet-selected
candidates; if none is accepted, that ``d*`` adds nothing more. Hence ``|D| <= k`` and
``|D| < k`` when the classifier rejects; with ``threshold <= 0`` CFS equals QDC.

CIS (our reading of Eq. 3). Start from the QDC set ``D`` and remove every document the
classifier judges not to help with its anchor: a second-stage document is judged with the
``d*`` that retrieved it, ``C(q, d*, d)``; a first-stage document other than the top-1 is
judged with the top-1 document. The top-1 document (the anchor of all) is always kept. Order
of the survivors is unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence


@dataclass(frozen=True)
class Selected:
    """One kept document: ``stage`` 1 (first retrieval) or 2 (QDC retrieval), the ``parent_id``
    ``d*`` whose ``q ⊕ d*`` found it (stage 2 only) and the classifier probability when judged."""

    paragraph_id: str
    stage: int
    parent_id: str | None = None
    prob: float | None = None


def split_budget(k: int, k1: int | None = None) -> tuple[int, int]:
    """``(k1, k2)`` with ``k1 + k2 = k``; ``k1 = ceil(k / 2)`` unless given.

    Raises
    ------
    ValueError
        ``k < 1`` or ``k1`` outside ``[1, k]``.
    """
    if k < 1:
        raise ValueError(f"top-k must be >= 1, got {k}")
    k1 = math.ceil(k / 2) if k1 is None else k1
    if not 1 <= k1 <= k:
        raise ValueError(f"k1 must be in [1, k={k}], got {k1}")
    return k1, k - k1


def first_stage(first: Sequence[str], k1: int) -> list[str]:
    """The first ``k1`` distinct ids of ``first`` in rank order."""
    return list(dict.fromkeys(first))[:k1]


def _walk(first: Sequence[str], second: Mapping[str, Sequence[str]], k: int, k1: int | None,
          accept: Callable[[str, str], tuple[bool, float | None]], max_candidates: int | None) -> list[Selected]:
    k1, k2 = split_budget(k, k1)
    d1 = first_stage(first, k1)
    out = [Selected(pid, 1) for pid in d1]
    chosen = set(d1)
    missing = [p for p in d1 if p not in second] if k2 else []
    if missing:
        raise KeyError(f"no q ⊕ d* ranking for first-stage document(s) {missing}")
    pos = {p: 0 for p in d1}
    live = list(d1)
    added = 0
    while added < k2 and live:
        for parent in list(live):
            if added >= k2:
                break
            ranking, i, judged, picked = second[parent], pos[parent], 0, None
            while i < len(ranking) and (max_candidates is None or judged < max_candidates):
                cand = ranking[i]
                i += 1
                if cand in chosen:
                    continue
                judged += 1
                ok, prob = accept(parent, cand)
                if ok:
                    picked = Selected(cand, 2, parent, prob)
                    break
            pos[parent] = i
            if picked is None:
                live.remove(parent)
                continue
            out.append(picked)
            chosen.add(picked.paragraph_id)
            added += 1
    return out


def qdc_select(first: Sequence[str], second: Mapping[str, Sequence[str]], k: int, k1: int | None = None) -> list[Selected]:
    """QDC selection (DR-RAG Eq. 1 with the "first not already in the context" rule; see module doc).

    Returns
    -------
    list of :class:`Selected`, length ``<= k`` (``== k`` unless the rankings run out).

    Raises
    ------
    KeyError
        A first-stage document has no entry in ``second`` (only checked when ``k2 > 0``).
    """
    return _walk(first, second, k, k1, lambda parent, cand: (True, None), None)


def cfs_select(first: Sequence[str], second: Mapping[str, Sequence[str]], probs: Mapping[tuple[str, str], float],
               k: int, threshold: float, k1: int | None = None, max_candidates: int = 5) -> list[Selected]:
    """Classifier Forward Selection (DR-RAG Algorithm 1, Eq. 4; see module doc for the reading).

    Parameters
    ----------
    probs : ``{(d*, d'): P(C(q, d*, d') = 1)}``; must hold every pair the walk examines
        (:func:`cfs_candidate_pairs` lists a superset).
    threshold : decision threshold on the probability, ``C = 1`` iff ``prob >= threshold``.
    max_candidates : not-yet-selected candidates judged per pick of one ``d*``.

    Raises
    ------
    KeyError
        A pair the walk needs is missing from ``probs``.
    """
    if max_candidates < 1:
        raise ValueError(f"max_candidates must be >= 1, got {max_candidates}")

    def accept(parent: str, cand: str) -> tuple[bool, float]:
        prob = probs[(parent, cand)]
        return prob >= threshold, prob

    return _walk(first, second, k, k1, accept, max_candidates)


def cis_select(selected: Sequence[Selected], probs: Mapping[tuple[str, str], float], threshold: float) -> list[Selected]:
    """Classifier Inverse Selection (DR-RAG Eq. 3; see module doc): drop documents with
    ``P(C(q, anchor, d)) < threshold``; the top-1 document is always kept.

    Raises
    ------
    KeyError
        A pair from :func:`cis_pairs` is missing from ``probs``.
    """
    if not selected:
        return []
    kept = [selected[0]]
    for anchor, doc in zip(_anchors(selected), selected[1:]):
        prob = probs[(anchor, doc.paragraph_id)]
        if prob >= threshold:
            kept.append(replace(doc, prob=prob))
    return kept


def _anchors(selected: Sequence[Selected]) -> list[str]:
    top = selected[0].paragraph_id
    return [d.parent_id if d.stage == 2 and d.parent_id is not None else top for d in selected[1:]]


def cis_pairs(selected: Sequence[Selected]) -> list[tuple[str, str]]:
    """The ``(anchor, doc)`` pairs :func:`cis_select` judges, in order."""
    if not selected:
        return []
    return list(zip(_anchors(selected), (d.paragraph_id for d in selected[1:])))


def cfs_candidate_pairs(first: Sequence[str], second: Mapping[str, Sequence[str]], k: int,
                        k1: int | None = None, max_candidates: int = 5) -> list[tuple[str, str]]:
    """A superset of the pairs :func:`cfs_select` may judge: for each first-stage ``d*``, the
    first ``k + max_candidates * k2`` ids of its ranking other than ``d*`` itself (enough to
    skip every selected document and judge ``max_candidates`` per pick). Sorted, unique."""
    k1, k2 = split_budget(k, k1)
    if k2 == 0:
        return []
    depth = k + max_candidates * k2
    pairs = {(p, c) for p in first_stage(first, k1) for c in list(second[p])[:depth] if c != p}
    return sorted(pairs)


def cfs_first_pairs(first: Sequence[str], second: Mapping[str, Sequence[str]], k: int,
                    k1: int | None = None, n_candidates: int = 2) -> list[tuple[str, str]]:
    """Pairs of each ``d*``'s first pick that do not depend on other picks: its first
    ``n_candidates`` candidates outside ``D1`` (the usual CFS workload, scored in one batch)."""
    k1, k2 = split_budget(k, k1)
    if k2 == 0:
        return []
    d1 = first_stage(first, k1)
    out = []
    for p in d1:
        cands = [c for c in second.get(p, ()) if c not in set(d1)]
        out += [(p, c) for c in cands[:n_candidates]]
    return out
