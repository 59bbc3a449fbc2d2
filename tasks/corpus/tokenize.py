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


class HFTokenizerCounter:
    """A ``tokenizers.Tokenizer`` (Rust, batched) counting tokens without special tokens.

    Parameters
    ----------
    name : str
        Configured tokenizer name, e.g. ``"t5"``.
    path : Path
        ``tokenizer.json`` file.
    batch_size : int
        Texts per ``encode_batch`` call (bounds memory of the encodings).
    """

    def __init__(self, name: str, path: Path, batch_size: int = 2048):
        self.name = name
        self.path = Path(path)
        self.batch_size = batch_size
        self._tok = Tokenizer.from_file(str(self.path))
        self._tok.no_padding()
        self._tok.no_truncation()
        self._encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)

    def count(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` int32 token counts (no ``</s>``, no padding, no truncation)."""
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
