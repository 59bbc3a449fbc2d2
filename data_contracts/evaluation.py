"""Contracts of the evaluation flow: FunnelRAG Tables 2, 3, 9 and 11–13.

One evaluation run compares retrieval *settings* (flat BM25 / dense, each with or without
re-ranking; progressive clusters → document units → passages, with or without the FiD
post-ranker) on one question set, over two *subsets* of it: ``all`` questions and
``answer_in_corpus`` (questions with an answer string, DPR ``has_answer``, in some passage of
the corpus). Ids are those of :mod:`data_contracts.corpus` and :mod:`data_contracts.funnel`.

Timing columns are wall-clock seconds and differ between runs; every other column is a
deterministic function of the inputs and the configuration.
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.base import Contract

SUBSETS = ("all", "answer_in_corpus")
UNITS = ("p", "c", "d")  # passages, clusters, document units (the paper's table notation)


def _check_in(column: str, allowed: tuple[str, ...]):
    def check(table: pa.Table):
        bad = pc.invert(pc.is_in(table[column], value_set=pa.array(allowed)))
        if pc.any(bad).as_py():
            rows = [i for i, v in enumerate(bad.to_pylist()) if v]
            return column, rows, f"{column} must be one of {allowed}"
        return None
    return check


def _check_fraction(*columns: str):
    def check(table: pa.Table):
        for column in columns:
            col = table[column]
            bad = pc.fill_null(pc.or_(pc.less(col, 0.0), pc.greater(col, 1.0)), False)
            if pc.any(bad).as_py():
                rows = [i for i, v in enumerate(bad.to_pylist()) if v]
                return column, rows, f"{column} must lie in [0, 1]"
        return None
    return check


EVAL_RESULTS = Contract(
    name="evaluation_results",
    filename="results.evaluation.parquet",
    schema=pa.schema([
        pa.field("setting", pa.string(), nullable=False),        # e.g. prog-80c-8d-minilm-fid-4p
        pa.field("path", pa.string(), nullable=False),           # flat | progressive
        pa.field("retriever", pa.string(), nullable=False),      # bm25 | dense | bm25-clusters
        pa.field("preranker", pa.string(), nullable=False),      # model label, "" = none
        pa.field("postranker", pa.string(), nullable=False),     # reader label, "" = none
        pa.field("funnel", pa.string(), nullable=False),         # "4.6Kc→80c→8d→4p"
        pa.field("subset", pa.string(), nullable=False),         # all | answer_in_corpus
        pa.field("n_questions", pa.int32(), nullable=False),
        pa.field("ar_1", pa.float64(), nullable=False),          # answer recall of the top-1 passage
        pa.field("ar_2", pa.float64(), nullable=False),
        pa.field("ar_3", pa.float64(), nullable=False),
        pa.field("ar_4", pa.float64(), nullable=False),
        pa.field("ar_candidates", pa.float64(), nullable=False),  # AR of the last stage's input set
        pa.field("entropy_top4", pa.float64(), nullable=False),  # mean title entropy (bits) of the top 4
        pa.field("em", pa.float64(), nullable=True),             # reader exact match; null = no reader
        pa.field("seconds_per_query", pa.float64(), nullable=False),  # sum of the retrieval stages
        pa.field("generation_seconds_per_query", pa.float64(), nullable=True),
    ]),
    unique=("setting", "subset"),
    checks=(_check_in("subset", SUBSETS), _check_in("path", ("flat", "progressive")),
            _check_fraction("ar_1", "ar_2", "ar_3", "ar_4", "ar_candidates", "em")),
)

EVAL_STAGES = Contract(
    name="evaluation_stages",
    filename="stages.evaluation.parquet",
    schema=pa.schema([
        pa.field("setting", pa.string(), nullable=False),
        pa.field("subset", pa.string(), nullable=False),
        pa.field("stage_index", pa.int16(), nullable=False),     # 0 = first stage of the funnel
        pa.field("stage", pa.string(), nullable=False),          # retrieval | chunking | preranking | reranking | postranking
        pa.field("unit", pa.string(), nullable=False),           # p | c | d: what the stage outputs
        pa.field("n_in", pa.int64(), nullable=False),            # candidates entering (mean per query, rounded)
        pa.field("n_out", pa.int64(), nullable=False),           # candidates leaving (mean per query, rounded)
        pa.field("seconds_per_query", pa.float64(), nullable=False),
        pa.field("answer_recall", pa.float64(), nullable=False),  # share of questions with an answer in the output
    ]),
    unique=("setting", "subset", "stage_index"),
    checks=(_check_in("subset", SUBSETS), _check_in("unit", UNITS), _check_fraction("answer_recall")),
)

EVAL_PER_QUESTION = Contract(
    name="evaluation_per_question",
    filename="per_question.evaluation.parquet",
    schema=pa.schema([
        pa.field("setting", pa.string(), nullable=False),
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("answer_in_corpus", pa.bool_(), nullable=False),
        pa.field("passage_ids", pa.list_(pa.string()), nullable=False),  # final ranking, best first
        pa.field("titles", pa.list_(pa.string()), nullable=False),
        pa.field("has_answer", pa.list_(pa.bool_()), nullable=False),    # DPR has_answer per passage
        pa.field("stage_hits", pa.list_(pa.bool_()), nullable=False),    # answer in each stage's output
        pa.field("stage_counts", pa.list_(pa.int32()), nullable=False),  # candidates out of each stage
        pa.field("stage_seconds", pa.list_(pa.float64()), nullable=False),
        pa.field("entropy_top4", pa.float64(), nullable=False),
        pa.field("prediction", pa.string(), nullable=True),              # reader answer; null = no reader
        pa.field("em", pa.bool_(), nullable=True),
    ]),
    unique=("setting", "question_id"),
)

EVALUATION_CONTRACTS = (EVAL_RESULTS, EVAL_STAGES, EVAL_PER_QUESTION)

# Per-question results of any evaluation (the distillation's dev answer recall and reader EM, the
# evaluate flow's settings): one row per (metric, question), long format, so a run's results on
# one question set can be paired with another run's (``funnelrag compare``, the champion gate).
QUESTION_SCORES = Contract(
    name="question_scores",
    filename="question_scores.parquet",
    schema=pa.schema([
        pa.field("metric", pa.string(), nullable=False),       # the run's metric name, e.g. evaluate.after_ar_at_8
        pa.field("question_id", pa.string(), nullable=False),
        pa.field("question", pa.string(), nullable=False),     # the question text ("" when unknown)
        pa.field("value", pa.float64(), nullable=False),       # 0/1 for AR@k and EM
    ]),
    unique=("metric", "question_id"),
)
