"""A real mini corpus shared by the funnel tests: the NQ-open oracle file's gold Wikipedia
passages, 3 articles per cluster, with BM25 over the clusters."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

from funnelrag.datasets import resolve
from tasks.corpus.index import BM25Index


def oracle_clusters(data_mirror: Path, n_records: int):
    """``(path, clusters, index)``: ``clusters`` maps cluster id → ``[(doc_id, title, text)]`` (3 each),
    ``index`` is BM25 over the clusters' concatenated titles and texts."""
    path = resolve("nq-open-oracle", data_mirror)
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(n_records), fh)]
    docs = [(i, r["ctxs"][0]["title"], r["ctxs"][0]["text"]) for i, r in enumerate(records)]
    clusters = {c: docs[3 * c:3 * c + 3] for c in range(len(docs) // 3)}
    index = BM25Index.build([" ".join(f"{t} {x}" for _, t, x in m) for m in clusters.values()], list(clusters))
    return path, clusters, index
