"""Opening inputs: compression by magic bytes, byte counting, and an invalid-UTF-8 guard."""
from __future__ import annotations

import bz2
import codecs
import gzip
import io
import re
from pathlib import Path
from typing import BinaryIO

INVALID_UTF8_MARK = "\ufdd0"
"""Noncharacter substituted for each invalid UTF-8 byte by :class:`Utf8Guard` (legal in XML,
so the parser goes on and the page holding it is skipped as ``invalid_utf8``)."""
_MARK_BYTES = INVALID_UTF8_MARK.encode("utf-8")
_SURROGATES = re.compile("[\udc80-\udcff]")


def open_input(path: Path) -> BinaryIO:
    """Open ``path`` for binary reading, decompressing bz2 (incl. multistream) or gzip.

    The compression is detected from the first bytes (``BZh`` / ``\\x1f\\x8b``), not the
    file name. Python's :mod:`bz2` reads concatenated streams, as in the
    ``pages-articles-multistream`` dumps.
    """
    with open(path, "rb") as fh:
        magic = fh.read(3)
    if magic == b"BZh":
        return bz2.open(path, "rb")
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


class Utf8Guard(io.RawIOBase):
    """File-like wrapper that counts bytes and replaces invalid UTF-8 with a marker.

    Valid input passes through unchanged (a strict incremental decode is used only to
    validate); each invalid byte becomes :data:`INVALID_UTF8_MARK` so a streaming XML parser
    keeps going and the affected page can be skipped and counted instead of losing the rest
    of the dump. Reads from ``raw`` propagate their errors (``EOFError`` of a truncated bz2).
    """

    def __init__(self, raw: BinaryIO, chunk_size: int = 1 << 20):
        self._raw, self._chunk_size = raw, chunk_size
        self._carry = b""       # incomplete UTF-8 sequence at the end of the last chunk
        self._out = b""
        self._pos = 0
        self._eof = False
        self.bytes_read = 0     # bytes consumed from ``raw``
        self.invalid_bytes = 0  # invalid bytes replaced so far

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (all remaining if negative); ``b""`` at the end."""
        if size is None or size < 0:
            parts = [self._out[self._pos:]]
            self._out, self._pos = b"", 0
            while not self._eof:
                parts.append(self._next_chunk())
            return b"".join(parts)
        while self._pos >= len(self._out) and not self._eof:
            self._out, self._pos = self._next_chunk(), 0
        out = self._out[self._pos:self._pos + size]
        self._pos += len(out)
        return out

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _next_chunk(self) -> bytes:
        block = self._raw.read(self._chunk_size)
        self.bytes_read += len(block)
        self._eof = not block
        return self._validate(self._carry + block, self._eof)

    def _validate(self, data: bytes, final: bool) -> bytes:
        try:
            _, consumed = codecs.utf_8_decode(data, "strict", final)
        except UnicodeDecodeError:
            text, consumed = codecs.utf_8_decode(data, "surrogateescape", final)
            self.invalid_bytes += len(_SURROGATES.findall(text))
            self._carry = data[consumed:]
            return _SURROGATES.sub(INVALID_UTF8_MARK, text).encode("utf-8")
        self._carry = data[consumed:]
        return data[:consumed]
