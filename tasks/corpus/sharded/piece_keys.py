"""The BM25 token memos' piece keys, derived from the documents' text keys instead of hashing every
piece's bytes again.

Both BM25 indexes of a build tokenize their texts in pieces through the token memo
(:func:`tasks.corpus.sharded.token_memo.memo_token_ids`), which keys a piece by what determines its
text:

- a cluster member's piece ``title\\ntext``: :func:`member_keys`, the BLAKE2b-128 of the title
  (length-prefixed) and the 16 bytes of the document's text key (the BLAKE2b-128 of its text that
  the tokens stage computes once a build, :data:`tasks.corpus.sharded.shards.TEXT_KEYS_FILE`; hashed
  here with :func:`funnelrag.content_store.arrow_text_keys` where the stage kept none): one short
  hash a document;
- a passage's ``title\\ntext``: its document's title and window ``w`` of the document's text cut
  every ``passage_words`` words (:func:`tasks.corpus.segment.article_windows`), so a function of
  (the member key, ``w``, ``passage_words``): :func:`window_keys`, the member key XOR a
  BLAKE2b-128 of ``(w, passage_words,`` :data:`tasks.corpus.segment.WINDOW_RULE_VERSION` ``)``: one hash a
  distinct window number, a vectorised XOR a passage.

Why: hashing the pieces' bytes (:meth:`funnelrag.content_store.JoinedTexts.keys`) was 229 py-spy
samples, ~4.6 CPU s, of a 200K-page night (passages 2.8, clusters 1.8), though every document's
text is hashed once a build already. What it costs: an edited document's passages all get new keys,
so all of them are tokenized again (a piece-bytes key kept its unchanged windows).

Injective in practice: for one ``(w, passage_words)`` the XOR with a constant is a bijection of the
member keys, so windows ``w`` of two documents collide only when their member keys do; windows
``w1 != w2`` of keys ``K1``, ``K2`` collide only when ``K1 ^ K2 == G(w1) ^ G(w2)``, a coincidence
of 128-bit BLAKE2b outputs (about ``n**2 / 2**129`` for ``n`` passages; tested on a large random
sample). The passage key stands for the passage's text only while the passage is that window of that
text: :func:`passage_windows` checks what the passages table says of it (a document's passages
consecutive, every window but its last of ``passage_words`` words, the last of 1 to ``passage_words``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from funnelrag.content_store import Utf8Rows, digest_words, key_digests
from tasks.corpus.segment import WINDOW_RULE_VERSION, window_numbers
from tasks.corpus.sharded.shards import document_text_keys, read_rows_at

MEMBER_PERSON = b"bm25-member"
WINDOW_PERSON = b"bm25-window"
"""BLAKE2b personalisations of the two derivations (domain separation from text keys and each other)."""


def member_keys(titles: pa.Array | pa.ChunkedArray, text_keys: np.ndarray) -> np.ndarray:
    """``(n, 2)`` uint64: each document's member piece key (``title\\ntext``), the BLAKE2b-128 of
    its title's UTF-8 byte length (8 bytes, little-endian), the title's bytes and its text key's 16
    digest bytes, as (high, low) words like :func:`funnelrag.content_store.text_keys`.

    ``titles``: ``(n,)`` Arrow strings; ``text_keys``: ``(n, 2)`` uint64, each document's
    :func:`funnelrag.content_store.text_keys` of its text. Raises ``ValueError`` when they differ in length."""
    rows = Utf8Rows(titles)
    keys = np.asarray(text_keys, np.uint64).reshape(-1, 2)
    if len(rows) != keys.shape[0]:
        raise ValueError(f"member keys: {len(rows)} titles for {keys.shape[0]} text keys")
    raw = key_digests(keys).tobytes()
    blake = hashlib.blake2b
    out = []
    for i, (title, size) in enumerate(zip(rows, rows.lengths.tolist())):
        h = blake(size.to_bytes(8, "little"), digest_size=16, person=MEMBER_PERSON)
        h.update(title)
        h.update(raw[16 * i:16 * i + 16])
        out.append(h.digest())
    return digest_words(b"".join(out))


def window_keys(members: np.ndarray, windows: np.ndarray, passage_words: int) -> np.ndarray:
    """``(m, 2)`` uint64: the passage keys of windows ``windows`` (``(m,)`` int, each window's number
    in its document) of documents whose member keys are ``members`` (``(m, 2)`` uint64, one a
    window): ``members ^ G(w)``, ``G(w)`` the BLAKE2b-128 of ``(w, passage_words)`` (two int64,
    little-endian) and :data:`tasks.corpus.segment.WINDOW_RULE_VERSION`, hashed once a distinct ``w``."""
    members = np.asarray(members, np.uint64).reshape(-1, 2)
    windows = np.asarray(windows, np.int64)
    if windows.shape != (members.shape[0],):
        raise ValueError(f"window keys: {windows.shape} windows for {members.shape[0]} member keys")
    distinct, which = np.unique(windows, return_inverse=True)
    salt = np.array([passage_words], "<i8").tobytes() + WINDOW_RULE_VERSION.encode()
    mixes = digest_words(b"".join(hashlib.blake2b(np.array([w], "<i8").tobytes() + salt, digest_size=16,
                                                  person=WINDOW_PERSON).digest() for w in distinct.tolist()))
    return members ^ mixes.reshape(-1, 2)[which.reshape(-1)]


def passage_windows(doc_ids: np.ndarray, n_words: np.ndarray, passage_words: int,
                    what: str) -> tuple[np.ndarray, np.ndarray]:
    """Each passage's document run and window number, from consecutive passages' ``doc_id`` and
    ``n_words`` (``(m,)`` int each, rows of ``passages.parquet`` in file order).

    Returns ``(run, windows)``, ``(m,)`` int64 each: ``run[i]`` the index of passage ``i``'s document
    among the documents in order of first passage, ``windows[i]`` its window number in it
    (:func:`tasks.corpus.segment.window_numbers`).

    Raises
    ------
    ValueError
        Naming ``what`` and the first offending row: a document's passages are not consecutive, or
        a passage is not a window of ``passage_words`` words (every window but a document's last
        has exactly ``passage_words`` words, the last 1 to ``passage_words``): its key would not
        stand for its text.
    """
    doc_ids, n_words = np.asarray(doc_ids, np.int64), np.asarray(n_words, np.int64)
    starts = np.r_[True, doc_ids[1:] != doc_ids[:-1]] if doc_ids.size else np.zeros(0, bool)
    run = np.cumsum(starts, dtype=np.int64) - 1
    first_rows = np.flatnonzero(starts)
    distinct, first = np.unique(doc_ids[first_rows], return_index=True)
    if distinct.size != first_rows.size:
        again = np.setdiff1d(np.arange(first_rows.size), first)[0]
        raise ValueError(f"{what}: row {int(first_rows[again])}: the passages of document {int(doc_ids[first_rows[again]])} "
                         "are not consecutive")
    last = np.r_[starts[1:], True] if doc_ids.size else starts
    bad = np.flatnonzero((n_words < 1) | (n_words > passage_words) | (~last & (n_words != passage_words)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"{what}: row {i} (document {int(doc_ids[i])}) has {int(n_words[i])} words, not a window "
                         f"of segment.passage_words = {passage_words}")
    return run, window_numbers(np.bincount(run, minlength=first_rows.size).astype(np.int64))[1]


def passage_keys(passages: pa.Table, doc_rows: np.ndarray, documents: Path, tokens_dir: Path | str | None,
                 passage_words: int, what: str) -> np.ndarray:
    """``(m, 2)`` uint64: the token-memo keys of consecutive rows of ``passages.parquet``
    (``passages``: their ``doc_id``, ``title``, ``n_words``), each its document's member key
    (:func:`member_keys` of the title of its document's first passage and the document's text key,
    :func:`tasks.corpus.sharded.shards.document_text_keys`) mixed with its window number and ``passage_words``
    (:func:`window_keys`). ``doc_rows``: ``(n_documents,)`` int, the row in ``documents`` (the
    ``documents.parquet`` file, read only for the texts of a tokens stage that kept no keys) of each
    document of the passages, in order of first passage.

    Raises
    ------
    ValueError
        Naming ``what``: as :func:`passage_windows`; ``doc_rows`` does not hold one row a document;
        a document's passages differ in title.
    """
    run, windows = passage_windows(passages.column("doc_id").to_numpy(), passages.column("n_words").to_numpy(),
                                   passage_words, what)
    doc_rows = np.asarray(doc_rows, np.int64)
    firsts = np.flatnonzero(np.r_[True, run[1:] != run[:-1]]) if run.size else np.zeros(0, np.int64)
    if doc_rows.size != firsts.size:
        raise ValueError(f"{what}: {firsts.size} documents, {doc_rows.size} document rows planned")
    titles = passages.column("title").take(pa.array(firsts))
    if run.size and not pc.all(pc.equal(passages.column("title"), titles.take(pa.array(run)))).as_py():
        raise ValueError(f"{what}: the passages of one document differ in title")
    order = np.argsort(doc_rows)   # read in file order, hashed in the passages' order
    text_keys = document_text_keys(tokens_dir, doc_rows, lambda: read_rows_at(documents, doc_rows[order], ["text"])
                                   .column("text").take(pa.array(np.argsort(order))))
    return window_keys(member_keys(titles, text_keys)[run], windows, passage_words)
