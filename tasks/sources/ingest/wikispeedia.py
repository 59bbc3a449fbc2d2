"""Reader of the Wikispeedia archives (West & Leskovec, SNAP), streamed from the ``.tar.gz``.

* ``wikispeedia_articles_plaintext.tar.gz``: ``plaintext_articles/<URL-quoted title>.txt``, one
  article per file. Each file starts with a header (``#copyright`` line, the display title, and
  the "2007 Schools Wikipedia Selection. Related subjects: ..." paragraph) and ends with a
  footer (``Retrieved from "http://en.wikipedia.org/wiki/..."`` and a licence notice); both
  are stripped. The article title comes from the file name (URL-unquoted, ``_`` → space), the
  name ``links.tsv`` uses; the display title in the header sometimes differs
  (``Color.txt`` shows "Colour").
* ``wikispeedia_paths-and-graph.tar.gz``: ``links.tsv`` = ``source TAB target`` (URL-quoted),
  ``#`` comment lines. Read first (≈3 MB, held as ``{source title: [targets]}``) so links travel
  with their source page.

Bad input: a member that is not valid UTF-8 → ``invalid_utf8``; a link line without exactly two
non-empty fields → ``malformed_link`` (one report row per line); a truncated/corrupt archive →
:class:`IngestError` naming the file.
"""
from __future__ import annotations

import re
import tarfile
import zlib
from collections import Counter
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

from tasks.sources.ingest.config import INVALID_UTF8, MALFORMED_LINK, MALFORMED_PAGE, OVERSIZE, IngestError
from tasks.sources.ingest.records import PLAIN, RawPage
from tasks.sources.ingest.titles import normalise_title
from tasks.sources.ingest.wikitext import tidy_whitespace

ARTICLE_DIR = "plaintext_articles/"
LINKS_MEMBER = "links.tsv"
# "#copyright", the display title, then the "2007 Schools Wikipedia Selection." paragraph.
_HEADER = re.compile(r"\s*#copyright[^\n]*\n\s*[^\n]*(?:\n|\Z)"
                     r"(?:\s*2007 Schools Wikipedia Selection[^\n]*(?:\n[^\S\n]*\S[^\n]*)*)?")


class WikispeediaReader:
    """Iterate over Wikispeedia articles with their outgoing links attached.

    Parameters
    ----------
    inputs : list of Path
        The articles archive and (optionally) the paths-and-graph archive, in any order; each
        is recognised by its members.
    max_page_bytes : int
        Articles larger than this are not decoded (``oversize``).

    Attributes
    ----------
    link_stats : Counter
        ``seen`` (link lines), ``malformed``, ``unknown_source`` (source title with no
        article), filled while :meth:`pages` runs.
    bytes_read : int
        Uncompressed bytes of the article members and ``links.tsv``.
    """

    def __init__(self, inputs: list[Path], max_page_bytes: int):
        self.inputs = [Path(p) for p in inputs]
        self.max_page_bytes = max_page_bytes
        self.link_stats: Counter[str] = Counter()
        self.bytes_read = 0

    def pages(self) -> Iterator[RawPage]:
        """Yield bad link lines (as ``malformed_link`` records), then one record per article.

        Raises
        ------
        IngestError
            A truncated or corrupt archive, or no articles archive among the inputs.
        """
        articles = [p for p in self.inputs if _has_member(p, ARTICLE_DIR)]
        graphs = [p for p in self.inputs if p not in articles]
        if not articles:
            raise IngestError(f"no Wikispeedia articles archive (members {ARTICLE_DIR}*.txt) among {self.inputs}")
        links: dict[str, list[str]] = {}
        for path in graphs:
            yield from self._read_links(path, links)
        for path in articles:
            yield from self._read_articles(path, links)
        self.link_stats["unknown_source"] += sum(len(v) for v in links.values())

    def _read_links(self, path: Path, links: dict[str, list[str]]) -> Iterator[RawPage]:
        found = False
        for member, data in _members(path):
            if member.name.rsplit("/", 1)[-1] != LINKS_MEMBER:
                continue
            found = True
            self.bytes_read += len(data)
            record = f"{member.name}:line"
            last_raw, last_src = None, None  # lines come grouped by source
            for lineno, line in enumerate(data.split(b"\n"), start=1):
                if not line.strip() or line.startswith(b"#"):
                    continue
                self.link_stats["seen"] += 1
                fields = line.rstrip(b"\r").split(b"\t")
                if len(fields) != 2 or not fields[1].strip():
                    src = None
                elif fields[0] == last_raw:
                    src = last_src
                else:
                    last_raw, last_src = fields[0], normalise_title(_unquote(fields[0]))
                    src = last_src
                if src is None:
                    self.link_stats["malformed"] += 1
                    yield RawPage(source=path.name, position=lineno, record=f"{record} {lineno}", n_bytes=len(line),
                                  error=MALFORMED_LINK, detail=f"expected 'source<TAB>target', got {line[:200]!r}")
                    continue
                links.setdefault(src, []).append(_unquote(fields[1]))
        if not found:
            raise IngestError(f"{path}: neither a Wikispeedia articles archive nor one holding {LINKS_MEMBER}")

    def _read_articles(self, path: Path, links: dict[str, list[str]]) -> Iterator[RawPage]:
        position = 0
        for member, data in _members(path, max_bytes=self.max_page_bytes):
            page = RawPage(source=path.name, position=position, record=member.name, n_bytes=member.size, markup=PLAIN)
            position += 1
            self.bytes_read += len(data)
            name = member.name
            if not name.startswith(ARTICLE_DIR) or not name.endswith(".txt"):
                page.error, page.detail = MALFORMED_PAGE, "not a plaintext_articles/*.txt member"
                yield page
                continue
            page.title = _unquote(name[len(ARTICLE_DIR):-len(".txt")])
            page.links = links.pop(normalise_title(page.title) or "", None)
            if member.size > self.max_page_bytes:
                page.error, page.detail = OVERSIZE, f"{member.size} bytes"
            else:
                try:
                    page.text = strip_header_footer(data.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    page.error, page.detail = INVALID_UTF8, f"invalid UTF-8 at byte {exc.start}"
            yield page


def strip_header_footer(text: str) -> str:
    """Remove the Wikispeedia header and footer and normalise white space.

    The header is the ``#copyright`` line, the display-title line and the "2007 Schools
    Wikipedia Selection. Related subjects: ..." paragraph; the footer starts at the last
    line beginning with ``Retrieved from "``. Lines are trimmed, runs of spaces collapsed,
    and runs of blank lines reduced to one. A file without the header keeps all its text.
    """
    header = _HEADER.match(text)
    body = text[header.end():] if header else text
    cut = body.rfind('Retrieved from "')
    if cut >= 0 and not body[body.rfind("\n", 0, cut) + 1:cut].strip():
        body = body[:cut]
    return tidy_whitespace(body)


def _unquote(raw: bytes | str) -> str:
    """URL-unquote a Wikispeedia file name or links.tsv field (UTF-8; invalid → U+FFFD, which
    makes the title invalid)."""
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return unquote(raw)


def _has_member(path: Path, prefix: str) -> bool:
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                if member.name.startswith(prefix):
                    return True
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise IngestError(f"{path}: not a readable tar archive ({exc})") from exc
    return False


def _members(path: Path, max_bytes: int | None = None) -> Iterator[tuple[tarfile.TarInfo, bytes]]:
    """Stream the regular-file members of a tar(.gz) with their bytes (b"" above ``max_bytes``)."""
    last = "none"
    try:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                if max_bytes is not None and member.size > max_bytes:
                    data = b""
                else:
                    fh = tar.extractfile(member)
                    data = fh.read() if fh is not None else b""
                    if len(data) != member.size:
                        raise EOFError(f"member {member.name} has {len(data)} of {member.size} bytes")
                yield member, data
                last = member.name
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise IngestError(f"{path}: truncated or corrupt archive ({type(exc).__name__}: {exc}); "
                          f"last complete member: {last}") from exc
