"""The record every reader yields: one input page (or bad input line) before processing."""
from __future__ import annotations

from dataclasses import dataclass

WIKITEXT, PLAIN = "wikitext", "plain"


@dataclass(slots=True)
class RawPage:
    """One input record as read, before normalisation, cleaning and accounting.

    Attributes
    ----------
    source : str
        Input file name (base name, so artifacts do not depend on where the input lives).
    position : int
        0-based ordinal of the record in ``source``.
    record : str
        What names the record in ``source``: page title, archive member or ``"line N"``.
    n_bytes : int
        Raw UTF-8 bytes of the record's text (0 if unknown).
    page_id : int or None
        Dump page id, if the format has one.
    title : str or None
        Title as written (not normalised); None if missing.
    namespace : int
        MediaWiki namespace number (0 for formats without namespaces).
    text : str or None
        Wikitext (``markup == "wikitext"``) or plain text.
    markup : str
        ``"wikitext"`` or ``"plain"``.
    redirect : str or None
        Raw redirect target, for redirect pages.
    links : list of str or None
        Raw link-target titles for plain formats; wikitext links are extracted from ``text``.
    error : str or None
        Skip reason decided by the reader (``malformed_page``, ``invalid_utf8``, ``oversize``,
        ``malformed_link``).
    detail : str or None
        Human-readable detail of ``error``.
    rev_id : int or None
        Revision id of the text (a dump's last ``<revision><id>``), if the format has one.
    timestamp : str or None
        ISO 8601 timestamp of that revision (``<timestamp>``), if the format has one.
    """

    source: str
    position: int
    record: str
    n_bytes: int = 0
    page_id: int | None = None
    title: str | None = None
    namespace: int = 0
    text: str | None = None
    markup: str = PLAIN
    redirect: str | None = None
    links: list[str] | None = None
    error: str | None = None
    detail: str | None = None
    rev_id: int | None = None
    timestamp: str | None = None
