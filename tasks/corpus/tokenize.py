"""Named token counters: the unit of every size limit in the corpus build.

FunnelRAG sizes clusters (≤ 4K tokens) and document units (≤ ~1K tokens) in tokens of the
reader's tokenizer. Two counters, chosen by name in the stage configs:

``"t5"``
    The real T5 SentencePiece tokenizer (``funnelrag.datasets.resolve("t5-tokenizer", mirror)``
    → ``tokenizer.json``), loaded with ``tokenizers.Tokenizer.from_file`` and batch-encoded
    without special tokens. The shipped ``tokenizer.json`` pads and truncates to 256 tokens;
    both are switched off here, so a count is the true length of the text.
``"whitespace"``
    ``len(text.split())``, for tiny tests.
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np
from tokenizers import Tokenizer

from funnelrag.datasets import resolve

TOKENIZER_NAMES = ("t5", "whitespace")


class TokenCounter(Protocol):
    """Counts tokens of texts; ``name`` is the configured tokenizer name."""

    name: str

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 token counts."""
        ...


class WhitespaceCounter:
    """Whitespace tokens: ``len(text.split())`` (Python's Unicode whitespace split)."""

    name = "whitespace"

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 counts of whitespace-separated words."""
        return np.fromiter((len(t.split()) for t in texts), dtype=np.int32, count=len(texts))


PYTHON_ONLY_SPACE = re.compile("[\x1c-\x1f]")
"""Characters ``str.split()`` splits on and the tokenizer's ``WhitespaceSplit`` (Rust's
``char::is_whitespace``) does not; a text holding one is encoded whole."""
MAX_KEPT_WORDS = 1 << 21
"""Word counts a counter keeps (~0.2 GB); past it the kept counts are dropped and learnt again."""


def counts_words_alone(tokenizer_json: dict) -> bool:
    """Whether a ``tokenizer.json`` (parsed) tokenizes each whitespace-separated word on its own: no
    normalizer, and a pre-tokenizer that first splits on whitespace and then prefixes every word
    alike (T5's ``WhitespaceSplit`` + ``Metaspace`` with ``prepend_scheme: always``). Then a text's
    token count is the sum of its words' counts (added tokens hold no whitespace, so they are
    found inside a word as inside the text)."""
    pre = tokenizer_json.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    if tokenizer_json.get("normalizer") is not None or not steps or steps[0].get("type") != "WhitespaceSplit":
        return False
    return all(s.get("type") == "Metaspace" and s.get("prepend_scheme", "always") == "always" for s in steps[1:])


class HFTokenizerCounter:
    """A ``tokenizers.Tokenizer`` (Rust, batched) counting tokens without special tokens.

    When the tokenizer tokenizes each word on its own (:func:`counts_words_alone`, T5's), a text's
    count is the sum of its words' counts, each distinct word encoded once and its count kept
    (at most :data:`MAX_KEPT_WORDS`); otherwise every text is encoded whole. Both give the same
    counts (``tests/test_tokenize.py`` compares them on real articles).

    Parameters
    ----------
    name : str
        Configured tokenizer name, e.g. ``"t5"``.
    path : Path
        ``tokenizer.json`` file.
    batch_size : int
        Texts (or distinct words, 256 a sequence) per ``encode_batch`` call (bounds memory of the encodings).
    """

    def __init__(self, name: str, path: Path, batch_size: int = 2048):
        self.name = name
        self.path = Path(path)
        self.batch_size = batch_size
        self._tok = Tokenizer.from_file(str(self.path))
        self._tok.no_padding()
        self._tok.no_truncation()
        self._encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        self.by_word = counts_words_alone(json.loads(self.path.read_text(encoding="utf-8")))
        self._word_tokens: dict[str, int] = {}

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 token counts (no ``</s>``, no padding, no truncation)."""
        if not self.by_word:
            return self.count_whole(texts)
        out = np.empty(len(texts), dtype=np.int32)
        whole = [i for i, t in enumerate(texts) if PYTHON_ONLY_SPACE.search(t)]
        words = [[] if PYTHON_ONLY_SPACE.search(t) else t.split() for t in texts]
        kept = self._word_tokens
        new = list({w for ws in words for w in ws if w not in kept})
        if len(kept) + len(new) > MAX_KEPT_WORDS:
            kept.clear()
            new = list({w for ws in words for w in ws})
        per_seq = 256
        seqs = [new[s:s + per_seq] for s in range(0, len(new), per_seq)]
        for s in range(0, len(seqs), max(1, self.batch_size // per_seq)):
            batch = seqs[s:s + max(1, self.batch_size // per_seq)]
            # one encoding per sequence of distinct words; word_ids says which word each token is of
            for seq, enc in zip(batch, self._tok.encode_batch(batch, is_pretokenized=True, add_special_tokens=False)):
                n = np.bincount(np.asarray(enc.word_ids, dtype=np.int64), minlength=len(seq))   # (len(seq),)
                kept.update(zip(seq, n.tolist()))
        get = kept.__getitem__
        for i, ws in enumerate(words):
            out[i] = sum(map(get, ws))
        if whole:
            out[whole] = self.count_whole([texts[i] for i in whole])
        return out

    def count_whole(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 token counts, each text encoded whole."""
        out = np.empty(len(texts), dtype=np.int32)
        for start in range(0, len(texts), self.batch_size):
            batch = list(texts[start:start + self.batch_size])
            encodings = self._encode(batch, add_special_tokens=False)
            out[start:start + len(batch)] = [len(e) for e in encodings]
        return out

    def __repr__(self) -> str:
        return f"HFTokenizerCounter(name={self.name!r}, path={str(self.path)!r})"


@functools.lru_cache(maxsize=4)
def _hf_counter(name: str, path: str, size: int, mtime_ns: int) -> HFTokenizerCounter:
    return HFTokenizerCounter(name, Path(path))


def load_token_counter(name: str, mirror: Path | None) -> TokenCounter:
    """The token counter called ``name``; a tokenizer file is loaded once a process (~0.09 CPU s
    for T5's; a build worker runs a token or segment shard after another), again if the file
    changes (its size or modification time). The counter is never modified after loading.

    Parameters
    ----------
    name : str
        ``"t5"`` or ``"whitespace"``.
    mirror : Path or None
        Data mirror for ``funnelrag.datasets.resolve`` (the T5 ``tokenizer.json``).

    Raises
    ------
    ValueError
        Unknown tokenizer name.
    funnelrag.datasets.DataUnavailable
        The T5 tokenizer file is neither in the mirror nor downloadable.
    """
    if name == "whitespace":
        return WhitespaceCounter()
    if name == "t5":
        path = resolve("t5-tokenizer", mirror)
        st = path.stat()
        return _hf_counter("t5", str(path), st.st_size, st.st_mtime_ns)
    raise ValueError(f"unknown tokenizer {name!r}; expected one of {TOKENIZER_NAMES}")
