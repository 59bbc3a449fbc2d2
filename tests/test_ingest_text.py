"""Ingest text layer: title normalisation, wikitext cleaning and links (against mwparserfromhell
on the real enwiki sample), disambiguation detection, redirect resolution."""
from __future__ import annotations

import bz2
import io
import re
from collections import Counter

import mwparserfromhell
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lxml import etree

from funnelrag.datasets import resolve
from tasks.sources.ingest import IngestConfig
from tasks.sources.ingest.redirects import resolve_redirects
from tasks.sources.ingest.titles import (DEFAULT_NAMESPACES, _PLAIN_TARGET, _classify_general, classify_link,
                                       normalise_title)
from tasks.sources.ingest.wikitext import (clean_wikitext, extract_link_targets, is_disambiguation,
                                   redirect_target, strip_tables, strip_templates)


# ----------------------------------------------------------------------------- titles
@pytest.mark.parametrize("raw,expected", [
    ("Albert_Einstein", "Albert Einstein"),                 # underscores -> spaces
    ("albert Einstein", "Albert Einstein"),                 # first letter upper-cased
    ("Albert Einstein#Early life", "Albert Einstein"),      # anchor dropped
    ("Caf%C3%A9_au_lait", "Café au lait"),                  # URL-unquoted (UTF-8)
    ("  New   York\u00a0City ", "New York City"),           # white space collapsed and trimmed
    ("AT&amp;T", "AT&T"),                                   # HTML entity
    (":Paris", "Paris"),                                    # leading colon
    ("ßtraße", "ßtraße"),                                   # 'ß'.upper() is two letters: kept
    ("100%", "100%"),                                       # a lone % is not an escape
    ("%FF", "%FF"),                                         # invalid UTF-8 escape kept as written
    ("iPod", "IPod"),                                       # MediaWiki first-letter case
    ("Avatar__The_Last_Airbender", "Avatar The Last Airbender"),
    ("#History", None),                                     # section link of the same page
    ("   ", None),
    ("A[b]", None),                                         # forbidden characters
    ("{{PAGENAME}}", None),
])
def test_normalise_title(raw, expected):
    assert normalise_title(raw) == expected


def test_normalise_title_is_idempotent():
    for raw in ("Caf%C3%A9_au_lait", "albert_Einstein#x", "  New   York  ", "AT&amp;T"):
        once = normalise_title(raw)
        assert normalise_title(once) == once


@pytest.mark.parametrize("raw,kind,title", [
    ("Paris", "article", "Paris"),
    ("paris_(city)#History", "article", "Paris (city)"),
    ("File:Eiffel.jpg", "other_namespace", None),
    ("Image:Eiffel.jpg", "other_namespace", None),
    ("category : Cities", "other_namespace", None),
    (":Category:Cities", "other_namespace", None),
    ("Wikipedia:Neutral point of view", "other_namespace", None),
    ("WP:NPOV", "other_namespace", None),
    ("Template_talk:Foo", "other_namespace", None),
    ("fr:Paris", "interwiki", None),
    ("zh-min-nan:Paris", "interwiki", None),
    ("wikt:paris", "interwiki", None),
    ("Wiktionary:paris", "interwiki", None),
    ("Star Wars: Episode IV", "article", "Star Wars: Episode IV"),  # colon inside a title
    ("Ys: The Vanished Omens", "article", "Ys: The Vanished Omens"),  # capitalised: not a language code
    ("#See also", "invalid", None),
    ("", "invalid", None),
])
def test_classify_link(raw, kind, title):
    assert classify_link(raw) == (kind, title)


# Characters each step of the general path treats specially, plus ordinary and case-changing ones.
_TARGET_ALPHABET = list("aZé ß_&%#:|[]{}<>.,'-()0") + ["\t", "\n", "\xa0", "\u2003", "\x1f", "\x7f", "\ufffd", "ǆ",
                                                       "ﬁ", "ŉ", "&amp;", "%20", "%C3%A9", "fr:", "File:", "wikt:"]


@pytest.mark.slow  # 3,000 hypothesis examples
@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_TARGET_ALPHABET), max_size=8).map("".join))
def test_classify_link_fast_path_equals_the_general_path(raw):
    """classify_link takes a regex fast path for plain targets: it must return what the step-by-step
    path returns for every string (the fast path is taken or not; either way the same answer)."""
    assert classify_link(raw) == _classify_general(raw, DEFAULT_NAMESPACES)


def test_classify_link_fast_path_is_taken_for_plain_targets():
    assert _PLAIN_TARGET("paris Texas") and _PLAIN_TARGET("Ǆemal Bijedić")
    for raw in (" paris", "paris ", "a  b", "a_b", "a\xa0b", "x:y", "a&amp;b", "a%20b", "a#b", "a|b", ""):
        assert not _PLAIN_TARGET(raw), raw


# ----------------------------------------------------------------------------- wikitext
def test_clean_wikitext_drops_markup_and_keeps_labels():
    text = (
        "{{Infobox person|name=X|birth={{birth date|1900|1|1}}}}\n"
        "'''Ada''' was a [[mathematician]] from [[London|the capital]]<ref name=a>Cite {{cite|x}}</ref>"
        " who wrote about [[Analytical Engine]]s.<ref name=a/> <!-- hidden [[Comment link]] -->\n"
        "== Early life ==\n"
        "* She met [[Charles Babbage|Babbage]] &amp; others.\n"
        "[[File:Ada.jpg|thumb|Portrait with [[Babbage]] [and a cat]]]\n"
        "{| class=wikitable\n|-\n| cell with [[Table link]]\n|}\n"
        "See [http://example.org the site] and [http://example.org].\n"
        "[[Category:Mathematicians]]\n[[fr:Ada Lovelace]]\n__NOTOC__\n"
    )
    out = clean_wikitext(text)
    assert out.splitlines()[0] == "Ada was a mathematician from the capital who wrote about Analytical Engines."
    assert "Early life" in out.splitlines()
    assert "She met Babbage & others." in out.splitlines()
    assert "See the site and ." in out
    for gone in ("Infobox", "birth", "Cite", "Comment link", "Portrait", "Table link", "cell", "Category",
                 "Mathematicians", "Ada Lovelace", "NOTOC", "{", "}", "[", "]", "<", "'''", "==", "*"):
        assert gone not in out, gone


def test_strip_templates_nested_params_and_unbalanced():
    assert strip_templates("a {{x|{{y|{{{1|z}}}}}}} b") == "a  b"
    assert strip_templates("a {{x|{{y}} b") == "a {{x| b"          # unclosed opener stays literal
    assert strip_templates("a }} b {{z}}") == "a }} b "              # stray closer stays literal
    assert strip_templates("{{{{x}}|y}}c") == "c"


def test_strip_tables_nested_and_unclosed():
    assert strip_tables("a\n{|\n| x\n{|\n| y\n|}\n| z\n|}\nb") == "a\nb"
    assert strip_tables("a\n{|\n| x\n") == "a\n"


def test_pipe_trick_and_blend():
    assert clean_wikitext("[[Paris, Texas|]] and [[Mercury (planet)|]]") == "Paris and Mercury"
    assert clean_wikitext("two [[bus]]es") == "two buses"


def test_extract_link_targets_includes_nested_and_templated_links_not_comments():
    text = "[[A|x]] {{Infobox|capital=[[B]]}} [[File:c.jpg|thumb|[[C]]]] <!-- [[D]] --> [[E#s]]"
    assert extract_link_targets(text) == ["A", "B", "File:c.jpg", "C", "E#s"]


def test_redirect_target():
    assert redirect_target("#REDIRECT [[Computer accessibility]] {{R from CamelCase}}") == "Computer accessibility"
    assert redirect_target("#redirect:[[Foo#Bar]]") == "Foo#Bar"
    assert redirect_target("Text with #REDIRECT [[X]]") is None


# ----------------------------------------------------------------------------- real enwiki sample
@pytest.fixture(scope="module")
def enwiki_pages(data_mirror) -> dict[str, str]:
    """``{title: wikitext}`` of the real main-namespace, non-redirect pages (independent parse)."""
    xml = bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes())
    pages = {}
    for _, el in etree.iterparse(io.BytesIO(xml), tag="{*}page"):
        if el.findtext("{*}ns") == "0" and el.find("{*}redirect") is None:
            pages[el.findtext("{*}title")] = el.findtext("{*}revision/{*}text") or ""
        el.clear()
    assert len(pages) == 106
    return pages


@pytest.fixture(scope="module")
def parsed(enwiki_pages) -> dict[str, "mwparserfromhell.wikicode.Wikicode"]:
    """The reference parse (mwparserfromhell, ~1.8 MB/s), done once for the module."""
    return {title: mwparserfromhell.parse(text) for title, text in enwiki_pages.items()}


@pytest.mark.slow  # mwparserfromhell's parse of every enwiki-sample page (reference, module fixture)
def test_cleaner_agrees_with_mwparserfromhell_strip_code(enwiki_pages, parsed):
    """Reference comparison: every word we keep is a word ``strip_code`` keeps (precision),
    and we keep most of its words (it also keeps reference and table text, which we drop)."""
    words = re.compile(r"\w+")
    ours_total = ref_total = agree = 0
    for title, text in enwiki_pages.items():
        ours = words.findall(clean_wikitext(text).lower())
        ref = words.findall(parsed[title].strip_code().lower())
        ref_vocab = set(ref)
        agree += sum(w in ref_vocab for w in ours)
        ours_total += len(ours)
        ref_total += len(ref)
    assert agree / ours_total > 0.999
    assert 0.7 < ours_total / ref_total < 1.0


@pytest.mark.slow  # mwparserfromhell's parse of every enwiki-sample page (reference, module fixture)
def test_link_extraction_agrees_with_mwparserfromhell(enwiki_pages, parsed):
    """Every wikilink mwparserfromhell finds (recursively) is found; we also see gallery/imagemap links."""
    ours_total = ref_total = 0
    for title, text in enwiki_pages.items():
        ours = Counter(t.strip() for t in extract_link_targets(text))
        ref = Counter(str(w.title).strip() for w in parsed[title].filter_wikilinks(recursive=True))
        assert not ref - ours
        ours_total += sum(ours.values())
        ref_total += sum(ref.values())
    assert ref_total <= ours_total < 1.01 * ref_total


@pytest.mark.slow  # mwparserfromhell's parse of every enwiki-sample page (reference, module fixture)
def test_disambiguation_detection_matches_mwparserfromhell_templates(enwiki_pages, parsed):
    templates = IngestConfig().template_set()
    expected = {title for title, text in enwiki_pages.items()
                if title.endswith("(disambiguation)")
                or any(str(t.name).strip().lower().replace("_", " ") in templates
                       for t in parsed[title].filter_templates(recursive=True))}
    found = {title for title, text in enwiki_pages.items() if is_disambiguation(title, text, templates)}
    assert found == expected
    assert len(found) >= 7  # the sample has 7 "... may refer to:" pages and a {{geodis}} river list


def test_disambiguation_by_title_only():
    assert is_disambiguation("Mercury (disambiguation)", None, frozenset())
    assert not is_disambiguation("Mercury", "{{Infobox planet}}", frozenset({"disambiguation"}))
    assert is_disambiguation("Mercury", "text\n{{Disambiguation|geo}}", frozenset({"disambiguation"}))
    assert is_disambiguation("Mercury", "{{Template:disambig}}", frozenset({"disambig"}))


# ----------------------------------------------------------------------------- redirects
def test_resolve_redirects_chains_cycles_dangling_excluded():
    ids = {"Paris": 0, "Rome": 1}
    targets = {"A": "Paris", "B": "A", "C": "B", "X": "Y", "Y": "X", "Z": "X", "S": "S",
               "D": "Nowhere", "E": None, "F": "Mercury (disambiguation)", "G": "F"}
    rows, resolved = resolve_redirects(targets, ids, {"Mercury (disambiguation)"})
    by = {r[0]: r[1:] for r in rows}
    assert [r[0] for r in rows] == sorted(targets)
    assert by["A"] == ("Paris", "resolved", 1)
    assert by["B"] == ("Paris", "resolved", 2)
    assert by["C"] == ("Paris", "resolved", 3)
    assert by["X"][:2] == by["Y"][:2] == by["Z"][:2] == by["S"][:2] == (None, "cycle")
    assert by["D"] == (None, "dangling", 1)
    assert by["E"] == (None, "dangling", 1)
    assert by["F"] == (None, "excluded", 1)
    assert by["G"] == (None, "excluded", 2)
    assert resolved == {"A": 0, "B": 0, "C": 0}
