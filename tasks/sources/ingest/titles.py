"""Wikipedia title normalisation and link-target classification.

MediaWiki resolves a link target to a page title by decoding HTML entities and percent
escapes, dropping the ``#fragment``, turning underscores into spaces, collapsing runs of
white space, trimming, and (on ``case=first-letter`` wikis such as enwiki) upper-casing the
first character. A target whose prefix before the first colon is a namespace name (``File:``,
``Category:``, ...) or an interwiki/interlanguage prefix (``wikt:``, ``fr:``) does not name a
main-namespace article. Reference: MediaWiki ``Title::newFromText`` / ``TitleParser``.
"""
from __future__ import annotations

import html
import re
from urllib.parse import unquote

# English-Wikipedia namespace names and aliases (``<siteinfo><namespaces>`` of a dump adds its own).
DEFAULT_NAMESPACES: frozenset[str] = frozenset(n.lower() for n in (
    "Media", "Special", "Talk", "User", "User talk", "Wikipedia", "Wikipedia talk", "File",
    "File talk", "MediaWiki", "MediaWiki talk", "Template", "Template talk", "Help", "Help talk",
    "Category", "Category talk", "Portal", "Portal talk", "Book", "Book talk", "Draft",
    "Draft talk", "Education Program", "Education Program talk", "TimedText", "TimedText talk",
    "Module", "Module talk", "Gadget", "Gadget talk", "Gadget definition",
    "Gadget definition talk", "Topic", "Image", "Image talk", "Project", "Project talk", "WP",
    "WT",
))

# Wikimedia interwiki prefixes (case-insensitive); interlanguage codes are matched by pattern.
INTERWIKI_PREFIXES: frozenset[str] = frozenset((
    "w", "wikipedia", "wikt", "wiktionary", "q", "wikiquote", "b", "wikibooks", "s",
    "wikisource", "n", "wikinews", "v", "wikiversity", "voy", "wikivoyage", "species",
    "wikispecies", "c", "commons", "m", "meta", "metawikipedia", "mw", "mediawikiwiki", "d",
    "wikidata", "foundation", "wmf", "phab", "phabricator", "incubator", "outreach", "bugzilla",
    "mediazilla", "testwiki", "wikimedia", "simple", "sep11", "oldwikisource",
))
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]{1,8})*\Z")
_ILLEGAL = re.compile(r"[\[\]{}<>|\x00-\x1f\x7f\ufffd]")
# A target that every step of classify_link / normalise_title leaves as it is, but for the first
# letter: words of characters that are not white space (``\s`` is ``str.isspace``, what
# ``str.split()`` splits on), ``&%#_:`` or forbidden in titles, one ASCII space between words.
_WORD = r"[^\s&%#_:\[\]{}<>|\x00-\x1f\x7f\ufffd]+"
_PLAIN_TARGET = re.compile(rf"{_WORD}(?: {_WORD})*").fullmatch

# Outcomes of :func:`classify_link` (counted in the ingest summary).
ARTICLE, OTHER_NAMESPACE, INTERWIKI, INVALID = "article", "other_namespace", "interwiki", "invalid"


def normalise_title(raw: str) -> str | None:
    """Normalise a page title the way MediaWiki does for the main namespace.

    Steps: HTML-unescape, URL-unquote (``%20``), drop ``#fragment``, underscores and Unicode
    spaces → one space, trim, drop one leading ``:``, upper-case the first character (only when
    it upper-cases to a single character: ``ß`` stays).

    Parameters
    ----------
    raw : str
        Title as written in a dump, a file name (already stripped of ``.txt``) or a link target.

    Returns
    -------
    str or None
        The normalised title; ``None`` when nothing is left (``"#Section"`` self-links, blanks)
        or the title holds characters MediaWiki forbids in titles (``[]{}<>|``, controls).

    Examples
    --------
    >>> normalise_title("albert_Einstein#Early life")
    'Albert Einstein'
    >>> normalise_title("Caf%C3%A9  au_lait")
    'Café au lait'
    """
    title = raw
    if "&" in title:
        title = html.unescape(title)
    if "%" in title:
        try:
            title = unquote(title, errors="strict")
        except UnicodeDecodeError:  # "%FF" is not UTF-8: MediaWiki keeps the text as written
            pass
    cut = title.find("#")
    if cut >= 0:
        title = title[:cut]
    title = " ".join(title.replace("_", " ").split())  # str.split(): all Unicode white space
    if title.startswith(":"):
        title = title[1:].lstrip()
    if not title or _ILLEGAL.search(title):
        return None
    first = title[0].upper()
    if len(first) == 1 and first != title[0]:
        title = first + title[1:]
    return title


def classify_link(raw: str, namespaces: frozenset[str] = DEFAULT_NAMESPACES) -> tuple[str, str | None]:
    """Classify a wikilink target and normalise it when it names a main-namespace article.

    Parameters
    ----------
    raw : str
        The target part of ``[[target|label]]`` (before the first ``|``).
    namespaces : frozenset of str
        Lower-cased namespace names and aliases that are not the main namespace.

    Returns
    -------
    (kind, title) : tuple
        ``kind`` is one of ``"article"`` (``title`` is the normalised title),
        ``"other_namespace"`` (``File:``, ``Category:``, ...), ``"interwiki"`` (``wikt:``,
        ``fr:``) or ``"invalid"`` (empty, ``#section`` only, forbidden characters); ``title``
        is ``None`` unless ``kind == "article"``.
    """
    if _PLAIN_TARGET(raw):   # most targets: only the first letter can change (same result, ~2x faster)
        first = raw[0].upper()
        return ARTICLE, first + raw[1:] if len(first) == 1 and first != raw[0] else raw
    return _classify_general(raw, namespaces)


def _classify_general(raw: str, namespaces: frozenset[str]) -> tuple[str, str | None]:
    """:func:`classify_link` step by step (every target; the fast path must agree with it)."""
    text = raw.strip()
    if text.startswith(":"):
        text = text[1:]
    colon = text.find(":")
    if colon > 0:
        prefix_raw = text[:colon].strip()
        prefix = " ".join(prefix_raw.replace("_", " ").split()).lower()
        if prefix in namespaces:
            return OTHER_NAMESPACE, None
        if prefix in INTERWIKI_PREFIXES or (prefix_raw.islower() and _LANGUAGE_CODE.match(prefix_raw)):
            return INTERWIKI, None
    title = normalise_title(text)
    if title is None:
        return INVALID, None
    return ARTICLE, title

