"""Contracts of the FunnelRAG distillation pipeline (questions → candidates → attention → labels).

Ids: ``question_id`` is ``{source file stem}:{record:06d}`` (record = 1-based line number), so
it is stable across runs and names the input line; ``cluster_id``, ``unit_id`` and
``passage_id`` are the corpus ids (see :mod:`data_contracts.corpus`).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.base import Contract

SPLITS = ("train", "dev")


def _check_split(table: pa.Table):
    bad = pc.invert(pc.is_in(table["split"], value_set=pa.array(SPLITS)))
    if pc.any(bad).as_py():
        rows = [i for i, v in enumerate(bad.to_pylist()) if v]
        return "split", rows, f"split must be one of {SPLITS}"
    return None


def _check_answers(table: pa.Table):
    lengths = pc.list_value_length(table["answers"])
    bad = pc.less(pc.fill_null(lengths, 0), 1)
    if pc.any(bad).as_py():
        rows = [i for i, v in enumerate(bad.to_pylist()) if v]
        return "answers", rows, "every question needs at least one answer"
    return None


def _check_unit_interval(column: str):
    def check(table: pa.Table):
        col = table[column]
        bad = pc.or_(pc.less(col, 0.0), pc.greater(col, 1.0))
        if pc.any(bad).as_py():
            rows = [i for i, v in enumerate(bad.to_pylist()) if v]
            return column, rows, f"{column} must lie in [0, 1]"
        return None
    return check


QUESTIONS = Contract(
    name="questions",
    filename="questions.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),
        pa.field("answers", pa.list_(pa.string()), nullable=False),
        pa.field("split", pa.string(), nullable=False),          # train | dev (hash of question text + seed)
        pa.field("source", pa.string(), nullable=False),         # input file name
        pa.field("record", pa.int32(), nullable=False),          # 1-based line number in the source
    ]),
    unique=("question_id",),
    checks=(_check_split, _check_answers),
)

UNIT_POOL = Contract(
    name="unit_pool",
    filename="unit_pool.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("cluster_rank", pa.int16(), nullable=False),    # 0 = best BM25 cluster
        pa.field("bm25_score", pa.float32(), nullable=False),    # retrieval stage score of the cluster
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("prerank_score", pa.float32(), nullable=False),  # pre-ranker f(q, d) (Eq. 1)
        pa.field("prerank_rank", pa.int16(), nullable=False),     # 0 = best unit of the question
        pa.field("has_answer", pa.bool_(), nullable=False),       # DPR has_answer on the unit text
    ]),
    unique=("question_id", "unit_id"),
)

UNITS = Contract(
    name="units",
    filename="units.parquet",
    schema=pa.schema([
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),            # the ~1K-token document unit
        pa.field("n_passages", pa.int32(), nullable=False),
    ]),
    unique=("unit_id",),
)

CANDIDATES = Contract(
    name="candidates",
    filename="candidates.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("cluster_id", pa.int64(), nullable=False),
        pa.field("bm25_score", pa.float32(), nullable=False),
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("unit_rank", pa.int16(), nullable=False),        # pre-ranker rank, 0..N-1
        pa.field("prerank_score", pa.float32(), nullable=False),
        pa.field("unit_has_answer", pa.bool_(), nullable=False),
        pa.field("passage_id", pa.string(), nullable=False),
        pa.field("passage_position", pa.int16(), nullable=False),  # order inside the unit
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),            # the ~100-word passage
        pa.field("has_answer", pa.bool_(), nullable=False),       # DPR has_answer on the passage
    ]),
    unique=("question_id", "passage_id"),
)

ATTENTION_SCORES = Contract(
    name="attention_scores",
    filename="attention_scores.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("passage_id", pa.string(), nullable=False),
        pa.field("score", pa.float32(), nullable=False),          # Eq. 3 cross-attention score
        pa.field("attention", pa.string(), nullable=False),       # post_softmax (HF eager) | pre_softmax
    ]),
    unique=("question_id", "passage_id"),
)

LABELS = Contract(
    name="labels",
    filename="labels.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("unit_id", pa.string(), nullable=False),
        pa.field("doc_score", pa.float32(), nullable=False),      # Eq. 4 aggregated score
        pa.field("doc_rank", pa.int16(), nullable=False),         # 0 = highest doc_score
        pa.field("has_answer", pa.bool_(), nullable=False),
        pa.field("positive", pa.bool_(), nullable=False),         # in D+ (Eq. 5)
        pa.field("reason", pa.string(), nullable=False),          # answer | top_k | answer+top_k | negative
    ]),
    unique=("question_id", "unit_id"),
)

ANSWER_RECALL = Contract(
    name="answer_recall",
    filename="answer_recall.parquet",
    schema=pa.schema([
        pa.field("model", pa.string(), nullable=False),           # e.g. before | after
        pa.field("k", pa.int16(), nullable=False),
        pa.field("answer_recall", pa.float64(), nullable=False),  # fraction of questions, [0, 1]
        pa.field("n_questions", pa.int32(), nullable=False),
    ]),
    unique=("model", "k"),
    checks=(_check_unit_interval("answer_recall"),),
)

READER_PREDICTIONS = Contract(
    name="reader_predictions",
    filename="reader_predictions.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("prediction", pa.string(), nullable=False),      # greedy FiD answer, special tokens removed
        pa.field("exact_match", pa.bool_(), nullable=False),      # SQuAD EM against any gold answer
        pa.field("n_passages", pa.int16(), nullable=False),       # passages fed to FiD (top of the pre-ranker order)
    ]),
    unique=("question_id",),
)

TRAINING_CONTRACTS = (QUESTIONS, UNIT_POOL, UNITS, CANDIDATES, ATTENTION_SCORES, LABELS, ANSWER_RECALL,
                      READER_PREDICTIONS)
