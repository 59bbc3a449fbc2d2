"""How many ids and clusters of one published corpus version survive into the next (a nightly's report).

Passage and unit ids are content ids (:func:`tasks.corpus.segment.passage_id`): an article that keeps
its title and text keeps its passages' ids, whatever Algorithm 1 does with its cluster. Clusters and
units follow Algorithm 1 and the packing, so their churn is measured by content: a cluster survives
when tonight has a cluster with the same member titles in the same order; a unit when tonight has a
unit with the same id, passages and tokens. Nothing here imports Prefect.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts import corpus as C


def _kept(before: pa.ChunkedArray | pa.Array, after: pa.ChunkedArray | pa.Array) -> int:
    """How many values of ``before`` are in ``after``."""
    value_set = after.combine_chunks() if isinstance(after, pa.ChunkedArray) else after
    return int(pc.sum(pc.is_in(before, value_set=value_set)).as_py() or 0)


def _unit_rows(version_dir: Path) -> pa.ChunkedArray:
    """One string a unit: ``unit_id|n_passages|n_tokens``."""
    units = C.DOCUMENT_UNITS.read(version_dir, columns=["unit_id", "n_passages", "n_tokens"])
    return pc.binary_join_element_wise(units["unit_id"], units["n_passages"].cast(pa.string()),
                                       units["n_tokens"].cast(pa.string()), "|")


def _id_rows(version_dir: Path, contract, column: str) -> pa.ChunkedArray:
    """One string a row of ``contract``'s table: ``{column}|title`` (an id and the title it names)."""
    table = contract.read(version_dir, columns=[column, "title"])
    return pc.binary_join_element_wise(table[column].cast(pa.string()), table["title"], "|")


def _cluster_rows(version_dir: Path) -> list[str]:
    """One string a cluster: its member titles in cluster order, joined by a newline (a title holds none)."""
    members = C.CLUSTER_MEMBERS.read(version_dir)
    members = members.take(C.member_order(members["cluster_id"].to_numpy(), members["position"].to_numpy()))
    docs = C.DOCUMENTS.read(version_dir, columns=["doc_id", "title"])
    rows = C.rows_of(docs["doc_id"].to_numpy(), members["doc_id"].to_numpy(), f"{version_dir}: documents")
    titles = docs["title"].take(pa.array(rows)).to_pylist()
    cids = members["cluster_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, cids[1:] != cids[:-1]]) if cids.size else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], cids.size]
    return ["\n".join(titles[s:e]) for s, e in zip(starts.tolist(), ends.tolist())]


def id_survival(before: Path, after: Path) -> dict[str, float | int]:
    """What of version ``before`` survives into version ``after`` (two published version directories).

    Returns
    -------
    dict
        ``documents_before``, ``passages_before``, ``units_before``, ``clusters_before`` (counts of
        ``before``); ``documents_kept_ids``: share of ``before``'s articles (``doc_id`` and title)
        with the same ``doc_id`` in ``after``; ``clusters_kept_ids``: share of ``before``'s clusters
        whose ``cluster_id`` names a cluster of the same anchor (first member title) in ``after``;
        ``passages_kept_ids``, ``units_kept_ids``: shares (0..1) of ``before``'s passage and unit
        ids present in ``after``; ``units_unchanged``: share of ``before``'s units with a unit in
        ``after`` of the same id, passage count and token count; ``clusters_unchanged``: share of
        ``before``'s clusters with a cluster in ``after`` of the same member titles in the same
        order. A share is 1.0 when ``before`` has no rows of its kind.

    Raises
    ------
    FileNotFoundError
        A version directory lacks one of the tables read (``passages``, ``document_units``,
        ``cluster_members``, ``documents``).
    """
    def share(kept: int, total: int) -> float:
        return kept / total if total else 1.0

    p_before = C.PASSAGES.read(before, columns=["passage_id"])["passage_id"]
    p_after = C.PASSAGES.read(after, columns=["passage_id"])["passage_id"]
    u_before, u_after = C.DOCUMENT_UNITS.read(before, columns=["unit_id"])["unit_id"], \
        C.DOCUMENT_UNITS.read(after, columns=["unit_id"])["unit_id"]
    rows_before, rows_after = _unit_rows(before), _unit_rows(after)
    c_before, c_after = _cluster_rows(before), set(_cluster_rows(after))
    d_before, d_after = (_id_rows(v, C.DOCUMENTS, "doc_id") for v in (before, after))
    k_before, k_after = (_id_rows(v, C.CLUSTERS, "cluster_id") for v in (before, after))
    return {
        "documents_before": len(d_before), "passages_before": len(p_before), "units_before": len(u_before),
        "clusters_before": len(c_before),
        "documents_kept_ids": share(_kept(d_before, d_after), len(d_before)),
        "clusters_kept_ids": share(_kept(k_before, k_after), len(k_before)),
        "passages_kept_ids": share(_kept(p_before, p_after), len(p_before)),
        "units_kept_ids": share(_kept(u_before, u_after), len(u_before)),
        "units_unchanged": share(_kept(rows_before, rows_after), len(rows_before)),
        "clusters_unchanged": share(sum(c in c_after for c in c_before), len(c_before)),
    }
