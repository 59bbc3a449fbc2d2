"""Splitting a MediaWiki *multistream* ``.xml.bz2`` dump into independently parsable pieces.

Wikimedia's ``pages-articles-multistream.xml.bz2`` is a concatenation of bz2 streams: the first
holds ``<mediawiki>`` and ``<siteinfo>``, each following one holds 100 ``<page>`` elements, the
last ``</mediawiki>``. The companion ``…-multistream-index.txt.bz2`` lists ``offset:page_id:title``
per page, ``offset`` being the byte offset of the page's stream. Stream offsets come from that
index or, when it is absent, from a scan for byte-aligned stream headers (``BZh[1-9]`` followed
by the block magic ``1AY&SY``; every stream starts byte-aligned, blocks inside a stream do not).

A :class:`Piece` is a run of whole page streams; :func:`open_piece` decompresses one and wraps
it in a root element so that lxml parses it alone.
"""
from __future__ import annotations

import bz2
import io
import logging
import mmap
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator

import indexed_bzip2
import numpy as np

from data_contracts.base import atomic_directory, sha256_file
from funnelrag.store import mark_used
from funnelrag.verify import record_digests, verified_entry

log = logging.getLogger(__name__)

STREAM_HEADER = re.compile(rb"BZh[1-9]1AY&SY")
PIECE_OPEN, PIECE_CLOSE = b"<pieces>", b"</pieces>"


@dataclass(frozen=True)
class Piece:
    """Bytes ``[start, end)`` of the ``.bz2`` file: ``n_streams`` whole page streams."""

    index: int
    start: int
    end: int
    n_streams: int


@dataclass(frozen=True)
class Layout:
    """A multistream dump cut into header stream, pieces of page streams and footer stream."""

    path: Path
    header: tuple[int, int]
    pieces: tuple[Piece, ...]
    footer: tuple[int, int]
    source: str          # "index" or "scan"
    first_ids: dict[int, int] | None = field(default=None, compare=False, repr=False)
    """``source == "index"``: the smallest page id listed at each stream offset of the index
    (:attr:`IndexSummary.first_ids`), for placing adds-changes among the pieces; else ``None``."""


def index_path(dump: Path) -> Path:
    """``X-index.txt.bz2`` beside ``X.xml.bz2`` (Wikimedia's naming)."""
    name = dump.name
    stem = name[: -len(".xml.bz2")] if name.endswith(".xml.bz2") else name.rsplit(".", 1)[0]
    return dump.with_name(f"{stem}-index.txt.bz2")


@dataclass(frozen=True)
class IndexSummary:
    """What the ingest needs of a multistream index file, from one pass over it.

    offsets : the distinct stream offsets (bytes into the dump), ascending.
    first_ids : ``{stream offset: the smallest page id listed at it}``.
    page_ids : ``(n_lines,)`` int64, the page id of every ``offset:page_id:title`` line in file
        order (what the nightly checks the adds-changes days against,
        :func:`tasks.sources.adds_changes.plan_changes`); memory-mapped when read from the kept entry.
    """

    offsets: list[int]
    first_ids: dict[int, int]
    page_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), compare=False)


def index_offsets(index: Path) -> list[int]:
    """Distinct stream offsets of an index file (``offset:page_id:title`` lines), ascending
    (:func:`read_index_summary`'s ``offsets``).

    Raises ``ValueError`` naming the file and line of a line without an integer offset, or naming
    the file when it is truncated or not bz2 (``EOFError``/``OSError`` of the decompressor), and
    ``UnicodeDecodeError`` on bytes that are not UTF-8.
    """
    return read_index_summary(index).offsets


def index_first_ids(index: Path) -> dict[int, int]:
    """``{stream offset: the smallest page id listed at it}`` of an index file (``offset:page_id:title``
    lines), for placing page ids among a dump's streams (:func:`read_index_summary`'s ``first_ids``).

    Raises ``ValueError`` as :func:`read_index_summary`, and naming the file when no line has an
    integer offset and page id."""
    first = read_index_summary(index).first_ids
    if not first:
        raise ValueError(f"multistream index {index}: no offset:page_id:title line")
    return first


def read_index_summary(index: Path) -> IndexSummary:
    """Stream offsets and the first page id of each, in one pass over an index file
    (``offset:page_id:title`` lines, bz2 or plain).

    Read in blocks of whole lines; a block of ``digits:digits:`` lines (the normal case) is taken
    with one regex, any other block line by line as text (the error below names the line; a line
    with an offset but no integer page id adds its offset only).

    Raises
    ------
    ValueError
        Naming the file and line of a line without an integer offset; naming the file when it is
        truncated or not bz2 (``EOFError``/``OSError`` of the decompressor).
    UnicodeDecodeError
        On bytes that are not UTF-8.
    """
    try:
        return _read_index_summary(index)
    except (EOFError, OSError) as exc:
        raise ValueError(f"multistream index {index}: truncated or corrupt ({exc}); re-download it "
                         "or delete it to have the dump scanned for stream headers") from exc
    except OverflowError as exc:
        raise ValueError(f"multistream index {index}: an offset or page id does not fit 64 bits ({exc})") from exc


def _read_index_summary(index: Path) -> IndexSummary:
    offsets: set[int] = set()
    first: dict[int, int] = {}
    ids: list[np.ndarray] = []
    line_no = 0
    for data in index_blocks(index):
        n_lines = data.count(b"\n") + (not data.endswith(b"\n"))
        found = _OFFSET_ID.findall(data)
        if len(found) != n_lines or b"\r" in data or not _is_utf8(data):
            offsets.update(_offsets_by_line(index, data, line_no))
        line_no += n_lines
        if not found:
            continue
        pairs = np.array(found, dtype=np.int64).reshape(-1, 2)   # (offset, page id) per line
        ids.append(pairs[:, 1].copy())
        pairs = pairs[np.lexsort((pairs[:, 1], pairs[:, 0]))]
        heads = np.flatnonzero(np.r_[True, pairs[1:, 0] != pairs[:-1, 0]])
        for o, i in pairs[heads].tolist():
            if i < first.get(o, i + 1):
                first[o] = i
    offsets.update(first)
    return IndexSummary(sorted(offsets), first, np.concatenate(ids) if ids else np.zeros(0, np.int64))


INDEX_SUMMARY_VERSION = "2"   # 2: every line's page id kept too (page_ids.npy)


def index_summary(index: Path, cache_dir: Path | None = None) -> IndexSummary:
    """:func:`read_index_summary` of ``index``, kept in ``cache_dir`` (when given) under the sha256
    of the file's bytes: a nightly build reads the same base dump's index every night until the
    next full dump, and decompressing and parsing it twice a night (stream offsets for the pieces,
    first ids for the adds-changes, every page id for the nightly's check of the days) grows with the
    dump (0.6 CPU s at 200K pages, 3.5 at 1M); hashing it and loading the kept arrays cost ~1/200 of
    one pass (0.008 vs 1.56 CPU s at 1M, ``benchmarks/bench_incremental_stages.py index``).

    The entry is ``cache_dir/multistream-index-<version>-<sha256>/`` (``offsets.npy``, ``first_ids.npy``,
    ``page_ids.npy`` int64, ``COMPLETE``), written atomically; a hit marks it used for the cache
    retention, and its page ids are memory-mapped (8 bytes a page on disk, read where used).

    Raises ``ValueError`` / ``UnicodeDecodeError`` as :func:`read_index_summary` (nothing is kept then).
    """
    if cache_dir is None:
        return read_index_summary(index)
    entry = Path(cache_dir) / f"multistream-index-{INDEX_SUMMARY_VERSION}-{sha256_file(index)}"
    if verified_entry(entry):
        mark_used(entry)
        offsets, first = np.load(entry / "offsets.npy"), np.load(entry / "first_ids.npy")
        return IndexSummary(offsets.tolist(), dict(zip(first[:, 0].tolist(), first[:, 1].tolist())),
                            np.load(entry / "page_ids.npy", mmap_mode="r"))
    summary = read_index_summary(index)
    pairs = np.array(sorted(summary.first_ids.items()), dtype=np.int64).reshape(-1, 2)
    with atomic_directory(entry) as tmp:
        np.save(tmp / "offsets.npy", np.asarray(summary.offsets, dtype=np.int64))
        np.save(tmp / "first_ids.npy", pairs)
        np.save(tmp / "page_ids.npy", summary.page_ids)
        (tmp / "COMPLETE").write_text(f"{index.name}\n")
        record_digests(tmp)
    return summary


def index_blocks(index: Path) -> Iterator[bytes]:
    """An index file (bz2 or plain) in blocks of whole lines of ~16 MiB (the last block may lack its
    final newline). Raises what the decompressor raises on a truncated or corrupt file."""
    with open(index, "rb") as fh:
        opener = bz2.open if fh.read(3) == b"BZh" else open
    carry = b""
    with opener(index, "rb") as fh:
        while True:
            block = fh.read(_INDEX_BLOCK)
            data = carry + block
            if block:
                cut = data.rfind(b"\n") + 1
                data, carry = data[:cut], data[cut:]
            if data:
                yield data
            if not block:
                return


_INDEX_BLOCK = 1 << 24
_OFFSET_ID = re.compile(rb"^(\d+):(\d+):", re.M)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _offsets_by_line(index: Path, data: bytes, line_no: int) -> set[int]:
    """Offsets of whole index lines read as text (universal newlines), lines numbered after ``line_no``."""
    offsets = set()
    for n, line in enumerate(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"), line_no + 1):
        head = line.split(":", 1)[0]
        if not head.strip().isdigit():
            raise ValueError(f"{index}: line {n} does not start with a byte offset: {line[:80]!r}")
        offsets.add(int(head))
    return offsets


def scan_offsets(path: Path, start: int = 0) -> list[int]:
    """Byte offsets ``>= start`` of the bz2 stream headers in ``path`` (memory-mapped scan)."""
    with open(path, "rb") as fh:
        if fh.seek(0, 2) <= start:
            return []
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return [m.start() for m in STREAM_HEADER.finditer(mm, start)]


def _checked_index_summary(dump: Path, index: Path, cache_dir: Path | None) -> IndexSummary | None:
    """The summary of ``index`` (:func:`index_summary`) when it can be read and each offset is at
    a bz2 stream header of ``dump`` (``BZh[1-9]`` + block magic); otherwise None after a warning
    naming the index and the reason (truncated, not an index, an index of another dump), so the
    dump is scanned instead."""
    try:
        summary = index_summary(index, cache_dir)
    except ValueError as exc:   # UnicodeDecodeError included
        log.warning("multistream index %s is unusable (%s); scanning %s for stream headers instead",
                    index, exc, dump.name)
        return None
    offsets = summary.offsets
    with open(dump, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        bad = [o for o in offsets if not STREAM_HEADER.match(mm, o)]
    if bad:
        log.warning("multistream index %s does not match %s: %d of %d offsets are not at a bz2 stream header "
                    "(first: byte %d; an index of another dump?); scanning the dump for stream headers instead",
                    index, dump, len(bad), len(offsets), bad[0])
        return None
    return summary


def _decompress(path: Path, start: int, end: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(start)
        return bz2.decompress(fh.read(end - start))


def plan_layout(path: Path, streams_per_piece: int, use_index: bool = True,
                index_cache: Path | None = None) -> Layout | None:
    """Cut ``path`` into pieces of ``streams_per_piece`` page streams, or None if it is not a
    multistream dump with the header/pages/footer layout (then it is read serially).

    Offsets come from :func:`index_path` when it exists (``use_index``; its summary kept in
    ``index_cache`` when given, :func:`index_summary`), plus a scan of the bytes after the last
    indexed stream for the footer; otherwise from a scan of the whole file.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        if fh.read(3) != b"BZh":
            return None
        size = fh.seek(0, 2)
    ix = index_path(path)
    summary = _checked_index_summary(path, ix, index_cache) if use_index and ix.is_file() else None
    offsets = summary.offsets if summary is not None else None
    if offsets is not None:
        bounds, source = sorted({0, *offsets, *scan_offsets(path, offsets[-1] + 1 if offsets else 0)}), "index"
    else:
        bounds, source = scan_offsets(path), "scan"
    bounds = [b for b in bounds if b < size] + [size]
    if len(bounds) < 4 or bounds[0] != 0:
        return None
    head = _decompress(path, bounds[0], bounds[1])
    foot = _decompress(path, bounds[-2], bounds[-1])
    if b"<page>" in head or b"<page>" in foot or b"<mediawiki" not in head or foot.strip() != b"</mediawiki>":
        return None
    pages = bounds[1:-1]
    pieces = tuple(Piece(k, pages[i], pages[min(i + streams_per_piece, len(pages) - 1)],
                         min(streams_per_piece, len(pages) - 1 - i))
                   for k, i in enumerate(range(0, len(pages) - 1, streams_per_piece)))
    return Layout(path, (bounds[0], bounds[1]), pieces, (bounds[-2], bounds[-1]), source,
                  summary.first_ids if summary is not None else None)


class _Bzip2Piece(io.RawIOBase):
    """Decompress the concatenated bz2 streams of bytes ``[start, end)`` of a file, strictly.

    Decoded by ``indexed_bzip2`` with one thread (~23% less CPU than libbz2 on a 39.3 MB piece of
    the 1M-page synthetic dump: 0.875 vs 1.141 CPU s, ``benchmarks/bench_ingest.py --piece``). That decoder, like
    :class:`bz2.BZ2File`, stops silently at bytes that do not start a stream; so at the end the
    compressed bits it consumed must be exactly the range's, otherwise the piece is refused. Any
    corrupt or truncated stream raises ``OSError`` (the decoder's ``RuntimeError`` re-raised), so
    a damaged piece is never read as a shorter one. The decoder is opened on the first read and
    closed at the end of the data, on an error and by :meth:`close` (its reader must not outlive
    the interpreter). indexed_bzip2 1.7.0 keeps a reference to the file object it was given after
    ``close``; the compressed bytes are in an ``io.BytesIO`` that is closed with it, which frees
    them (otherwise a worker kept every piece's compressed bytes: 862 MB peak at 1M pages).
    """

    def __init__(self, path: Path, start: int, end: int):
        self._path, self._start, self._end = path, start, end
        self._reader = None
        self._source: io.BytesIO | None = None
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._done:
            return 0
        if self._reader is None:
            self._source = io.BytesIO(self._compressed())
            self._reader = indexed_bzip2.IndexedBzip2FileRaw(self._source, parallelization=1)
        try:
            n = self._reader.readinto(buffer)
            if n == 0:
                self._finish()
            return n
        except RuntimeError as exc:
            self._release()
            raise OSError(f"bz2 data of bytes {self._start}-{self._end} is corrupt or truncated ({exc})") from exc
        except BaseException:
            self._release()
            raise

    def _compressed(self) -> bytes:
        with open(self._path, "rb") as fh:
            fh.seek(self._start)
            data = fh.read(self._end - self._start)
        if len(data) != self._end - self._start:
            raise EOFError(f"the file ends at byte {self._start + len(data)}, inside bytes {self._start}-{self._end}")
        return data

    def _finish(self) -> None:
        used = self._reader.bz2reader.tell_compressed()   # bits
        self._release()
        self._done = True
        if used != 8 * (self._end - self._start):
            raise OSError(f"bytes {self._start + used // 8}-{self._end} after the last complete bz2 stream are "
                          f"not a bz2 stream")

    def _release(self) -> None:
        if self._reader is not None:
            reader, self._reader = self._reader, None
            reader.close()
        if self._source is not None:
            source, self._source = self._source, None
            source.close()   # frees the compressed bytes (see the class docstring)

    def close(self) -> None:
        self._release()
        super().close()


class _Wrapped(io.RawIOBase):
    """``prefix`` + the bytes of ``inner`` + ``suffix``; ``inner_bytes`` counts those of ``inner``."""

    def __init__(self, inner: BinaryIO, prefix: bytes, suffix: bytes):
        self._parts = [io.BytesIO(prefix), inner, io.BytesIO(suffix)]
        self._inner = inner
        self.inner_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._parts:
            data = self._parts[0].read(len(buffer))
            if data:
                if self._parts[0] is self._inner:
                    self.inner_bytes += len(data)
                buffer[: len(data)] = data
                return len(data)
            self._parts.pop(0)
        return 0

    def close(self) -> None:
        self._inner.close()
        super().close()


def open_piece(path: Path, start: int, end: int) -> _Wrapped:
    """The decompressed pages of bytes ``[start, end)`` of ``path`` inside ``<pieces>…</pieces>``.

    Reads raise ``OSError`` on a corrupt or truncated stream or on bytes of the range that start
    no stream, and ``EOFError`` when the file ends before ``end`` (see :class:`_Bzip2Piece`).
    """
    return _Wrapped(_Bzip2Piece(path, start, end), PIECE_OPEN, PIECE_CLOSE)


def open_header_footer(layout: Layout) -> _Wrapped:
    """Header stream + footer stream: a complete ``<mediawiki><siteinfo/></mediawiki>`` document."""
    (h0, h1), (f0, f1) = layout.header, layout.footer
    return _Wrapped(io.BytesIO(_decompress(layout.path, h0, h1) + _decompress(layout.path, f0, f1)), b"", b"")
