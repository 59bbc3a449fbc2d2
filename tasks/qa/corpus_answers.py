"""Answerability of many questions against a whole corpus in one pass: which questions have an
answer (DPR ``has_answer``) in some passage.

DPR's ``has_answer`` tokenizes a passage (NFD, its ``SimpleTokenizer``, lower-cased tokens) and
looks for an answer's tokens as a contiguous sequence. Tokenizing every passage of a corpus
in Python costs ~1 ms a passage; this module tokenizes only the passages that can hold an answer:

1. **Filter** (C speed, a superset of the true hits): every passage becomes ``NFD(text).lower()``
   (per character, so a DPR token of the passage, lower-cased, is a substring of it; the one
   context-dependent mapping, Greek final sigma, is folded to ``σ`` on both sides). One
   Aho-Corasick automaton (``pyahocorasick``) holds, for every answer alias of every question,

   * a one-token alias: the token, kept where the characters around it are not ASCII letters
     or digits (a DPR word token is a maximal run of letters, digits and marks, so a true
     occurrence is never flanked by one);
   * a longer alias: its tokens concatenated, looked up in the same text with every separator
     (Unicode ``Z`` and ``C`` characters, the ones DPR's tokenizer skips) removed; between two
     tokens of a passage there are only separators, so a true occurrence is a substring there.

2. **Check** (exact): a passage the filter kept for an alias is tokenized by
   :func:`tasks.qa.questions.dpr_tokens` and the alias's tokens looked up as a sequence, the test
   of :class:`tasks.qa.questions.AnswerMatcher`; the first passage that holds it settles the
   alias, which then leaves the automaton (rebuilt between chunks of passages).

So the decisions are DPR ``has_answer``'s (``tests/test_corpus_answers.py`` compares both on every
shipped question set over real passages). An answer with no tokens is ignored, as
:class:`tasks.qa.questions.AnswerMatcher` does.
"""
from __future__ import annotations

import bisect
import unicodedata
from typing import Iterable, Sequence

import ahocorasick
import regex

from funnelrag.progress import Progress
from tasks.qa.questions import AnswerMatcher, dpr_tokens

_SEPARATORS = regex.compile(r"[\p{Z}\p{C}]+")                    # what DPR's tokenizer skips
_WORD_RUN = regex.compile(r"[\p{L}\p{N}\p{M}]+", flags=regex.IGNORECASE | regex.UNICODE)   # a DPR word token
_ASCII_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
CHUNK_PASSAGES = 4096


def _fold(text: str) -> str:
    """``NFD(text).lower()`` with the final sigma folded (``ς`` → ``σ``)."""
    out = unicodedata.normalize("NFD", text).lower()
    return out.replace("ς", "σ") if "ς" in out else out


def _squeeze(folded: str) -> str:
    """``folded`` without the characters DPR's tokenizer skips (Unicode ``Z`` and ``C``)."""
    out = "".join(folded.split())               # every str.isspace character is a Z or C one
    # what is left is printable (no Z or C character: isprintable() is False for all of them but
    # the space, which split removed), or the rare text with a format or control character
    return out if out.isprintable() else _SEPARATORS.sub("", out)


class _Aliases:
    """Every distinct answer alias (a DPR token sequence) of the questions, with its filter key."""

    def __init__(self, answer_lists: Sequence[Sequence[str]]):
        index: dict[tuple[str, ...], int] = {}
        self.of_question = [[index.setdefault(t, len(index)) for t in AnswerMatcher(answers).answers]
                            for answers in answer_lists]
        self.tokens = list(index)
        self.needles = [" " + " ".join(t) + " " for t in self.tokens]
        self.keys = ["".join(t).replace("ς", "σ") for t in self.tokens]
        self.found = [False] * len(self.tokens)

    def automata(self) -> tuple["ahocorasick.Automaton | None", "ahocorasick.Automaton | None"]:
        """Automata of the open aliases' keys, one-token and longer: value ``(key length, whether the
        key is a word token, alias ids)``; ``None`` where no such alias is open."""
        grouped: tuple[dict[str, list[int]], dict[str, list[int]]] = ({}, {})
        for a, done in enumerate(self.found):
            if not done:
                grouped[len(self.tokens[a]) > 1].setdefault(self.keys[a], []).append(a)
        out = []
        for keys in grouped:
            auto = None
            if keys:
                auto = ahocorasick.Automaton()
                for key, ids in keys.items():
                    auto.add_word(key, (len(key), _WORD_RUN.fullmatch(key) is not None, ids))
                auto.make_automaton()
            out.append(auto)
        return out[0], out[1]


def _hits(auto, texts: list[str], one_token: bool) -> dict[int, list[int]]:
    """``{alias id: passages (positions in texts, ascending) that the filter keeps}``."""
    if auto is None:
        return {}
    starts, pos = [], 0
    for t in texts:
        starts.append(pos)
        pos += len(t) + 1
    blob = "\n".join(texts)       # no key holds a newline: no match spans two passages
    out: dict[int, set[int]] = {}
    for end, (n, word, ids) in auto.iter(blob):
        if one_token and word and ((end - n >= 0 and blob[end - n] in _ASCII_WORD)
                          or (end + 1 < len(blob) and blob[end + 1] in _ASCII_WORD)):
            continue
        p = bisect.bisect_right(starts, end - n + 1) - 1
        for a in ids:
            out.setdefault(a, set()).add(p)
    return {a: sorted(ps) for a, ps in out.items()}


def corpus_has_answers(texts: Iterable[str], answer_lists: Sequence[Sequence[str]], n_texts: int | None = None,
                       chunk: int = CHUNK_PASSAGES) -> list[bool]:
    """Whether some passage of ``texts`` holds one of each question's answers (DPR ``has_answer``).

    Parameters
    ----------
    texts : the corpus's passage texts, read once in order (a list or any iterable).
    answer_lists : ``n_questions`` lists of answer aliases.
    n_texts : how many texts (for the progress line's total; ``len(texts)`` when it has one).
    chunk : passages filtered together (the automaton drops settled aliases between chunks).

    Returns
    -------
    list of bool, ``(n_questions,)``: ``any(has_answer(answers, t) for t in texts)`` per question;
    False for a question without an answer that has tokens.

    Notes
    -----
    Source: DPR ``has_answer`` (Karpukhin et al. 2020, ``dpr/data/qa_validation.py``, match type
    ``string``), with a multi-pattern (Aho-Corasick) filter in front of it (module docstring).
    Cost: the folded and squeezed copies of one chunk, one automaton pass over each, and a DPR
    tokenization of each passage the filter keeps for an alias still open.
    """
    aliases = _Aliases(answer_lists)
    total = n_texts if n_texts is not None else (len(texts) if hasattr(texts, "__len__") else None)
    bar = Progress("answerability: passages searched for the answers", total=total, unit="passages")
    one, longer = aliases.automata()
    batch: list[str] = []

    def settle(batch: list[str]) -> bool:
        nonlocal one, longer
        folded = [_fold(t) for t in batch]
        hits = _hits(one, folded, True)
        hits.update(_hits(longer, [_squeeze(f) for f in folded], False))
        tokens: dict[int, str] = {}
        changed = False
        for a, passages in hits.items():
            for p in passages:
                if p not in tokens:
                    tokens[p] = " " + " ".join(dpr_tokens(batch[p])) + " "
                if aliases.needles[a] in tokens[p]:
                    aliases.found[a] = changed = True
                    break
        if changed:
            one, longer = aliases.automata()
        return one is None and longer is None

    with bar:
        for text in texts:
            batch.append(text)
            if len(batch) == chunk:
                done = settle(batch)
                bar.update(len(batch))
                batch = []
                if done:
                    break
        if batch:
            settle(batch)
            bar.update(len(batch))
    return [any(aliases.found[a] for a in ids) for ids in aliases.of_question]
