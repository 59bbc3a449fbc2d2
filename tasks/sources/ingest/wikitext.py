"""Wikitext → plain text, wikilink extraction, redirect and disambiguation detection.

A scanning/regex cleaner in the style of WikiExtractor (Attardi) rather than a full
``mwparserfromhell`` parse: it drops comments, ``<ref>``/``<math>``/``<gallery>``-like tags with
their content, templates and parser functions (``{{...}}``, ``{{{...}}}``, nested), tables
(``{| ... |}``, nested), file/image/category/interlanguage links; it keeps the labels of
wikilinks (``[[Target|label]]`` → ``label``, ``[[bus]]es`` → ``buses``) and external links,
heading text, list item text, and unescapes HTML entities. ``tests/test_ingest_wikitext.py``
compares it with ``mwparserfromhell``'s ``strip_code`` on the real enwiki sample;
``benchmarks/bench_ingest.py`` measures its throughput.
"""
from __future__ import annotations

import html
import re

from tasks.sources.ingest.titles import INTERWIKI_PREFIXES

_COMMENT = re.compile(r"<!--.*?(?:-->|\Z)", re.S)
# Extension tags whose content is not article prose.
_DROP_TAGS = ("ref", "references", "gallery", "math", "chem", "ce", "timeline", "score", "graph",
              "imagemap", "syntaxhighlight", "source", "templatedata", "mapframe", "maplink",
              "includeonly", "inputbox", "categorytree", "hiero", "indicator", "templatestyles")
# The content up to the first closing tag, as ``.*?</\1\s*>`` would find it, but in possessive runs of
# characters other than "<" (a lazy ``.*?`` tries the closing tag after every character).
_DROP_PAIRED = re.compile(r"<(%s)\b[^>]*?(?<!/)>(?:[^<]++|<(?!/\1\s*>))*+</\1\s*>" % "|".join(_DROP_TAGS), re.I)
_DROP_SELF = re.compile(r"<(?:%s)\b[^>]*/>" % "|".join(_DROP_TAGS), re.I)
_BRACES = re.compile(r"\{\{+|\}\}+")
# A template without braces inside whose "{{" and "}}" are runs of exactly two: the stack below pairs
# them with each other whatever surrounds them, and removing them joins no brace runs.
_FLAT_TEMPLATE = re.compile(r"\{\{(?<!\{\{\{)[^{}]*+\}\}(?!\})")   # literal prefix first: fast search
_TABLE = re.compile(r"^[ \t:]*(\{\||\|\})[^\n]*\n?", re.M)
# [[inner]]: inner has no "[[" or "]]" but may hold "[single brackets]" (possessive: no backtracking;
# runs of bracket-free characters are taken at once).
_LINK = re.compile(r"\[\[((?:[^\[\]]++|\[[^\[\]]*\]|\[(?!\[)|\](?!\]))*+)\]\]")
_EXT_LINK = re.compile(r"\[(?:https?:|ftp:|ftps:|mailto:|news:|irc:|ircs:|//)[^\s\]]*(?:[ \t]+([^\]\n]*))?\]", re.I)
# Line-start patterns match the newline before the line (a literal first character lets the regex
# engine skip ahead to candidates); they run on "\n" + text and put the newline back.
_HEADING = re.compile(r"\n(={1,6})[ \t]*(.+?)[ \t]*\1[ \t]*$", re.M)
_LIST = re.compile(r"\n[*#:;]+[ \t]*")
_RULE = re.compile(r"\n-{4,}[ \t]*$", re.M)
_BOLD_ITALIC = re.compile(r"''+")
_MAGIC = re.compile(r"__[A-Z]+__")
_HTML_TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>]*)?/?>")
_EMPTY_PARENS = re.compile(r"\(\s*(?:[,;:]\s*)*\)")
_PAREN_LEAD = re.compile(r"\(\s*[,;:]\s*")
_BLANKS = re.compile(r"\n\n\n+")
_SPACES = re.compile(r"  +")
_NEWLINE_SPACE = re.compile(r"\n ")
_SPACE_NEWLINE = re.compile(r" \n")
# White space other than " " and "\n" (str.isspace: tabs, NBSP, ...; none above U+3000).
_OTHER_SPACES = tuple(c for c in map(chr, range(0x3001)) if c.isspace() and c not in " \n")
_OTHER_SPACES_ASCII = tuple(c for c in _OTHER_SPACES if c.isascii())
_LINK_TARGET = re.compile(r"\[\[([^\[\]|\n]*)(?=\||\]\])")
_TEMPLATE_NAME = re.compile(r"\{\{\s*([^{}|\n]+?)\s*(?=\||\}\})")
_REDIRECT = re.compile(r"\A\s*#REDIRECT\s*:?\s*\[\[([^\[\]|\n]+)", re.I)
_INVISIBLE_PREFIXES = frozenset(("file", "image", "media", "category"))
_LANG = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]{1,8})*\Z")
_DISAMBIG_TITLE = re.compile(r"\(disambiguation\)\s*\Z", re.I)

DEFAULT_DISAMBIGUATION_TEMPLATES: tuple[str, ...] = (
    "disambiguation", "disambig", "disamb", "dab", "dis", "disambiguation page", "hndis",
    "human name disambiguation", "geodis", "geo-dis", "schooldis", "school disambiguation",
    "hospitaldis", "hospital disambiguation", "mathdab", "math dab", "numberdis",
    "number disambiguation", "letter-number combination disambiguation", "lnd", "roaddis",
    "road disambiguation", "callsigndis", "call sign disambiguation", "species latin name disambiguation",
    "chinese title disambiguation", "mil-unit-dis", "military unit disambiguation", "shipindex",
)
"""Template names (lower case, ``_`` → space) marking a disambiguation page on enwiki.
``shipindex`` pages list ships of one name and are treated like disambiguation pages."""


def clean_wikitext(text: str, *, comments_removed: bool = False) -> str:
    """Convert wikitext to plain text.

    Parameters
    ----------
    text : str
        Wikitext of one page (``<revision><text>`` of a ``pages-articles`` dump).
    comments_removed : bool
        ``text`` is already :func:`remove_comments` of the page (the ingest removes them once for
        the cleaner and the link extraction); they are not removed again (removing a comment can
        join ``<!-`` and ``-`` into a new ``<!--``, which a second removal would act on).

    Returns
    -------
    str
        Plain text: paragraphs separated by one blank line, no markup, templates, references,
        tables, files or categories; link labels kept. Empty string when nothing remains.
    """
    if not comments_removed:
        text = remove_comments(text)
    if "<" in text:
        text = _DROP_PAIRED.sub("", text)
        text = _DROP_SELF.sub("", text)
    text = strip_templates(text)
    text = strip_tables(text)
    if "[" in text:
        text = _EXT_LINK.sub(r"\1", text)   # the label, or nothing (an unmatched group is "")
    if "[[" in text:
        text = _replace_links(text)
    text = "\n" + text
    text = _HEADING.sub("\n\\2", text)
    text = _LIST.sub("\n", text)
    text = _RULE.sub("\n", text)   # (no `"----" in text` test first: see tidy_whitespace)
    text = text[1:]
    if "''" in text:
        text = _BOLD_ITALIC.sub("", text)
    if "_" in text and "__" in text:   # a one-character search first: ~7x faster when there is no "_"
        text = _MAGIC.sub("", text)
    if "<" in text:
        text = _HTML_TAG.sub("", text)
    if "&" in text:
        text = html.unescape(text)
    if "(" in text:
        text = _EMPTY_PARENS.sub("", text)
        text = _PAREN_LEAD.sub("(", text)
    return tidy_whitespace(text)


def tidy_whitespace(text: str) -> str:
    """Collapse white space inside lines, trim lines, keep at most one blank line in a row.

    White space is what ``str.split()`` splits on; lines end at ``"\n"`` only. Same result as
    ``"\n".join(" ".join(line.split()) for line in text.split("\n"))`` with blank-line runs cut
    to one, but with string replacements instead of a list of words per line.
    """
    for char in _OTHER_SPACES_ASCII if text.isascii() else _OTHER_SPACES:
        if char in text:
            text = text.replace(char, " ")
    if "  " in text:
        text = _SPACES.sub(" ", text)
    # Regex passes rather than `"x" in text` tests: the regex engine finds a literal of 2-3 characters
    # ~1.5x faster than str's multi-character search, which a test that finds nothing pays in full.
    text = _SPACE_NEWLINE.sub("\n", text)
    text = _NEWLINE_SPACE.sub("\n", text)
    text = _BLANKS.sub("\n\n", text)
    return text.strip()


def strip_templates(text: str) -> str:
    """Remove templates, parser functions and template parameters (``{{...}}``, ``{{{...}}}``).

    Nesting is followed with a stack over brace runs, as MediaWiki's preprocessor does; an
    opener that is never closed and a stray closer stay as literal text. Templates with no braces
    inside (:data:`_FLAT_TEMPLATE`) are removed first by one regex substitution, twice (the innermost,
    then the level above them): the stack would pair their ``{{`` and ``}}`` with each other, so the
    result is the same (``tests/test_ingest_wikitext_fast.py``) at half the CPU on the 1M-page
    synthetic dump, where that leaves no brace for the stack.
    """
    if "{{" not in text:
        return text
    text = _FLAT_TEMPLATE.sub("", text)   # most templates, in C; then innermost-first once more
    if "{{" not in text:
        return text
    text = _FLAT_TEMPLATE.sub("", text)
    if "{{" not in text:
        return text
    stack: list[tuple[int, int]] = []  # (start offset, width 2 or 3)
    spans: list[tuple[int, int]] = []
    for m in _BRACES.finditer(text):
        pos, n = m.start(), m.end() - m.start()
        if text[pos] == "{":
            widths = [3] if n == 3 else [2] * (n // 2) if n % 2 == 0 else [2] * ((n - 3) // 2) + [3]
            for w in widths:
                stack.append((pos, w))
                pos += w
            continue
        while n >= 2 and stack:
            start, w = stack.pop()
            used = 3 if (w == 3 and n >= 3) else 2
            n -= used
            pos += used
            spans.append((start, pos))
    return _cut(text, spans)


def strip_tables(text: str) -> str:
    """Remove wiki tables (``{|`` ... ``|}`` lines, nested); an unclosed table runs to the end."""
    if "{" not in text or "{|" not in text:   # one-character scans are ~7x faster (braces are rare here)
        return text
    depth, start = 0, 0
    spans: list[tuple[int, int]] = []
    for m in _TABLE.finditer(text):
        if m.group(1) == "{|":
            if depth == 0:
                start = m.start()
            depth += 1
        elif depth:
            depth -= 1
            if depth == 0:
                spans.append((start, m.end()))
    if depth:
        spans.append((start, len(text)))
    return _cut(text, spans)


def extract_link_targets(text: str, *, comments_removed: bool = False) -> list[str]:
    """Raw targets of every ``[[target]]`` / ``[[target|label]]`` in ``text``, in order.

    Comments are ignored (``comments_removed``: ``text`` is already :func:`remove_comments` of
    the page); links inside templates, tables, references and file captions count (they are
    hyperlinks of the rendered page). Targets are not normalised (see
    :func:`tasks.sources.ingest.titles.classify_link`).
    """
    if "[[" not in text:
        return []
    if not comments_removed:
        text = remove_comments(text)
    return _LINK_TARGET.findall(text)


def remove_comments(text: str) -> str:
    """``text`` without HTML comments (``<!-- ... -->``; an unclosed one runs to the end).

    A regex search for the literal ``<!--`` scans a page ~1.5x faster than ``"<!--" in text``
    (multi-character ``str`` searches are the slow path of CPython's ``fastsearch``)."""
    return _COMMENT.sub("", text)


def redirect_target(text: str) -> str | None:
    """Target of a ``#REDIRECT [[Target]]`` page, or ``None`` (dumps without ``<redirect>``)."""
    m = _REDIRECT.match(text)
    return m.group(1) if m else None


def is_disambiguation(title: str, text: str | None, templates: frozenset[str]) -> bool:
    """True when ``title`` ends in ``(disambiguation)`` or ``text`` uses one of ``templates``.

    Parameters
    ----------
    title : str
        Normalised page title.
    text : str or None
        Wikitext (``None`` or plain text for formats without templates).
    templates : frozenset of str
        Lower-case template names with spaces (see :data:`DEFAULT_DISAMBIGUATION_TEMPLATES`).
    """
    if _DISAMBIG_TITLE.search(title):
        return True
    if not text or "{{" not in text or not templates:
        return False
    for name in _TEMPLATE_NAME.findall(text):
        key = " ".join(name.replace("_", " ").lower().split())
        if key.startswith("template:"):
            key = key[len("template:"):].strip()
        if key in templates:
            return True
    return False


def _replace_links(text: str) -> str:
    """Replace every wikilink by its label, innermost first (file captions hold links), until none
    is left: each round is ``_LINK.sub`` with :func:`_link_label`, done as a split and one list of
    labels (no match object or callback per link)."""
    while True:
        parts = _LINK.split(text)
        if len(parts) == 1:
            return text
        parts[1::2] = [_link_label(inner) for inner in parts[1::2]]
        text = "".join(parts)
        if "[[" not in text:
            return text


def _link_label(inner: str) -> str:
    """What ``[[inner]]`` renders inline: the label, the target, or nothing (files, categories,
    interlanguage links)."""
    target, sep, label = inner.partition("|")
    if ":" not in target:   # no namespace or language prefix: the two common cases first
        if sep:
            if label and not label.isspace():
                return label
        elif "#" not in target:
            return target.strip()
    target = target.strip()
    leading_colon = target.startswith(":")
    colon = target.find(":", 1 if leading_colon else 0)
    if colon > 0 and not leading_colon:
        prefix = target[:colon].strip()
        low = prefix.lower()
        if low in _INVISIBLE_PREFIXES or (prefix.islower() and _LANG.match(prefix) and low not in INTERWIKI_PREFIXES):
            return ""  # files, categories and interlanguage links render nothing inline
    if leading_colon:
        target = target[1:]
    if not sep:
        return target.split("#", 1)[0] if not target.startswith("#") else target[1:]
    if label.strip():
        return label
    # Pipe trick: [[Paris, Texas|]] -> "Paris", [[Foo (bar)|]] -> "Foo".
    base = target.split(":", 1)[-1]
    return re.sub(r"\s*\([^)]*\)\s*\Z", "", base).split(",", 1)[0].strip()


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the union of ``spans`` (half-open [start, end) character ranges)."""
    if not spans:
        return text
    spans.sort()
    parts, pos = [], 0
    for start, end in spans:
        if end <= pos:
            continue
        if start > pos:
            parts.append(text[pos:start])
        pos = max(pos, end)
    parts.append(text[pos:])
    return "".join(parts)
