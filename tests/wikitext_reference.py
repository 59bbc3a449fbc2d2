"""Reference for the fast wikitext cleaner: ``clean_wikitext`` of ``tasks/sources/ingest/wikitext.py``
as it was before its 2x speed-up, frozen. ``tests/test_ingest_wikitext_fast.py``
checks that the pipeline's cleaner gives the same string, character for character, on real, synthetic
and random wikitext. Not used by the pipeline.
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
_DROP_PAIRED = re.compile(r"<(%s)\b[^>]*?(?<!/)>.*?</\1\s*>" % "|".join(_DROP_TAGS), re.S | re.I)
_DROP_SELF = re.compile(r"<(?:%s)\b[^>]*/>" % "|".join(_DROP_TAGS), re.I)
_BRACES = re.compile(r"\{\{+|\}\}+")
_TABLE = re.compile(r"^[ \t:]*(\{\||\|\})[^\n]*\n?", re.M)
# [[inner]]: inner has no "[[" or "]]" but may hold "[single brackets]" (possessive: no backtracking).
_LINK = re.compile(r"\[\[((?:\[[^\[\]]*\]|[^\[\]]|\[(?!\[)|\](?!\]))*+)\]\]")
_EXT_LINK = re.compile(r"\[(?:https?:|ftp:|ftps:|mailto:|news:|irc:|ircs:|//)[^\s\]]*(?:[ \t]+([^\]\n]*))?\]", re.I)
_HEADING = re.compile(r"^(={1,6})[ \t]*(.+?)[ \t]*\1[ \t]*$", re.M)
_LIST = re.compile(r"^[*#:;]+[ \t]*", re.M)
_RULE = re.compile(r"^-{4,}[ \t]*$", re.M)
_BOLD_ITALIC = re.compile(r"'{2,}")
_MAGIC = re.compile(r"__[A-Z]+__")
_HTML_TAG = re.compile(r"</?[a-zA-Z][a-zA-Z0-9]*(?:\s[^<>]*)?/?>")
_EMPTY_PARENS = re.compile(r"\(\s*(?:[,;:]\s*)*\)")
_PAREN_LEAD = re.compile(r"\(\s*[,;:]\s*")
_BLANKS = re.compile(r"\n{3,}")
_INVISIBLE_PREFIXES = frozenset(("file", "image", "media", "category"))
_LANG = re.compile(r"[a-z]{2,3}(?:-[a-z0-9]{1,8})*\Z")


def clean_wikitext(text: str) -> str:
    """Convert wikitext to plain text.

    Parameters
    ----------
    text : str
        Wikitext of one page (``<revision><text>`` of a ``pages-articles`` dump).

    Returns
    -------
    str
        Plain text: paragraphs separated by one blank line, no markup, templates, references,
        tables, files or categories; link labels kept. Empty string when nothing remains.
    """
    text = _COMMENT.sub("", text)
    if "<" in text:
        text = _DROP_PAIRED.sub("", text)
        text = _DROP_SELF.sub("", text)
    text = strip_templates(text)
    text = strip_tables(text)
    if "[" in text:
        text = _EXT_LINK.sub(lambda m: m.group(1) or "", text)
    if "[[" in text:
        previous = None
        while previous != text:  # innermost first: file captions hold links
            previous, text = text, _LINK.sub(_link_label, text)
    text = _HEADING.sub(r"\2", text)
    text = _LIST.sub("", text)
    text = _RULE.sub("", text)
    text = _BOLD_ITALIC.sub("", text)
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
    """Collapse white space inside lines, trim lines, keep at most one blank line in a row."""
    text = "\n".join(" ".join(line.split()) for line in text.split("\n"))
    return _BLANKS.sub("\n\n", text).strip()


def strip_templates(text: str) -> str:
    """Remove templates, parser functions and template parameters (``{{...}}``, ``{{{...}}}``).

    Nesting is followed with a stack over brace runs, as MediaWiki's preprocessor does; an
    opener that is never closed and a stray closer stay as literal text.
    """
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
    if "{|" not in text:
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


def _link_label(m: re.Match) -> str:
    inner = m.group(1)
    target, sep, label = inner.partition("|")
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
