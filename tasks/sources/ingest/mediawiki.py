"""Streaming reader of MediaWiki ``pages-articles`` XML dumps (export schema 0.x).

Pages are parsed with ``lxml.etree.iterparse`` and cleared as soon as they are read, so memory
does not grow with the dump. Decisions on bad input (documented in ``tasks/sources/ingest/README.md``):

* a ``<page>`` without ``<title>``, ``<ns>`` or revision ``<text>``, or with a non-integer
  ``<ns>``/``<id>`` → record skipped, reason ``malformed_page``;
* invalid UTF-8 bytes → replaced by a marker while streaming; the page holding them is
  skipped, reason ``invalid_utf8`` (bytes outside any page that break the XML → error below);
* malformed XML, a truncated or corrupt compressed stream → :class:`IngestError` naming the
  file, the position and the last complete page (the number of lost pages is unknown, so
  this is never a counted skip).
"""
from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from lxml import etree

from tasks.sources.ingest.config import INVALID_UTF8, MALFORMED_PAGE, IngestError
from tasks.sources.ingest.records import WIKITEXT, RawPage
from tasks.sources.ingest.streams import INVALID_UTF8_MARK, Utf8Guard, open_input
from tasks.sources.ingest.titles import DEFAULT_NAMESPACES
from tasks.sources.ingest.wikitext import redirect_target


class MediaWikiReader:
    """Iterate over the pages of one MediaWiki XML dump.

    Parameters
    ----------
    path : Path
        ``.xml``, ``.xml.bz2`` (single or multistream) or ``.xml.gz`` dump.

    Attributes
    ----------
    namespaces : frozenset of str
        Lower-cased names of the non-main namespaces: :data:`DEFAULT_NAMESPACES` plus those
        declared in the dump's ``<siteinfo>`` (available once the first page is yielded).
    bytes_read : int
        Decompressed bytes read so far.
    opener : callable, optional
        ``() -> binary file`` of the XML to parse instead of ``open_input(path)`` (a byte range
        of a multistream dump, see :mod:`tasks.sources.ingest.multistream`); ``path`` still names
        the source in records and errors.
    """

    def __init__(self, path: Path, opener: Callable[[], BinaryIO] | None = None):
        self.path = Path(path)
        self.namespaces: frozenset[str] = DEFAULT_NAMESPACES
        self.bytes_read = 0
        self._opener = opener or (lambda: open_input(self.path))

    def pages(self) -> Iterator[RawPage]:
        """Yield one :class:`RawPage` per ``<page>`` element, in dump order.

        Raises
        ------
        IngestError
            Malformed XML, truncated/corrupt compressed data (names file, line/column or byte
            offset, and the last complete page).
        """
        source = self.path.name
        position, last = 0, "none (failure before the first page)"
        if self.path.stat().st_size == 0:
            raise IngestError(f"{self.path}: the file is empty (0 bytes), not a MediaWiki XML dump")
        with self._opener() as raw:
            guard = Utf8Guard(raw)
            parser = etree.iterparse(guard, events=("end",), tag=("{*}page", "{*}siteinfo"),
                                     huge_tree=True, remove_comments=True, remove_pis=True)
            try:
                for _, elem in parser:
                    if (_LOCAL.get(elem.tag) or _local_name(elem.tag)) == "siteinfo":
                        self._read_siteinfo(elem)
                    else:
                        page = _page(elem, source, position)
                        position += 1
                        last = f"{page.record!r} (page id {page.page_id})"
                        self.bytes_read = guard.bytes_read
                        yield page
                    release_element(elem)
            except etree.XMLSyntaxError as exc:
                if guard.bytes_read == 0:
                    raise IngestError(f"{self.path}: decompresses to 0 bytes: no XML in it") from exc
                damaged = _compression_error(raw)
                if damaged:
                    raise IngestError(f"{self.path}: compressed data is corrupt ({damaged}) near decompressed byte "
                                      f"{guard.bytes_read}; the XML parser read garbage ({exc.msg}); re-fetch the "
                                      f"file and check its checksum; last complete page: {last}") from exc
                line, col = exc.position if exc.position else (exc.lineno, 0)
                raise IngestError(f"{self.path}: malformed XML at line {line}, column {col}: {exc.msg}; "
                                  f"last complete page: {last}") from exc
            except EOFError as exc:
                raise IngestError(f"{self.path}: compressed stream is truncated after {guard.bytes_read} "
                                  f"decompressed bytes ({exc}); last complete page: {last}") from exc
            except OSError as exc:
                raise IngestError(f"{self.path}: cannot decompress after {guard.bytes_read} bytes ({exc}); "
                                  f"last complete page: {last}") from exc
            self.bytes_read = guard.bytes_read

    def _read_siteinfo(self, elem) -> None:
        names = set(DEFAULT_NAMESPACES)
        for ns in elem.iterfind("{*}namespaces/{*}namespace"):
            if (ns.get("key") or "0") != "0" and ns.text:
                names.add(" ".join(ns.text.replace("_", " ").split()).lower())
        self.namespaces = frozenset(names)



def release_element(elem) -> None:
    """Free a parsed ``<page>`` element of an ``iterparse`` loop and the siblings parsed before it,
    so that memory stays flat over a dump of any size (lxml keeps the whole tree otherwise)."""
    elem.clear(keep_tail=False)
    parent = elem.getparent()
    if parent is not None:
        while elem.getprevious() is not None:
            del parent[0]

_PAGE_PARSER = etree.XMLParser(huge_tree=True, remove_comments=True, remove_pis=True)


def page_from_xml(xml: bytes, source: str, position: int) -> RawPage:
    """The :class:`RawPage` that :meth:`MediaWikiReader.pages` yields for one ``<page>`` element
    ``xml`` (UTF-8 bytes) found at ``position`` of ``source``: the same parser options and the same
    field rules, for pages that come from elsewhere than a dump's streams (adds-changes revisions,
    :mod:`tasks.sources.ingest.changes`).

    Raises ``IngestError`` when ``xml`` is not well-formed."""
    try:
        elem = etree.fromstring(xml, _PAGE_PARSER)
    except etree.XMLSyntaxError as exc:
        raise IngestError(f"{source}: a page at position {position} is malformed XML ({exc.msg})") from exc
    return _page(elem, source, position)


def _page(elem, source: str, position: int) -> RawPage:
    # One pass over the children (the first <title>/<ns>/<id>/<redirect>, the last <revision>), as
    # findtext("{*}title") & co. would find them, at about half the cost of five wildcard searches.
    title = ns_text = id_text = redirect = last_revision = None
    for child in elem:
        name = _LOCAL.get(child.tag) or _local_name(child.tag)
        if name == "revision":
            last_revision = child
        elif name == "title":
            if title is None:
                title = child.text or ""
        elif name == "ns":
            if ns_text is None:
                ns_text = child.text or ""
        elif name == "id":
            if id_text is None:
                id_text = child.text or ""
        elif name == "redirect" and redirect is None:
            redirect = child
    text_elem = rev_id = timestamp = None
    if last_revision is not None:
        for child in last_revision:
            name = _LOCAL.get(child.tag) or _local_name(child.tag)
            if name == "text":
                text_elem = child
                break
            if name == "id" and rev_id is None:
                rev_id = (child.text or "").strip()
            elif name == "timestamp" and timestamp is None:
                timestamp = (child.text or "").strip()
    text = None if text_elem is None else (text_elem.text or "")
    page = RawPage(source=source, position=position, record=title or f"page #{position}", title=title,
                   text=text, markup=WIKITEXT, rev_id=int(rev_id) if rev_id and rev_id.isdigit() else None,
                   timestamp=timestamp or None)
    page.n_bytes = (len(text) if text.isascii() else len(text.encode("utf-8"))) if text else 0
    problems = []
    try:
        page.page_id = int(id_text) if id_text is not None else None
    except ValueError:
        problems.append(f"<id> {id_text!r} is not an integer")
    if not title:
        problems.append("missing <title>")
    if ns_text is None:
        problems.append("missing <ns>")
    else:
        try:
            page.namespace = int(ns_text)
        except ValueError:
            problems.append(f"<ns> {ns_text!r} is not an integer")
    if text_elem is None:
        problems.append("missing <revision><text>")
    if problems:
        page.error, page.detail = MALFORMED_PAGE, "; ".join(problems)
        return page
    if INVALID_UTF8_MARK in title or INVALID_UTF8_MARK in text:
        page.record = title.replace(INVALID_UTF8_MARK, "\ufffd")
        page.error = INVALID_UTF8
        where = "title" if INVALID_UTF8_MARK in title else f"text at character {text.index(INVALID_UTF8_MARK)}"
        page.detail = f"invalid UTF-8 byte(s) in {where}"
        return page
    if redirect is not None and redirect.get("title"):
        page.redirect = redirect.get("title")
    elif redirect is not None or text.lstrip()[:9].upper() == "#REDIRECT":
        page.redirect = redirect_target(text) or ""
    return page


def _compression_error(raw, limit: int = 32 << 20) -> str | None:
    """After an XML error: read on (at most ``limit`` decompressed bytes, more than a bz2 block
    holds) to see whether the compressed stream itself is damaged. A corrupt bz2 block yields
    garbage bytes before its CRC check fails, so the XML parser fails first."""
    if type(raw).__module__ not in ("bz2", "gzip"):
        return None  # plain XML: the file is what the parser saw
    try:
        read = 0
        while read < limit:
            block = raw.read(1 << 20)
            if not block:
                return None
            read += len(block)
    except (OSError, EOFError) as exc:
        return str(exc) or type(exc).__name__
    return None


_LOCAL: dict = {}
"""Tag -> local name (``{ns}title`` -> ``title``), filled as tags are met (a dump has a dozen)."""


def _local_name(tag) -> str | None:
    """Local name of an element tag; ``None`` for comments and processing instructions (their
    ``tag`` is a function), which ``find("{*}x")`` never matches either."""
    if not isinstance(tag, str):
        return None
    name = tag.rsplit("}", 1)[-1]
    if len(_LOCAL) < 1024:   # bounded, whatever tags a damaged dump holds
        _LOCAL[tag] = name
    return name
