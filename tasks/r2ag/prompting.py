"""R²AG prompt construction with one ``<R>`` placeholder per document (Appendix B, Table 5).

The prompt is tokenized piece by piece and the ``<R>`` id is inserted directly, so the number of
placeholders is exactly the number of documents whatever the document texts contain (a literal
"<R>" inside a document is split into ordinary tokens). When the prompt is longer than
``max_length`` tokens, document texts are truncated (longest first, so short documents stay
whole); the instruction, the question, the answer and every placeholder are never dropped. If they
alone do not fit, :class:`PromptTooLong` is raised.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from models.r2ag_generator import R_TOKEN

IGNORE_INDEX = -100

INSTRUCTION = ("Write a high-quality answer for the given question using only the provided search "
               "results (some of which might be irrelevant). Only give me the answer and do not output "
               "any other words. The similarity information is provided in front of search results.")
SUFFIX = "Only give me the answer and do not output any other words.\nQuestion: {question}\nAnswer:"


class PromptTooLong(ValueError):
    """The fixed parts of a prompt (instruction, placeholders, question, answer) exceed max_length."""


@dataclass(frozen=True)
class PromptConfig:
    """Prompt template (Table 5, R²AG row) and length limit.

    max_length : tokens of the whole sequence (prompt + answer + EOS when an answer is given).
    instruction : text before the documents.
    doc_prefix : text before document i's placeholder; ``{i}`` is the 1-based rank.
    suffix : text after the documents; ``{question}`` is filled in.
    include_title : write documents as ``"title: text"``.
    """

    max_length: int = 1024
    instruction: str = INSTRUCTION
    doc_prefix: str = "\n[{i}]similarity: "
    suffix: str = "\n" + SUFFIX
    include_title: bool = True


@dataclass(frozen=True)
class PromptEncoding:
    """One tokenized prompt.

    input_ids : token ids, prompt followed by the answer and EOS when an answer was given.
    labels : same length; ``IGNORE_INDEX`` on the prompt, the answer ids (+ EOS) after it.
    r_positions : index in ``input_ids`` of each document's placeholder, in document order.
    doc_tokens : document tokens kept per document.
    truncated_tokens : document tokens removed to fit ``max_length``.
    """

    input_ids: tuple[int, ...]
    labels: tuple[int, ...]
    r_positions: tuple[int, ...]
    doc_tokens: tuple[int, ...]
    truncated_tokens: int


def add_r_token(tokenizer, token: str = R_TOKEN) -> int:
    """Register ``token`` as an additional special token of ``tokenizer`` (in place); its id.

    Idempotent. The generator's vocabulary must then have ``len(tokenizer)`` rows.
    """
    if token not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": [token]})
    return tokenizer.convert_tokens_to_ids(token)


def _tokens(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]


def fit_lengths(lengths: Sequence[int], budget: int) -> list[int]:
    """Longest-first truncation: kept tokens per document so that the total is ``<= budget``.

    Finds the largest cap ``c`` with ``sum(min(L_i, c)) <= budget`` and gives the remaining tokens,
    one each, to the earliest-ranked documents longer than ``c``. Deterministic; no document gets
    fewer than ``min(L_i, c)`` tokens.

    Raises
    ------
    ValueError
        ``budget`` < 0.
    """
    if budget < 0:
        raise ValueError(f"negative token budget {budget}")
    if sum(lengths) <= budget:
        return list(lengths)
    lo, hi = 0, max(lengths)
    while lo < hi:  # largest c with sum(min(L, c)) <= budget
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in lengths) <= budget:
            lo = mid
        else:
            hi = mid - 1
    kept = [min(n, lo) for n in lengths]
    spare = budget - sum(kept)
    for i, n in enumerate(lengths):
        if spare == 0:
            break
        if n > kept[i]:
            kept[i] += 1
            spare -= 1
    return kept


def encode_prompt(question: str, documents: Sequence[tuple[str, str]], tokenizer, r_token_id: int,
                  cfg: PromptConfig = PromptConfig(), answer: str | None = None,
                  query_id: str = "?") -> PromptEncoding:
    """Tokenize the R²AG prompt of one question and its ranked documents.

    Parameters
    ----------
    question : the query.
    documents : ``(title, text)`` per document, in retriever order (one ``<R>`` each).
    tokenizer : a ``transformers`` tokenizer containing ``<R>`` (see :func:`add_r_token`).
    r_token_id : id of ``<R>``.
    cfg : PromptConfig
    answer : target answer for LM training (appended with EOS), or None at inference.
    query_id : named in errors.

    Returns
    -------
    PromptEncoding
        ``len(r_positions) == len(documents)`` always.

    Raises
    ------
    PromptTooLong
        Instruction + placeholders + question (+ answer) exceed ``cfg.max_length`` tokens even with
        every document emptied.
    ValueError
        No documents.
    """
    if not documents:
        raise ValueError(f"query {query_id}: a prompt needs at least one document")
    k = len(documents)
    doc_texts = [f"{t}: {x}" if cfg.include_title and t else x for t, x in documents]
    pieces = _tokens(tokenizer, [cfg.instruction, *(cfg.doc_prefix.format(i=i + 1) for i in range(k)),
                                 cfg.suffix.format(question=question)])
    head, prefixes, tail = pieces[0], pieces[1:1 + k], pieces[-1]
    docs = _tokens(tokenizer, doc_texts)
    bos = [tokenizer.bos_token_id] if getattr(tokenizer, "bos_token_id", None) is not None else []
    eos_id = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.sep_token_id
    target = (_tokens(tokenizer, [" " + answer.strip()])[0] + ([eos_id] if eos_id is not None else [])) if answer is not None else []
    fixed = len(bos) + len(head) + sum(len(p) + 1 for p in prefixes) + len(tail) + len(target)
    budget = cfg.max_length - fixed
    if budget < 0:
        raise PromptTooLong(f"query {query_id}: instruction, {k} <R> placeholders, question and answer take "
                            f"{fixed} tokens, more than max_length={cfg.max_length}; documents cannot be "
                            f"truncated further (raise max_length or shorten the template)")
    kept = fit_lengths([len(d) for d in docs], budget)
    ids: list[int] = [*bos, *head]
    r_positions: list[int] = []
    for prefix, doc, n in zip(prefixes, docs, kept):
        ids.extend(prefix)
        r_positions.append(len(ids))
        ids.append(r_token_id)
        ids.extend(doc[:n])
    ids.extend(tail)
    if ids.count(r_token_id) != k:  # a text piece may not produce <R> (split_special_tokens)
        raise ValueError(f"query {query_id}: {ids.count(r_token_id)} <R> placeholders for {k} documents")
    labels = [IGNORE_INDEX] * len(ids) + list(target)
    ids.extend(target)
    return PromptEncoding(input_ids=tuple(ids), labels=tuple(labels), r_positions=tuple(r_positions),
                          doc_tokens=tuple(kept), truncated_tokens=sum(len(d) for d in docs) - sum(kept))
