"""The paragraph collection DR-RAG retrieves from: every context paragraph of the question set,
de-duplicated by ``(title, text)``, with the gold supporting paragraphs of each question.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import pyarrow as pa

from tasks.dr_rag.hotpotqa import QARecord


def paragraph_id(title: str, text: str) -> str:
    """Content id ``"p" + sha256(title + "\\x1f" + text)[:16]`` (16 hex digits)."""
    return "p" + hashlib.sha256(f"{title}\x1f{text}".encode()).hexdigest()[:16]


def paragraph_text(title: str, text: str) -> str:
    """The text a retriever and the classifier see for one paragraph: ``"title: text"``."""
    return f"{title}: {text}"


@dataclass(frozen=True)
class Question:
    """One evaluation or training question over the collection.

    supporting : ids of its gold supporting paragraphs (file order, no repeats).
    candidates : ids of all its context paragraphs (file order, no repeats).
    """

    question_id: str
    question: str
    supporting: tuple[str, ...]
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class ParagraphCollection:
    """De-duplicated paragraphs sorted by id: ``ids[i]``, ``titles[i]``, ``texts[i]`` describe row ``i``."""

    ids: tuple[str, ...]
    titles: tuple[str, ...]
    texts: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.ids)

    def row(self) -> dict[str, int]:
        """Map paragraph id → row."""
        return {pid: i for i, pid in enumerate(self.ids)}

    def retrieval_texts(self) -> list[str]:
        """``"title: text"`` per row (what BM25 and the bi-encoder index)."""
        return [paragraph_text(t, x) for t, x in zip(self.titles, self.texts)]

    def to_table(self) -> pa.Table:
        return pa.table({"paragraph_id": list(self.ids), "title": list(self.titles), "text": list(self.texts)})

    @classmethod
    def from_table(cls, table: pa.Table) -> "ParagraphCollection":
        return cls(tuple(table.column("paragraph_id").to_pylist()), tuple(table.column("title").to_pylist()),
                   tuple(table.column("text").to_pylist()))


def build_collection(records: Iterable[QARecord]) -> tuple[ParagraphCollection, list[Question]]:
    """Collect every paragraph of ``records``, de-duplicated by ``(title, text)``.

    Parameters
    ----------
    records : the questions (all splits: the collection is shared by train and dev, as the
        paper retrieves from one knowledge base).

    Returns
    -------
    collection : :class:`ParagraphCollection`, rows sorted by ``paragraph_id``.
    questions : one :class:`Question` per record, in input order. A paragraph repeated within
        one question appears once; it is supporting if any of its copies is.

    Raises
    ------
    ValueError
        Two different ``(title, text)`` pairs hash to the same id (a sha256 prefix collision).
    """
    content: dict[str, tuple[str, str]] = {}
    questions: list[Question] = []
    for rec in records:
        cands: dict[str, bool] = {}
        for p in rec.paragraphs:
            pid = paragraph_id(p.title, p.text)
            seen = content.setdefault(pid, (p.title, p.text))
            if seen != (p.title, p.text):
                raise ValueError(f"paragraph id collision {pid}: {seen[0]!r} vs {p.title!r}")
            cands[pid] = cands.get(pid, False) or p.is_supporting
        questions.append(Question(rec.question_id, rec.question,
                                  tuple(pid for pid, sup in cands.items() if sup), tuple(cands)))
    ids = sorted(content)
    coll = ParagraphCollection(tuple(ids), tuple(content[i][0] for i in ids), tuple(content[i][1] for i in ids))
    return coll, questions


def qrels_table(questions: Sequence[Question], split_of: dict[str, str]) -> pa.Table:
    """Rows ``(question_id, split, paragraph_id, is_supporting)`` for :data:`data_contracts.dr_rag.QRELS`."""
    rows = [(q.question_id, split_of[q.question_id], pid, pid in set(q.supporting))
            for q in questions for pid in q.candidates]
    return pa.table({"question_id": [r[0] for r in rows], "split": [r[1] for r in rows],
                     "paragraph_id": [r[2] for r in rows], "is_supporting": [r[3] for r in rows]})
