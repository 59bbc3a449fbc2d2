"""The fast wikitext cleaner gives the reference cleaner's output, character for character.

``tests/wikitext_reference.py`` is ``clean_wikitext`` as it was before its 2x speed-up; the
pipeline's cleaner must not change one byte of any document (the corpus digests are pinned
elsewhere). Checked on every page of the real enwiki sample, on synthetic enwiki-like pages, on
hand-written edge cases and on random strings made of wikitext's special tokens.
"""
from __future__ import annotations

import bz2
import io
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from benchmarks.synth_dump import article_text, make_plan, page_xml, sample_words
from funnelrag.datasets import resolve
from tasks.sources.ingest import wikitext
from tasks.sources.ingest.wikitext import clean_wikitext, strip_tables, strip_templates, tidy_whitespace
import wikitext_reference as reference

# Pieces of wikitext syntax (and white space MediaWiki and str.split treat specially) that random
# strings are built from.
TOKENS = ["[[", "]]", "[", "]", "|", ":", "#", "File:", "fr:", "Category:", "wikt:", "{{", "}}", "{{{", "}}}",
          "{|", "|}", "\n", "\n\n", "\n\n\n", " ", "  ", "\t", "\xa0", "\u2028", "\u3000", "\r", "\x1c", "'", "''",
          "'''", "=", "==", "*", ";", "----", "<ref>", "</ref>", "<ref name=a/>", "<!--", "-->", "&amp;",
          "&nbsp;", "(", ")", ",", "http://x.org", "[http://a b]", "__TOC__", "<b>", "</b>", "a", "b", "word",
          "ß", "é", "Foo (bar)", "x, y", "<!-", "-", "_", "<references>", "</REF >", "<math>", "</math>", "{"]


@pytest.fixture(scope="module")
def enwiki_texts(data_mirror) -> list[str]:
    xml = bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes())
    texts = [el.text or "" for _, el in etree.iterparse(io.BytesIO(xml), tag="{*}text")]
    assert len(texts) == 206
    return texts


def test_same_text_as_reference_on_every_enwiki_sample_page(enwiki_texts):
    for text in enwiki_texts:
        assert clean_wikitext(text) == reference.clean_wikitext(text)


def test_same_text_as_reference_on_synthetic_pages(data_mirror):
    words, freq = sample_words(resolve("enwiki-sample", data_mirror))
    plan = make_plan(400, 7, words, freq)
    rng = np.random.default_rng(7)
    texts = [article_text(plan, rng, i, int(n)) for i, n in enumerate(rng.integers(300, 30_000, 60))]
    pages = b"<pages>" + "".join(page_xml(plan, rng, i) for i in range(400)).encode() + b"</pages>"
    texts += [el.text or "" for _, el in etree.iterparse(io.BytesIO(pages), tag="text")]
    for text in texts:
        assert clean_wikitext(text) == reference.clean_wikitext(text)


@pytest.mark.parametrize("text", [
    "", "\n", " ", "[[a]]]", "[[[a]]]", "[[[a|b]]]", "[[a [[b]] c]]", "[[File:x.jpg|thumb|A [[b|c]] d]] e",
    "[[x|]]", "[[Paris, Texas|]]", "[[ Foo ]]", "[[#Section]]", "[[:Category:X]]", "[[fr:Paris]]",
    "[[a|b|c]]", "[[a|[b] c]]", "x[[y]]z [[y]]", "[[a\nb]]", "[[" * 5 + "x" + "]]" * 5,
    "= H =\n== H2 ==\n=bad\n* a\n# b\n:; c\n----\n-----  \nz", "a\t b\xa0\xa0c \n d\u2028e\r\nf\n\n\n\ng ",
    "'''b''' ''i'' ' x'' '''''bi'''''", "__TOC__ __notmagic__ __NOTOC__", "[http://a.org label] [http://b.org]",
    "&amp;nbsp; &lt;b&gt; (, ; ) ( ; x)", "{{a|{{b}}}} {| x\n|}\n text", "<!-- c --> a <!-- unclosed",
    # brace runs around a flat template (strip_templates removes those first, by regex)
    "{{{a}} b}}", "{{a {{b}}}", "{{{a}}}", "{{x}}}", "{{{{a}}}}", "x {{{{a}} b}} c}}", "{{a}}}}", "{{{{a}}",
    "{{x }{{a}}} y}}", "{{a}}{{b}}", "{{a {{b}} {{c}} d}} e", "{{a\n{{b|{{c}}}}\n}} f", "}}{{a}}{{", "{{a}} }} {{ {{b}}",
    # <ref> ... </ref> with the first closing tag, case and spaces
    "a<ref>b</ref>c<ref>d</REF >e", "a<ref>b<ref>c</ref>d</ref>e", "a<ref name=x>b</refx></ref>c", "<ref>open",
])
def test_same_text_as_reference_on_edge_cases(text):
    assert clean_wikitext(text) == reference.clean_wikitext(text)


@given(st.lists(st.sampled_from(TOKENS), max_size=60).map("".join))
def test_same_text_as_reference_on_random_token_strings(text):
    assert clean_wikitext(text) == reference.clean_wikitext(text)
    assert tidy_whitespace(text) == reference.tidy_whitespace(text)
    assert strip_templates(text) == reference.strip_templates(text)
    assert strip_tables(text) == reference.strip_tables(text)


@given(st.lists(st.sampled_from(TOKENS), max_size=60).map("".join))
def test_comments_removed_once_for_cleaner_and_links(text):
    """The ingest removes comments once and passes ``comments_removed=True`` to both: the same
    text and links as each removing them itself (also where a removal joins ``<!-`` and ``-``)."""
    markup = wikitext.remove_comments(text)
    assert clean_wikitext(markup, comments_removed=True) == clean_wikitext(text)
    assert wikitext.extract_link_targets(markup, comments_removed=True) == wikitext.extract_link_targets(text)


def test_comments_removed_flag_keeps_a_comment_made_by_the_removal():
    text, once = "a <!<!-- x -->-- b --> c", "a <!-- b --> c"
    assert wikitext.remove_comments(text) == once
    assert clean_wikitext(text) == reference.clean_wikitext(text) == once   # comments are removed once
    assert clean_wikitext(once, comments_removed=True) == once
    assert clean_wikitext(once) == "a c"   # what removing them again would give


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_tidy_whitespace_equals_split_and_join_on_any_unicode(text):
    assert tidy_whitespace(text) == reference.tidy_whitespace(text)


def test_other_white_space_table_is_complete():
    every = {c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace()} - {" ", "\n"}
    assert set(wikitext._OTHER_SPACES) == every
