"""Multi-hop QA loader for HotpotQA (DR-RAG and R²AG evaluation data).

Two input formats are read, detected per file and per record:

* IRCoT's processed JSON Lines (the mirror's ``hotpotqa/hotpotqa_dev_subsampled.jsonl``): one
  object per line with ``question_id``, ``question_text``, ``answers_objects`` (``spans``,
  ``number``, ``date``) and ``contexts`` (``title``, ``paragraph_text``, ``is_supporting``).
* The original HotpotQA JSON (``hotpot_dev_distractor_v1.json``): a JSON array, or JSON Lines,
  of objects with ``_id``, ``question``, ``answer``, ``context: [[title, [sentences]]]`` and
  ``supporting_facts: [[title, sentence_index]]``. A paragraph's text is its sentences joined
  with one space (as IRCoT built the file above); it is supporting when its title appears in
  ``supporting_facts``.

Records come back as frozen :class:`QARecord` objects in file order. The train/dev split is a
pure function of ``(seed, question_id)`` (:func:`split_train_dev`), so it does not depend on
file order or on which other questions are present.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

log = logging.getLogger(__name__)


class HotpotQAFormatError(ValueError):
    """A HotpotQA record is malformed; the message names the file, the line (JSON Lines) or
    record index (JSON array) and the reason."""

    def __init__(self, path: Path | str, where: str, reason: str):
        self.path, self.where, self.reason = str(path), where, reason
        super().__init__(f"{path} {where}: {reason}")


@dataclass(frozen=True)
class Paragraph:
    """One context paragraph: Wikipedia ``title``, ``text`` and the gold ``is_supporting`` flag."""

    title: str
    text: str
    is_supporting: bool


@dataclass(frozen=True)
class QARecord:
    """One multi-hop question.

    question_id : str, unique within a file.
    question : str
    answers : tuple of str, at least one (gold answer strings).
    paragraphs : tuple of :class:`Paragraph`, in the file's order.
    """

    question_id: str
    question: str
    answers: tuple[str, ...]
    paragraphs: tuple[Paragraph, ...]

    @property
    def supporting(self) -> tuple[Paragraph, ...]:
        """The gold supporting paragraphs (two per HotpotQA question)."""
        return tuple(p for p in self.paragraphs if p.is_supporting)


@dataclass(frozen=True)
class HotpotQAData:
    """Result of :func:`read_hotpotqa`: the valid records and the skipped ones.

    skipped : tuple of ``(where, reason)`` for every record left out (only with
    ``skip_invalid=True``); ``where`` is ``"line N"`` or ``"record N"`` (1-based).
    """

    path: str
    records: tuple[QARecord, ...]
    skipped: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True)
class SplitConfig:
    """Deterministic train/dev split.

    seed : int, mixed into the hash.
    dev_fraction : float in [0, 1], expected share of questions in dev.
    """

    seed: int = 0
    dev_fraction: float = 0.2


# ---------------------------------------------------------------------- parsing
def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"field {name!r} must be a string, found {type(value).__name__}")
    return value


def _parse_ircot(obj: dict) -> QARecord:
    qid = _str(obj["question_id"], "question_id")
    question = _str(obj["question_text"], "question_text")
    answers: list[str] = []
    for ans in obj["answers_objects"]:
        answers.extend(_str(s, "answers_objects.spans") for s in ans.get("spans", []))
        number = ans.get("number", "")
        if number not in ("", None):
            answers.append(str(number))
        date = ans.get("date") or {}
        date_text = " ".join(str(date.get(k, "")) for k in ("day", "month", "year") if date.get(k))
        if date_text:
            answers.append(date_text)
    paragraphs = []
    for i, ctx in enumerate(obj["contexts"]):
        flag = ctx.get("is_supporting", False)
        if not isinstance(flag, bool):
            raise ValueError(f"contexts[{i}].is_supporting must be a boolean, found {flag!r}")
        paragraphs.append(Paragraph(_str(ctx["title"], f"contexts[{i}].title"),
                                    _str(ctx["paragraph_text"], f"contexts[{i}].paragraph_text"), flag))
    return QARecord(qid, question, tuple(answers), tuple(paragraphs))


def _parse_original(obj: dict) -> QARecord:
    qid = _str(obj["_id"], "_id")
    question = _str(obj["question"], "question")
    answer = _str(obj["answer"], "answer")
    support_titles = {_str(fact[0], "supporting_facts[][0]") for fact in obj.get("supporting_facts", [])}
    paragraphs = []
    for i, item in enumerate(obj["context"]):
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], list)):
            raise ValueError(f"context[{i}] must be [title, [sentences]]")
        title = _str(item[0], f"context[{i}][0]")
        text = " ".join(_str(s, f"context[{i}][1][]") for s in item[1])
        paragraphs.append(Paragraph(title, text, title in support_titles))
    return QARecord(qid, question, (answer,), tuple(paragraphs))


def parse_record(obj: Any) -> QARecord:
    """Parse one record of either format (see module docstring).

    Raises
    ------
    ValueError
        Not an object, missing fields, wrong types, no answer or no paragraph.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"record must be a JSON object, found {type(obj).__name__}")
    try:
        if "question_id" in obj:
            rec = _parse_ircot(obj)
        elif "_id" in obj:
            rec = _parse_original(obj)
        else:
            raise ValueError("neither 'question_id' (IRCoT format) nor '_id' (original HotpotQA) present")
    except KeyError as exc:
        raise ValueError(f"missing field {exc.args[0]!r}") from None
    except (TypeError, AttributeError) as exc:
        raise ValueError(f"malformed record: {exc}") from None
    if not rec.question.strip():
        raise ValueError("empty question")
    if not rec.answers:
        raise ValueError("no answer")
    if not rec.paragraphs:
        raise ValueError("no context paragraph")
    return rec


def _iter_objects(path: Path):
    """Yield ``(where, obj_or_exception)`` for a JSON array or JSON Lines file."""
    with open(path, encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith("["):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise HotpotQAFormatError(path, f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
        for i, obj in enumerate(data, start=1):
            yield f"record {i}", obj
        return
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                yield f"line {lineno}", json.loads(line)
            except json.JSONDecodeError as exc:
                yield f"line {lineno}", ValueError(f"invalid JSON: {exc.msg} (column {exc.colno})")


def read_hotpotqa(path: Path | str, skip_invalid: bool = False) -> HotpotQAData:
    """Read a HotpotQA file (IRCoT JSON Lines or original JSON array / JSON Lines).

    Parameters
    ----------
    path : path of the file.
    skip_invalid : if True, malformed records (and repeated question ids) are left out and
        listed in ``HotpotQAData.skipped``, with a warning logged; if False the first one raises.

    Returns
    -------
    HotpotQAData
        ``records`` in file order.

    Raises
    ------
    FileNotFoundError
        ``path`` does not exist.
    HotpotQAFormatError
        A malformed record or a repeated ``question_id`` (names file, line/record and reason),
        unless ``skip_invalid``; or a JSON array file that does not parse.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"HotpotQA file not found: {path}")
    records: list[QARecord] = []
    skipped: list[tuple[str, str]] = []
    seen: dict[str, str] = {}
    for where, obj in _iter_objects(path):
        try:
            if isinstance(obj, Exception):
                raise obj
            rec = parse_record(obj)
            if rec.question_id in seen:
                raise ValueError(f"question_id {rec.question_id!r} repeats (first at {seen[rec.question_id]})")
        except ValueError as exc:
            if not skip_invalid:
                raise HotpotQAFormatError(path, where, str(exc)) from None
            skipped.append((where, str(exc)))
            continue
        seen[rec.question_id] = where
        records.append(rec)
    if skipped:
        log.warning("%s: skipped %d malformed record(s), first at %s: %s", path, len(skipped), *skipped[0])
    return HotpotQAData(str(path), tuple(records), tuple(skipped))


def load_hotpotqa(path: Path | str) -> list[QARecord]:
    """Strictly read all records of ``path`` (see :func:`read_hotpotqa`; raises on bad input)."""
    return list(read_hotpotqa(path).records)


# ---------------------------------------------------------------------- split
def split_unit(seed: int, question_id: str) -> float:
    """A number in [0, 1) from sha256 of ``f"{seed}:{question_id}"`` (first 8 bytes)."""
    digest = hashlib.sha256(f"{seed}:{question_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_train_dev(records: Sequence[QARecord], cfg: SplitConfig = SplitConfig()) -> tuple[list[QARecord], list[QARecord]]:
    """Deterministic train/dev split: a record goes to dev iff
    ``split_unit(cfg.seed, question_id) < cfg.dev_fraction``.

    Each record's side depends only on ``(seed, question_id)``; both lists keep input order.

    Raises
    ------
    ValueError
        ``dev_fraction`` outside [0, 1].
    """
    if not 0.0 <= cfg.dev_fraction <= 1.0:
        raise ValueError(f"dev_fraction must be in [0, 1], got {cfg.dev_fraction}")
    train, dev = [], []
    for rec in records:
        (dev if split_unit(cfg.seed, rec.question_id) < cfg.dev_fraction else train).append(rec)
    return train, dev
