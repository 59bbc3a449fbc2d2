"""Contracts of R²AG: ranked lists, retrieval features, QDM scores, ranking metrics.

One row per (query, document) of a ranked list of ``k`` documents; ``rank`` is the 0-based
position in the retriever's ranking (rank 0 = the retriever's top document), so row ``rank`` of a
list is document ``i = rank + 1`` of the paper's Eqs. 10–12.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.base import Contract, binary_labels


def _ranks_contiguous(table: pa.Table):
    """Ranks of every list are exactly 0..k-1 (no gap, so no placeholder can go missing)."""
    if table.num_rows == 0:
        return None
    grouped = table.group_by("query_id").aggregate([("rank", "count"), ("rank", "max"), ("rank", "min")])
    bad = pc.or_(pc.not_equal(grouped["rank_min"], 0),
                 pc.not_equal(pc.add(grouped["rank_max"], 1), pc.cast(grouped["rank_count"], pa.int16())))
    if pc.any(bad).as_py():
        qids = grouped["query_id"].filter(bad).to_pylist()[:3]
        rows = np.flatnonzero(pc.is_in(table["query_id"], value_set=pa.array(qids)).to_numpy(zero_copy_only=False))
        return "rank", rows[:5].tolist(), f"ranks of list(s) {qids} are not 0..k-1"
    return None


def _doc_unique_per_list(table: pa.Table):
    if table.num_rows == 0:
        return None
    n = table.group_by(["query_id", "doc_id"]).aggregate([]).num_rows
    if n != table.num_rows:
        return "doc_id", [], f"{table.num_rows - n} document(s) repeated inside a ranked list"
    return None


def _finite(*columns: str):
    def check(table: pa.Table):
        for col in columns:
            arr = table[col].to_numpy()
            bad = ~np.isfinite(arr)
            if bad.any():
                return col, np.flatnonzero(bad)[:5].tolist(), "non-finite feature value"
        return None
    return check


RANKED_LISTS = Contract(
    name="r2ag_ranked_lists",
    filename="ranked_lists.r2ag.parquet",
    schema=pa.schema([
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("answers", pa.list_(pa.string()), nullable=False),
        pa.field("rank", pa.int16(), nullable=False),               # 0-based retriever rank
        pa.field("doc_id", pa.string(), nullable=False),            # passage_id or "<qid>/<context id>"
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("retriever_score", pa.float32(), nullable=False),  # BM25 score or bi-encoder cosine
        pa.field("label", pa.int8(), nullable=False),               # 1 = relevant (supporting / has_answer)
    ]),
    unique=("query_id", "rank"),
    checks=(binary_labels, _ranks_contiguous, _doc_unique_per_list),
)

RETRIEVAL_FEATURES = Contract(
    name="r2ag_retrieval_features",
    filename="retrieval_features.r2ag.parquet",
    schema=pa.schema([
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("rank", pa.int16(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("relevance", pa.float32(), nullable=False),             # r_i, Eq. 10
        pa.field("precedent_similarity", pa.float32(), nullable=False),  # gamma_i, Eq. 11
        pa.field("neighbor_similarity", pa.float32(), nullable=False),   # zeta_i, Eq. 12
        pa.field("label", pa.int8(), nullable=False),
    ]),
    unique=("query_id", "rank"),
    checks=(binary_labels, _ranks_contiguous,
            _finite("relevance", "precedent_similarity", "neighbor_similarity")),
)

QDM_SCORES = Contract(
    name="r2ag_qdm_scores",
    filename="qdm_scores.r2ag.parquet",
    schema=pa.schema([
        pa.field("variant", pa.string(), nullable=False),   # "full", "without_relevance", ...
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("rank", pa.int16(), nullable=False),       # retriever rank
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("label", pa.int8(), nullable=False),
        pa.field("qdm_score", pa.float32(), nullable=False),  # sigmoid of the QDM logit, Eq. 7
    ]),
    unique=("variant", "query_id", "rank"),
    checks=(binary_labels, _finite("qdm_score")),
)

RANKING_METRICS = Contract(
    name="r2ag_ranking_metrics",
    filename="ranking_metrics.r2ag.parquet",
    schema=pa.schema([
        pa.field("ranking", pa.string(), nullable=False),    # "retriever", "relevance", "qdm:full", ...
        pa.field("metric", pa.string(), nullable=False),     # "map", "recall@1", ...
        pa.field("value", pa.float64(), nullable=False),
        pa.field("n_lists", pa.int32(), nullable=False),     # lists with >= 1 relevant document
    ]),
    unique=("ranking", "metric"),
)

R2AG_CONTRACTS = (RANKED_LISTS, RETRIEVAL_FEATURES, QDM_SCORES, RANKING_METRICS)
