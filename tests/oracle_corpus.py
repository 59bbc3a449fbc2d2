"""A real mini corpus shared by the funnel tests: the NQ-open oracle file's gold Wikipedia
passages, 3 articles per cluster, with BM25 over the clusters."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa

from data_contracts.funnel import ATTENTION_SCORES, CANDIDATES, LABELS, QUESTIONS, UNIT_POOL, UNITS
from funnelrag.datasets import resolve
from tasks.corpus.index import BM25Index
from tasks.funnel.labels import LabelConfig, make_labels


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


def funnel_stage_dirs(cs, questions: pa.Table, root: Path, top_k: int = 0) -> tuple[Path, Path]:
    """A candidates stage directory of ``cs`` (a :class:`tasks.funnel.candidates.CandidateSet` of
    ``questions``) and its L2G labels with every attention score 0 (answer labels, plus the first
    ``top_k`` units), under ``root``: ``(candidates dir, labels dir)``."""
    cand_dir, label_dir = root / "cands", root / "labels"
    for contract, table in ((CANDIDATES, cs.candidates), (UNITS, cs.units), (QUESTIONS, questions),
                            (UNIT_POOL, cs.unit_pool)):
        contract.write(table, cand_dir)
    c = cs.candidates
    zero = pa.table({"question_id": c["question_id"], "unit_id": c["unit_id"], "passage_id": c["passage_id"],
                     "score": pa.array([0.0] * c.num_rows, pa.float32()), "attention": pa.array(["none"] * c.num_rows)})
    LABELS.write(make_labels(zero.cast(ATTENTION_SCORES.schema), c, LabelConfig(top_k=top_k)), label_dir)
    return cand_dir, label_dir
