"""Contract of the passage embedding index: one pre-ranker vector per corpus passage.

The index is published per (corpus content digest, pre-ranker weights) in
``home/stores/embeddings/<corpus>/<model version>/versions/<id>/`` beside an ``index.json``
naming both (see :mod:`tasks.funnel.embeddings`). Rows follow the corpus ``passages`` table;
``unit_id`` and ``cluster_id`` repeat the corpus ids so that progressive retrieval gathers the
vectors of the top-K clusters without reading the passages table.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.base import Contract


def _check_vectors(table: pa.Table):
    """Every row has the same dimension and unit L2 norm (dot product = cosine)."""
    if not table.num_rows:
        return None
    lengths = pc.list_value_length(table["embedding"]).to_numpy(zero_copy_only=False)
    if (lengths != lengths[0]).any() or lengths[0] < 1:
        rows = np.flatnonzero(lengths != lengths[0]).tolist() or [0]
        return "embedding", rows, f"every embedding must have the same dimension >= 1 (first row: {lengths[0]})"
    flat = pc.list_flatten(table["embedding"]).to_numpy(zero_copy_only=False)
    norms = np.linalg.norm(flat.reshape(table.num_rows, int(lengths[0])), axis=1)   # (n,)
    bad = np.flatnonzero(np.abs(norms - 1.0) > 1e-3)
    if bad.size:
        return "embedding", bad.tolist(), f"rows must be L2-normalised (row {bad[0]} has norm {norms[bad[0]]:.4f})"
    return None


PASSAGE_EMBEDDINGS = Contract(
    name="passage_embeddings",
    filename="passage_embeddings.parquet",
    schema=pa.schema([
        pa.field("passage_id", pa.string(), nullable=False),
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("embedding", pa.list_(pa.field("item", pa.float32(), nullable=False)), nullable=False),
    ]),
    unique=("passage_id",),
    checks=(_check_vectors,),
)
