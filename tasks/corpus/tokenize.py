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
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from funnelrag.datasets import resolve

TOKENIZER_NAMES = ("t5", "whitespace")


class TokenCounter(Protocol):
    """Counts tokens of texts; ``name`` is the configured tokenizer name. A counter whose text
    counts are the sums of their whitespace-separated words' counts says so with ``by_word`` and
    counts single words with ``count_words(words) -> (len(words),) int32``."""

    name: str

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 token counts."""
        ...


class WhitespaceCounter:
    """Whitespace tokens: ``len(text.split())`` (Python's Unicode whitespace split)."""

    name = "whitespace"
    by_word = True

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 counts of whitespace-separated words."""
        return np.fromiter((len(t.split()) for t in texts), dtype=np.int32, count=len(texts))

    def count_words(self, words: Sequence[str]) -> np.ndarray:
        """``(len(words),)`` int32 ones: each word is one token."""
        return np.ones(len(words), dtype=np.int32)


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


def model_word_prefix(tokenizer_json: dict) -> tuple[str, str] | None:
    """``(prefix, special characters)`` when a word's tokens can be had from the tokenizer's model
    alone: a tokenizer that counts words alone (:func:`counts_words_alone`) whose pre-tokenizer is
    ``WhitespaceSplit`` and one ``Metaspace``. A word holding none of the special characters (the
    Metaspace replacement, on which Metaspace may split, and the first character of every added
    token, which is matched inside a word) is one pre-token, ``prefix + word``, so its tokens are
    ``model.tokenize(prefix + word)``; a word holding one is encoded by the whole pipeline. None
    otherwise."""
    if not counts_words_alone(tokenizer_json):
        return None
    steps = tokenizer_json["pre_tokenizer"].get("pretokenizers", [])
    if len(steps) != 2:
        return None
    replacement = steps[1].get("replacement", "\u2581")
    added = "".join(sorted({t["content"][0] for t in tokenizer_json.get("added_tokens") or [] if t.get("content")}))
    return replacement, replacement + added


class HFTokenizerCounter:
    """A ``tokenizers.Tokenizer`` (Rust, batched) counting tokens without special tokens.

    When the tokenizer tokenizes each word on its own (:func:`counts_words_alone`, T5's), a text's
    count is the sum of its words' counts (:meth:`count_words`), each distinct word tokenized once
    and its count kept (at most :data:`MAX_KEPT_WORDS`); otherwise every text is encoded whole.
    Both give the same counts (``tests/test_tokenize.py`` compares them on real articles).

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
        spec = json.loads(self.path.read_text(encoding="utf-8"))
        self.by_word = counts_words_alone(spec)
        self._model_words = model_word_prefix(spec)
        self._word_tokens: dict[str, int] = {}

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 token counts (no ``</s>``, no padding, no truncation)."""
        if not self.by_word:
            return self.count_whole(texts)
        whole = [i for i, t in enumerate(texts) if PYTHON_ONLY_SPACE.search(t)]
        words = [[] if PYTHON_ONLY_SPACE.search(t) else t.split() for t in texts]
        sizes = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        ends = np.zeros(len(words) + 1, np.int64)
        np.cumsum(sizes, out=ends[1:])
        summed = np.zeros(int(ends[-1]) + 1, np.int64)
        np.cumsum(self.count_words([w for ws in words for w in ws]), out=summed[1:])
        out = (summed[ends[1:]] - summed[ends[:-1]]).astype(np.int32)
        if whole:
            out[whole] = self.count_whole([texts[i] for i in whole])
        return out

    def count_words(self, words: Sequence[str]) -> np.ndarray:
        """``(len(words),)`` int32 token counts of single words (strings without whitespace, as
        ``str.split()`` gives them), for a tokenizer that counts words alone (:attr:`by_word`):
        a text's count is the sum of its words'.

        The distinct words are found by Arrow (``dictionary_encode``: Python touches each distinct
        word once, not each occurrence); each is tokenized once a process and its count kept (at
        most :data:`MAX_KEPT_WORDS`): a word without special characters by the tokenizer's model alone
        (:func:`model_word_prefix`, ~2x fewer CPU seconds than the pipeline's ``encode_batch``),
        the others by ``encode_batch`` of pre-tokenized sequences of 256 words (each token's
        ``word_ids`` names its word). Same counts either way (``tests/test_tokenize.py``).

        Raises
        ------
        ValueError
            The tokenizer does not count words alone.
        """
        if not self.by_word:
            raise ValueError(f"{self.path}: this tokenizer does not tokenize each word alone; count whole texts")
        if not len(words):
            return np.zeros(0, np.int32)
        # the distinct words and each word's place among them, hashed by Arrow: Python sees each distinct word once
        encoded = pc.dictionary_encode(pa.array(words, pa.large_string()))
        distinct = encoded.dictionary.to_pylist()
        kept = self._word_tokens
        new = [w for w in distinct if w not in kept]
        if len(kept) + len(new) > MAX_KEPT_WORDS:
            kept.clear()
            new = distinct
        self._tokenize_words(new)
        counts = np.fromiter(map(kept.__getitem__, distinct), dtype=np.int32, count=len(distinct))
        return counts[encoded.indices.to_numpy()]

    def _tokenize_words(self, new: list[str]) -> None:
        """Keep the token count of each word of ``new`` (distinct words not kept yet)."""
        kept = self._word_tokens
        special = None
        if self._model_words is not None:
            prefix, chars = self._model_words
            special = re.compile("[" + re.escape(chars) + "]").search
            tokenize = self._tok.model.tokenize
            kept.update((w, len(tokenize(prefix + w))) for w in new if not special(w))
            new = [w for w in new if special(w)]
        per_seq = 256
        seqs = [new[s:s + per_seq] for s in range(0, len(new), per_seq)]
        for s in range(0, len(seqs), max(1, self.batch_size // per_seq)):
            batch = seqs[s:s + max(1, self.batch_size // per_seq)]
            # one encoding per sequence of distinct words; word_ids says which word each token is of
            for seq, enc in zip(batch, self._tok.encode_batch(batch, is_pretokenized=True, add_special_tokens=False)):
                n = np.bincount(np.asarray(enc.word_ids, dtype=np.int64), minlength=len(seq))   # (len(seq),)
                kept.update(zip(seq, n.tolist()))

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
