"""Contracts of DR-RAG (Hei et al. 2024): paragraph collection, classifier pairs, selections, Table 5.

Ids: ``paragraph_id`` is ``"p" + sha256(title + "\\x1f" + text)[:16]`` (content-derived, so the same
paragraph gets the same id in every run and in every question that contains it); the collection
is sorted by ``paragraph_id``.
"""
from __future__ import annotations

import pyarrow as pa

from data_contracts.base import Contract, binary_labels


def _ranks_from_one(table: pa.Table):
    rows = [i for i, v in enumerate(table.column("rank").to_pylist()) if v < 1]
    return ("rank", rows, "rank is 1-based") if rows else None


PARAGRAPHS = Contract(
    name="dr_rag_paragraphs",
    filename="paragraphs.hotpotqa.parquet",
    schema=pa.schema([
        pa.field("paragraph_id", pa.string(), nullable=False),
        pa.field("title", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
    ]),
    unique=("paragraph_id",),
)

HOTPOTQA_QUESTIONS = Contract(
    name="dr_rag_questions",
    filename="questions.hotpotqa.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),          # train | dev
        pa.field("question", pa.string(), nullable=False),
        pa.field("answers", pa.list_(pa.string()), nullable=False),
    ]),
    unique=("question_id",),
)

QRELS = Contract(
    name="dr_rag_qrels",
    filename="qrels.hotpotqa.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),          # train | dev
        pa.field("paragraph_id", pa.string(), nullable=False),
        pa.field("is_supporting", pa.bool_(), nullable=False),
    ]),
    unique=("question_id", "paragraph_id"),
)

EMBEDDINGS = Contract(
    name="dr_rag_embeddings",
    filename="paragraph_embeddings.sm.parquet",
    schema=pa.schema([
        pa.field("paragraph_id", pa.string(), nullable=False),
        pa.field("embedding", pa.list_(pa.float32()), nullable=False),  # (dim,), L2-normalised
    ]),
    unique=("paragraph_id",),
)

RANKINGS = Contract(
    name="dr_rag_rankings",
    filename="rankings.dev.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("retriever", pa.string(), nullable=False),      # bm25 | sm
        pa.field("parent_id", pa.string(), nullable=True),       # null: ranking of q; else of q ⊕ parent (QDC)
        pa.field("rank", pa.int16(), nullable=False),            # 1-based
        pa.field("paragraph_id", pa.string(), nullable=False),
    ]),
    checks=(_ranks_from_one,),
)

CLASSIFIER_PAIRS = Contract(
    name="dr_rag_classifier_pairs",
    filename="classifier_pairs.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),          # train | dev (dev pairs: the gate metric)
        pa.field("d1_id", pa.string(), nullable=False),
        pa.field("d2_id", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),           # sup_sup | sup_non | non_non (Appendix A.1)
        pa.field("label", pa.int8(), nullable=False),            # 1 = the two together help answer q
    ]),
    unique=("question_id", "d1_id", "d2_id"),
    checks=(binary_labels,),
)

SELECTIONS = Contract(
    name="dr_rag_selections",
    filename="selections.dev.parquet",
    schema=pa.schema([
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),         # bm25 | sm | qdc | cis | cfs
        pa.field("k", pa.int16(), nullable=False),               # the top-k budget
        pa.field("rank", pa.int16(), nullable=False),            # 1-based position in the kept list
        pa.field("paragraph_id", pa.string(), nullable=False),
        pa.field("stage", pa.int8(), nullable=False),            # 1 = first retrieval, 2 = QDC retrieval
        pa.field("parent_id", pa.string(), nullable=True),       # the first-stage d* whose q ⊕ d* found it
        pa.field("classifier_prob", pa.float32(), nullable=True),  # P(C(q, anchor, d) = 1) where judged
        pa.field("is_supporting", pa.bool_(), nullable=False),
    ]),
    unique=("question_id", "method", "k", "rank"),
    checks=(_ranks_from_one,),
)

TABLE5 = Contract(
    name="dr_rag_table5",
    filename="table5.dev.parquet",
    schema=pa.schema([
        pa.field("method", pa.string(), nullable=False),
        pa.field("k", pa.int16(), nullable=False),
        pa.field("recall", pa.float64(), nullable=False),        # mean share of supporting paragraphs kept
        pa.field("all_supporting", pa.float64(), nullable=False),  # share of questions with both kept
        pa.field("mean_docs", pa.float64(), nullable=False),     # actual number of documents kept
        pa.field("n_questions", pa.int32(), nullable=False),
    ]),
    unique=("method", "k"),
)

ALL = (PARAGRAPHS, HOTPOTQA_QUESTIONS, QRELS, EMBEDDINGS, RANKINGS, CLASSIFIER_PAIRS, SELECTIONS, TABLE5)
