"""Open-domain QA questions: loading, answer matching (DPR has_answer, SQuAD EM), train/dev split.

Formats read
------------
``tsv``
    Pyserini/DPR topics (NQ-open ``nq-open-dev.tsv``): ``question TAB ['answer', ...]`` where
    the answers are a Python list literal (parsed with :func:`ast.literal_eval`).
``jsonl``
    One JSON object per line with ``question`` and ``answers`` (plain or ``.gz``); this covers
    the lost-in-the-middle files (``nq-open-oracle.jsonl.gz``), whose ``ctxs`` are ignored.
``dpr-csv``
    DPR's own ``*.qa.csv`` files (as DPR and pyserini ship NQ and TriviaQA): tab-separated
    with CSV quoting (``"[""Sinclair Lewis"", ...]"``), read as DPR does with
    ``csv.reader(delimiter="\t")`` and the answers column parsed as a Python list literal.

Answer matching follows the reference implementations: :func:`has_answer` is DPR's
``has_answer`` with its ``SimpleTokenizer`` (NFD, token-sequence match on lower-cased tokens,
used for answer recall), :func:`exact_match` is the SQuAD v1.1 evaluation script's EM.
"""
from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import json
import logging
import re
import string
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import pyarrow as pa
import regex

from data_contracts.funnel import QUESTIONS

log = logging.getLogger(__name__)

# DPR SimpleTokenizer: runs of letters/numbers/combining marks, or any single non-space,
# non-control character (dpr/utils/tokenizers.py, ALPHA_NUM and NON_WS).
_DPR_TOKEN = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                           flags=regex.IGNORECASE | regex.UNICODE | regex.MULTILINE)
_ARTICLES = re.compile(r"\b(a|an|the)\b", flags=re.UNICODE)
_PUNCT = frozenset(string.punctuation)


# ---------------------------------------------------------------------------- answer matching
def dpr_tokens(text: str) -> list[str]:
    """DPR ``SimpleTokenizer`` words of ``text`` after NFD normalisation, lower-cased.

    Source: DPR ``has_answer`` (Karpukhin et al. 2020, ``dpr/data/qa_validation.py``).
    """
    return [m.group().lower() for m in _DPR_TOKEN.finditer(unicodedata.normalize("NFD", text))]


class AnswerMatcher:
    """DPR ``has_answer`` (match_type ``string``) for one question's answers, tokenized once.

    Parameters
    ----------
    answers : sequence of str
        Gold answers. An answer with no tokens (empty or whitespace) is ignored; DPR would
        match it against every text, which would make every passage a positive.
    """

    def __init__(self, answers: Sequence[str]):
        self.answers = [tuple(dpr_tokens(a)) for a in answers]
        self.answers = [a for a in self.answers if a]

    def tokens_match(self, tokens: Sequence[str]) -> bool:
        """Whether any answer occurs as a contiguous token sequence of ``tokens``."""
        for ans in self.answers:
            n = len(ans)
            first = ans[0]
            for i in range(len(tokens) - n + 1):
                if tokens[i] == first and tuple(tokens[i:i + n]) == ans:
                    return True
        return False

    def __call__(self, text: str) -> bool:
        """DPR ``has_answer(answers, text)``: token-sequence match after NFD + lower-casing."""
        return bool(self.answers) and self.tokens_match(dpr_tokens(text))


def has_answer(answers: Sequence[str], text: str) -> bool:
    """DPR ``has_answer``: does ``text`` contain one of ``answers`` as a token sequence.

    Used for answer recall (AR@k) of every retrieval stage.
    """
    return AnswerMatcher(answers)(text)


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lower-case, drop punctuation, articles and extra whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
    """SQuAD exact match of ``prediction`` against any of ``answers`` (after normalisation)."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(a) for a in answers)


# ---------------------------------------------------------------------------- split
def split_of(question: str, seed: int, dev_fraction: float) -> str:
    """``"dev"`` or ``"train"`` from sha256(seed, question text): same text ⇒ same split.

    Raises
    ------
    ValueError
        ``dev_fraction`` outside [0, 1].
    """
    if not 0.0 <= dev_fraction <= 1.0:
        raise ValueError(f"dev_fraction must lie in [0, 1], got {dev_fraction}")
    digest = hashlib.sha256(f"{seed}\x00{question.strip()}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2 ** 64  # uniform in [0, 1)
    return "dev" if u < dev_fraction else "train"


# ---------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class QuestionsConfig:
    """How questions are read and split.

    format : ``"auto"`` (by suffix: ``.tsv`` → tsv, ``.jsonl``/``.jsonl.gz`` → jsonl, ``.csv`` →
        dpr-csv), ``"tsv"``, ``"jsonl"`` or ``"dpr-csv"``.
    dev_fraction : share of questions (by hash) in the ``dev`` split.
    seed : seed of the split hash.
    limit : keep only the first ``limit`` valid records of each file (``None`` = all).
    """

    format: str = "auto"
    dev_fraction: float = 0.2
    seed: int = 0
    limit: int | None = None


@dataclass
class LoadReport:
    """Counts of a load: records read, kept and skipped (reason → count, with examples)."""

    read: int = 0
    kept: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        self.examples.setdefault(reason, where)

    def as_dict(self) -> dict:
        return {"read": self.read, "kept": self.kept, "skipped": dict(sorted(self.skipped.items())),
                "skip_examples": dict(sorted(self.examples.items()))}


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json", ".tsv", ".txt", ".csv", ".qa"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _format_of(path: Path, fmt: str) -> str:
    if fmt != "auto":
        if fmt not in FORMATS:
            raise ValueError(f"unknown questions format {fmt!r} ({' | '.join(FORMATS)} | auto)")
        return fmt
    name = path.name.removesuffix(".gz")
    if name.endswith((".tsv", ".txt")):
        return "tsv"
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".csv"):
        return "dpr-csv"
    raise ValueError(f"{path}: cannot infer the questions format from the file name (.tsv, .jsonl, .qa.csv); "
                     f"set it ({' | '.join(FORMATS)}): evaluate --set questions.format=tsv, "
                     f"distill --set split.format=tsv")


FORMATS = ("tsv", "jsonl", "dpr-csv")


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            yield lineno, line.rstrip("\n")


def _csv_rows(path: Path, delimiter: str | None = None) -> Iterator[tuple[int, list[str]]]:
    """``(line number, row)`` of a DPR ``.qa.csv`` (csv module, CSV quoting); the delimiter is a
    tab (DPR's) unless the first non-blank line has none and is quoted comma-separated (pyserini's
    TriviaQA ``"question","['answer', ...]"``)."""
    if delimiter is None:
        first = next((line for _, line in _lines(path) if line.strip()), "")
        delimiter = "\t" if "\t" in first or not first.startswith('"') else ","
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            for row in reader:
                yield reader.line_num, row
        except csv.Error as exc:
            raise ValueError(f"{path}:{reader.line_num}: not DPR qa.csv ({exc})") from exc


def _parse_dpr_csv(path: Path, lineno: int, row: list[str]) -> tuple[str, list]:
    if len(row) < 2:
        raise ValueError(f"{path}:{lineno}: expected 'question<TAB>[answers]' (DPR qa.csv), found {len(row)} field(s)")
    try:
        answers = ast.literal_eval(row[1].strip())
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"{path}:{lineno}: answers are not a Python list literal ({exc}): {row[1][:80]!r}") from exc
    if not isinstance(answers, list):
        raise ValueError(f"{path}:{lineno}: answers must be a list, got {type(answers).__name__}")
    return row[0], answers


def _parse_tsv(path: Path, lineno: int, line: str) -> tuple[str, list]:
    if "\t" not in line:
        raise ValueError(f"{path}:{lineno}: expected 'question<TAB>[answers]', found no tab")
    question, raw = line.rsplit("\t", 1)
    try:
        answers = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError) as exc:
        raise ValueError(f"{path}:{lineno}: answers are not a Python list literal ({exc}): {raw[:80]!r}") from exc
    if not isinstance(answers, list):
        hint = (" (the record is CSV-quoted, DPR's qa.csv format: set format: dpr-csv, e.g. "
                "evaluate --set questions.format=dpr-csv)" if raw.strip().startswith('"') else "")
        raise ValueError(f"{path}:{lineno}: answers must be a list, got {type(answers).__name__}{hint}")
    return question, answers


def _csv_quoted(path: Path) -> bool:
    """Whether the first non-blank line of a ``.tsv`` is DPR's CSV quoting rather than plain TSV:
    it does not parse as ``question TAB [list]`` but does as a quoted CSV record (tab or comma)."""
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            _parse_tsv(path, lineno, line)
            return False
        except ValueError:
            pass
        for delimiter in ("\t", ","):
            row = next(csv.reader([line], delimiter=delimiter), [])
            try:
                if len(row) >= 2 and isinstance(ast.literal_eval(row[1].strip()), list):
                    return True
            except (ValueError, SyntaxError):
                continue
        return False
    return False


def _parse_jsonl(path: Path, lineno: int, line: str) -> tuple[str, list]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from exc
    if not isinstance(obj, dict) or "question" not in obj or "answers" not in obj:
        raise ValueError(f"{path}:{lineno}: a record needs the keys 'question' and 'answers'")
    answers = obj["answers"]
    if isinstance(answers, str):
        answers = [answers]
    if not isinstance(answers, list):
        raise ValueError(f"{path}:{lineno}: 'answers' must be a list, got {type(answers).__name__}")
    return obj["question"], answers


def read_questions(path: Path, cfg: QuestionsConfig = QuestionsConfig(),
                   report: LoadReport | None = None) -> list[dict]:
    """Records of one QA file as dicts with the :data:`QUESTIONS` columns.

    Blank lines and records with an empty question or no non-empty answer are skipped and
    counted in ``report`` (reason ``blank_line``, ``empty_question``, ``no_answer``).

    Raises
    ------
    ValueError
        A malformed record (no tab, not a list literal, invalid JSON, missing keys); the
        message names the file and 1-based line.
    FileNotFoundError
        ``path`` does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"questions file {path} does not exist")
    fmt = _format_of(path, cfg.format)
    if fmt == "tsv" and cfg.format == "auto" and _csv_quoted(path):
        log.info("questions: %s is CSV-quoted (DPR's qa.csv format); reading it as dpr-csv", path)
        fmt = "dpr-csv"
    parse = {"tsv": _parse_tsv, "jsonl": _parse_jsonl, "dpr-csv": _parse_dpr_csv}[fmt]
    records = _csv_rows(path) if fmt == "dpr-csv" else _lines(path)
    report = report if report is not None else LoadReport()
    stem, rows = _stem(path), []
    for lineno, line in records:
        if cfg.limit is not None and len(rows) >= cfg.limit:
            break
        if not "".join(line).strip():
            report.skip("blank_line", f"{path}:{lineno}")
            continue
        report.read += 1
        question, answers = parse(path, lineno, line)
        question = str(question).strip()
        answers = [str(a).strip() for a in answers if str(a).strip()]
        if not question:
            report.skip("empty_question", f"{path}:{lineno}")
            continue
        if not answers:
            report.skip("no_answer", f"{path}:{lineno}")
            continue
        rows.append({"question_id": f"{stem}:{lineno:06d}", "question": question, "answers": answers,
                     "split": split_of(question, cfg.seed, cfg.dev_fraction), "source": path.name,
                     "record": lineno})
        report.kept += 1
    return rows


def load_questions(paths: Sequence[Path], cfg: QuestionsConfig = QuestionsConfig()) -> tuple[pa.Table, LoadReport]:
    """The contract-checked questions table of one or more QA files, sorted by ``question_id``.

    Returns
    -------
    table : pa.Table
        :data:`data_contracts.funnel.QUESTIONS` rows.
    report : LoadReport
        Records read, kept and skipped (with reasons).

    Raises
    ------
    ValueError
        A malformed record (see :func:`read_questions`), or no question at all (empty files,
        only blank lines or records without answers): the message names the files.
    ContractViolation
        Duplicate question ids (the same file given twice).
    """
    report = LoadReport()
    rows: list[dict] = []
    for path in paths:
        rows.extend(read_questions(Path(path), cfg, report))
    if not rows:
        raise ValueError(f"questions: no question in {', '.join(str(p) for p in paths) or 'no file'} "
                         f"({report.read:,} records read, skipped: {dict(report.skipped) or 'none'}); "
                         "an evaluation or training run needs at least one")
    rows.sort(key=lambda r: r["question_id"])
    cols = {name: [r[name] for r in rows] for name in QUESTIONS.schema.names}
    table = QUESTIONS.validate(pa.table(cols, schema=QUESTIONS.schema))
    if report.skipped:
        log.warning("questions: skipped %s", dict(report.skipped))
    return table, report
