"""Quality gate before a corpus version becomes ``current``.

A nightly build publishes its version, then compares it with the current one on two figures:

* **answer recall** AR@k (FunnelRAG Tables 2, 11–13; DPR top-k accuracy) of BM25 over the
  version's passages on a fixed question set (cheap: one BM25 search per question);
* the **skipped fraction**: input pages the ingest stage skipped (``ingest_report.status ==
  "skipped"``: invalid bytes, oversize, malformed, ...) over all input pages.

The version becomes current only if AR@k dropped by at most ``max_recall_drop`` and the
skipped fraction rose by at most ``max_skipped_increase``; otherwise it stays published but
not current and :class:`GateRefused` carries the figures. The first version of a corpus has
nothing to compare with and passes.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.corpus import INGEST_REPORT, PASSAGES
from tasks.sources.ingest.config import SKIPPED
from tasks.corpus.sharded.sharded_index import load_passage_index
from tasks.qa.metrics import answer_recall
from tasks.qa.questions import AnswerMatcher

PASSAGE_INDEX = "index/passages.bm25"


@dataclass(frozen=True)
class GateConfig:
    """The gate's question set and tolerances.

    enabled : run the gate (``False``: every published version becomes current, as before).
    questions : registered question sets (:mod:`funnelrag.datasets`), e.g. ``nq-open-dev``.
    paths : further question files (tsv / jsonl / DPR ``.qa.csv``).
    limit : the first ``limit`` valid questions of each source (a fixed set).
    k : AR@k cut-off, in passages.
    max_recall_drop : largest allowed drop of AR@k, absolute (0.02 = two points).
    max_skipped_increase : largest allowed rise of the skipped fraction of input pages, absolute.
    """

    enabled: bool = True
    questions: tuple[str, ...] = ("nq-open-dev",)
    paths: tuple[Path, ...] = ()
    limit: int = 200
    k: int = 20
    max_recall_drop: float = 0.02
    max_skipped_increase: float = 0.05

    def __post_init__(self) -> None:
        if self.k < 1 or self.limit < 1:
            raise ValueError(f"gate: k and limit must be >= 1, got k={self.k}, limit={self.limit}")
        if self.max_recall_drop < 0 or not 0 <= self.max_skipped_increase <= 1:
            raise ValueError("gate: tolerances must be >= 0 (max_skipped_increase at most 1)")

    def input_files(self) -> list[tuple[str, Path, str]]:
        """``(key, path, expected)`` of the question files, checked before a build starts
        (:func:`funnelrag.inputs.check_inputs`)."""
        return [("paths", Path(p), "a questions file (.tsv, .jsonl, .jsonl.gz or DPR .qa.csv)") for p in self.paths]


@dataclass(frozen=True)
class VersionFigures:
    """Gate figures of one corpus version."""

    version: str
    answer_recall: float      # AR@k over the question set, in [0, 1]
    pages: int                # input pages (rows of ingest_report)
    skipped: int              # of which skipped
    documents: int

    @property
    def skipped_fraction(self) -> float:
        return self.skipped / self.pages if self.pages else 0.0


@dataclass(frozen=True)
class GateDecision:
    """The outcome: figures of the candidate and of the current version, and why it failed."""

    passed: bool
    k: int
    candidate: VersionFigures
    current: VersionFigures | None
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        def figs(f: VersionFigures | None) -> dict[str, Any] | None:
            return None if f is None else {**asdict(f), "skipped_fraction": f.skipped_fraction}

        return {"passed": self.passed, "k": self.k, "candidate": figs(self.candidate),
                "current": figs(self.current), "reasons": list(self.reasons)}

    def describe(self) -> str:
        c, cur = self.candidate, self.current
        text = (f"version {c.version}: AR@{self.k} {c.answer_recall:.4f}, skipped {c.skipped:,}/{c.pages:,} pages "
                f"({c.skipped_fraction:.1%}), {c.documents:,} documents")
        if cur is not None:
            text += (f"; current {cur.version}: AR@{self.k} {cur.answer_recall:.4f}, skipped "
                     f"{cur.skipped:,}/{cur.pages:,} pages ({cur.skipped_fraction:.1%}), {cur.documents:,} documents")
        return text + ("" if self.passed else "; refused: " + "; ".join(self.reasons))


class GateRefused(ValueError):
    """The candidate version is published but not made current; the message has the figures."""

    def __init__(self, decision: GateDecision):
        super().__init__(decision.describe())
        self.decision = decision


def version_figures(version_dir: Path, questions: Sequence[tuple[str, Sequence[str]]], k: int) -> VersionFigures:
    """AR@k of BM25 over the version's passages and its ingest skip counts.

    Parameters
    ----------
    version_dir : Path
        A published corpus version (``index/passages.bm25``, one index or shards, ``passages.parquet``,
        ``ingest_report.parquet``, ``documents.parquet`` row count in the manifest).
    questions : ``[(question, answers)]``, ``(n_questions,)``
    k : cut-off in passages.
    """
    report = INGEST_REPORT.read(version_dir, columns=["status"])
    skipped = int(pc.sum(pc.equal(report["status"], SKIPPED)).as_py() or 0)
    passages = PASSAGES.read(version_dir, columns=["passage_id", "text"])
    text_of = dict(zip(passages["passage_id"].to_pylist(), passages["text"].to_pylist()))
    hits: list[list[bool]] = []
    if questions:
        ids, _ = load_passage_index(version_dir / PASSAGE_INDEX).search([q for q, _ in questions], k=k)
        for (_, answers), ranked in zip(questions, ids):
            matcher = AnswerMatcher(answers)
            hits.append([matcher(text_of[pid]) for pid in ranked])

    documents = int(json.loads((version_dir / "manifest.json").read_text())["counts"]["documents"])
    return VersionFigures(version=version_dir.name, answer_recall=answer_recall(hits, [k])[k],
                          pages=report.num_rows, skipped=skipped, documents=documents)


def decide(candidate: VersionFigures, current: VersionFigures | None, cfg: GateConfig) -> GateDecision:
    """Pass or refuse ``candidate`` against ``current`` under the tolerances of ``cfg``."""
    reasons: list[str] = []
    if current is not None:
        drop = current.answer_recall - candidate.answer_recall
        if drop > cfg.max_recall_drop + 1e-12:
            reasons.append(f"AR@{cfg.k} dropped by {drop:.4f} (> {cfg.max_recall_drop:.4f})")
        rise = candidate.skipped_fraction - current.skipped_fraction
        if rise > cfg.max_skipped_increase + 1e-12:
            reasons.append(f"skipped fraction rose by {rise:.1%} (> {cfg.max_skipped_increase:.1%})")
    return GateDecision(passed=not reasons, k=cfg.k, candidate=candidate, current=current, reasons=reasons)


def question_pairs(table: pa.Table) -> list[tuple[str, list[str]]]:
    """``[(question, answers)]`` of a ``QUESTIONS`` table, in row order."""
    return list(zip(table["question"].to_pylist(), table["answers"].to_pylist()))
