"""A small stage-cache-shaped sample for launched-training tests and the GPU check.

:func:`write_candidates` turns the first ``n_questions`` NQ-open oracle records (question,
answers, one gold Wikipedia passage each) into a ``candidates`` stage directory
(``questions``, ``candidates``, ``units`` tables, :mod:`data_contracts.funnel`): every question
gets ``n_passages`` candidate passages, its gold one at position ``i % n_passages`` and the gold
passages of the following questions as distractors; each passage is its own unit. No corpus
build, no BM25, no pre-ranker: the reader, Eq. 3 scoring, the labels and BPR run on it as on a
real funnel's output.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa

from data_contracts.funnel import CANDIDATES, QUESTIONS, UNITS


def read_oracle(path: Path, n: int) -> list[dict]:
    """The first ``n`` records of ``nq-open-oracle.jsonl.gz`` (or a plain ``.jsonl`` copy)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    out = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line in fh:
            if len(out) >= n:
                break
            out.append(json.loads(line))
    return out


def write_candidates(records: list[dict], n_passages: int, out_dir: Path) -> Path:
    """Write the candidates stage directory of ``records`` into ``out_dir``; returns it."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(records)
    if n < n_passages:
        raise ValueError(f"{n} records cannot give {n_passages} distinct passages per question")
    qids = [f"oracle:{i + 1:06d}" for i in range(n)]
    questions = pa.table({"question_id": qids, "question": [r["question"] for r in records],
                          "answers": [list(r["answers"]) for r in records], "split": ["train"] * n,
                          "source": ["nq-open-oracle.jsonl.gz"] * n,
                          "record": pa.array(range(1, n + 1), pa.int32())}, schema=QUESTIONS.schema)
    rows: dict[str, list] = {f.name: [] for f in CANDIDATES.schema}
    for i, qid in enumerate(qids):
        gold_at = i % n_passages
        others = [(i + k) % n for k in range(1, n_passages)]
        order = others[:gold_at] + [i] + others[gold_at:]
        for rank, j in enumerate(order):
            ctx = records[j]["ctxs"][0]
            for name, value in (("question_id", qid), ("cluster_id", j), ("bm25_score", 1.0), ("unit_id", f"u{j:06d}"),
                                ("unit_rank", rank), ("prerank_score", float(n_passages - rank)),
                                ("unit_has_answer", j == i), ("passage_id", f"p{j:06d}"), ("passage_position", 0),
                                ("title", ctx["title"]), ("text", ctx["text"]), ("has_answer", j == i)):
                rows[name].append(value)
    units = pa.table({"unit_id": [f"u{j:06d}" for j in range(n)], "cluster_id": pa.array(range(n), pa.int32()),
                      "title": [r["ctxs"][0]["title"] for r in records], "text": [r["ctxs"][0]["text"] for r in records],
                      "n_passages": pa.array([1] * n, pa.int32())}, schema=UNITS.schema)
    QUESTIONS.write(questions, out_dir)
    CANDIDATES.write(pa.table(rows, schema=CANDIDATES.schema), out_dir)
    UNITS.write(units, out_dir)
    return out_dir
