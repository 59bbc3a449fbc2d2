"""Reader of generic JSON-lines corpora: one object per line with ``title`` (str), ``text``
(str, plain text) and optional ``links`` (list of titles) and ``id`` (int page id).

Bad input is a counted skip, never an error: a line that is not valid UTF-8 → ``invalid_utf8``;
not a JSON object, or ``title``/``text``/``links`` of the wrong type → ``malformed_page``
(``detail`` says which); blank lines are not records. A truncated ``.gz``/``.bz2`` →
:class:`IngestError` naming the file and line.
"""
from __future__ import annotations

import json
import zlib
from pathlib import Path
from typing import Iterator

from tasks.sources.ingest.config import INVALID_UTF8, MALFORMED_PAGE, OVERSIZE, IngestError
from tasks.sources.ingest.records import PLAIN, RawPage
from tasks.sources.ingest.streams import open_input


class JsonlReader:
    """Iterate over the records of one JSONL file (plain, ``.gz`` or ``.bz2``).

    Parameters
    ----------
    path : Path
        The JSONL file.
    max_page_bytes : int
        Lines longer than this many bytes are not parsed (``oversize``).
    """

    def __init__(self, path: Path, max_page_bytes: int):
        self.path = Path(path)
        self.max_page_bytes = max_page_bytes
        self.bytes_read = 0

    def pages(self) -> Iterator[RawPage]:
        """Yield one :class:`RawPage` per non-blank line (``record`` = ``"line N"``, 1-based).

        Raises
        ------
        IngestError
            The compressed stream is truncated or corrupt.
        """
        lineno = 0
        try:
            with open_input(self.path) as fh:
                for lineno, raw in enumerate(fh, start=1):
                    self.bytes_read += len(raw)
                    if not raw.strip():
                        continue
                    yield self._record(raw, lineno)
        except (EOFError, OSError, zlib.error) as exc:
            raise IngestError(f"{self.path}: truncated or corrupt input after line {lineno} ({exc})") from exc

    def _record(self, raw: bytes, lineno: int) -> RawPage:
        page = RawPage(source=self.path.name, position=lineno - 1, record=f"line {lineno}",
                       n_bytes=len(raw), markup=PLAIN)
        if len(raw) > self.max_page_bytes:
            page.error, page.detail = OVERSIZE, f"{len(raw)} bytes"
            return page
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            page.error, page.detail = INVALID_UTF8, f"invalid UTF-8 at byte {exc.start}"
            return page
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            page.error, page.detail = MALFORMED_PAGE, f"invalid JSON: {exc.msg} at column {exc.colno}"
            return page
        if not isinstance(obj, dict):
            page.error, page.detail = MALFORMED_PAGE, f"expected a JSON object, got {type(obj).__name__}"
            return page
        title, text, links, page_id = obj.get("title"), obj.get("text"), obj.get("links"), obj.get("id")
        problems = []
        if not isinstance(title, str) or not title.strip():
            problems.append("'title' missing or not a non-empty string")
        if not isinstance(text, str):
            problems.append("'text' missing or not a string")
        if links is not None and not (isinstance(links, list) and all(isinstance(x, str) for x in links)):
            problems.append("'links' is not a list of strings")
        if page_id is not None and (not isinstance(page_id, int) or isinstance(page_id, bool)):
            problems.append("'id' is not an integer")
        if isinstance(title, str) and title.strip():
            page.record = f"line {lineno}: {title[:200]}"
        if problems:
            page.error, page.detail = MALFORMED_PAGE, "; ".join(problems)
            return page
        try:  # JSON escapes can encode lone surrogates, which are not UTF-8
            page.n_bytes = len(text.encode("utf-8"))
            title.encode("utf-8")
            for link in links or ():
                link.encode("utf-8")
        except UnicodeEncodeError as exc:
            page.error, page.detail = INVALID_UTF8, f"unpaired surrogate escape ({exc.reason})"
            return page
        page.title, page.text, page.links, page.page_id = title, text.strip(), list(links or []), page_id
        return page
