"""Pass 1's page memo (tasks/sources/ingest/page_memo.py): parts, the memo they make, lookups."""
from __future__ import annotations

from tasks.sources.ingest.config import IngestConfig
from funnelrag.content_store import text_key
from tasks.sources.ingest.page_memo import PageMemo, memo_dir, write_part


def test_parts_make_a_memo_that_finds_each_page_once(tmp_path):
    a, b, c = text_key("'''Alpha''' is [[Beta]]."), text_key("Beta text"), text_key("short")
    write_part(tmp_path / "p1.arrow", [(a, "Alpha is Beta.", ["Beta"], [1, 0, 0]), (c, "short", None, [0, 0, 0])])
    write_part(tmp_path / "p2.arrow", [(b, "Beta text", [], [0, 0, 0]), (a, "Alpha is Beta.", ["Beta"], [1, 0, 0])])
    write_part(tmp_path / "empty.arrow", [])
    n = PageMemo.write(tmp_path / "memo", [tmp_path / "p1.arrow", tmp_path / "p2.arrow", tmp_path / "empty.arrow"])
    assert n == 3   # the page in both parts is kept once
    memo = PageMemo.open(tmp_path / "memo")
    assert memo.get(a) == ("Alpha is Beta.", ["Beta"], [1, 0, 0])
    assert memo.get(c) == ("short", None, [0, 0, 0]) and memo.get(b)[1] == []
    assert memo.get(text_key("never seen")) is None
    assert memo.get((a[0], a[1] ^ 1)) is None   # same high word, another low word
    assert PageMemo.open(tmp_path / "absent") is None and PageMemo.open(None) is None
    # the rows stay in part order (the texts are not sorted); the keys are sorted, each key once
    assert memo.table.column("text").to_pylist() == ["Alpha is Beta.", "short", "Beta text", "Alpha is Beta."]
    keys = [tuple(k) for k in memo.memo.keys.tolist()]
    assert keys == sorted({a, b, c}) and memo.memo.take("page", [keys.index(a)])[1].tolist() == [0]


def test_a_memo_of_the_earlier_layout_is_never_read_and_retention_sweeps_it(tmp_path):
    """The first build after the upgrade cleans every page (the earlier layout, one ``pages.arrow``
    and a ``(n, 3)`` index, sits under another name); unused, retention removes it."""
    import os
    import time

    import numpy as np

    from funnelrag.content_store import settings_dir
    from funnelrag.store import cache_entries, entry_marker, prune_cache
    from funnelrag.verify import record_digests

    cfg, namespaces = IngestConfig(format="mediawiki"), frozenset({"file"})
    pieces = tmp_path / "ingest-pieces"                                       # the piece cache, as in a home
    old = settings_dir(pieces, "page-memo", "1", cfg, sorted(namespaces))    # the layout before the content store
    old.mkdir(parents=True)
    write_part(old / "pages.arrow", [(text_key("x"), "text", None, [0, 0, 0])])
    np.save(old / "keys.npy", np.array([[*text_key("x"), 0]], np.uint64))
    record_digests(old)
    new = memo_dir(pieces, cfg, namespaces)
    assert new != old and PageMemo.open(new) is None and PageMemo.open(old) is None
    write_part(tmp_path / "p.arrow", [(text_key("x"), "text", None, [0, 0, 0])])
    PageMemo.write(new, [tmp_path / "p.arrow"])
    week_ago = time.time() - 7 * 86400
    os.utime(entry_marker(old), (week_ago, week_ago))   # no build used it since the upgrade
    assert set(cache_entries(tmp_path)) == {old, new}
    assert prune_cache(tmp_path, 3 * 86400).removed == [old.relative_to(tmp_path).as_posix()]
    assert not old.exists() and PageMemo.open(new).get(text_key("x"))[0] == "text"


def test_the_memo_directory_depends_on_settings_and_namespaces(tmp_path):
    cfg = IngestConfig(format="mediawiki")
    one = memo_dir(tmp_path, cfg, frozenset({"file", "category"}))
    assert one == memo_dir(tmp_path, cfg, frozenset({"category", "file"}))
    assert one != memo_dir(tmp_path, cfg, frozenset({"file"}))
    assert one != memo_dir(tmp_path, IngestConfig(format="mediawiki", min_text_chars=cfg.min_text_chars + 1),
                           frozenset({"file", "category"}))


def test_the_memo_links_its_parts_and_outlives_them(tmp_path):
    """Writing a memo copies no text: each part is hard-linked in (a piece cache entry, or
    tonight's scratch file that is removed after); the memo still reads once they are gone."""
    import os

    import pytest

    from tasks.sources.ingest import page_memo as PM

    a, b = text_key("a wikitext"), text_key("b wikitext")
    write_part(tmp_path / "base.arrow", [(a, "old text", None, [0, 0, 0]), (b, "b text", [], [0, 0, 0])])
    edited = text_key("a wikitext, edited")
    write_part(tmp_path / "tonight.arrow", [(edited, "new text", ["B"], [1, 0, 0])])
    assert PageMemo.write(tmp_path / "memo", [tmp_path / "base.arrow", tmp_path / "tonight.arrow"]) == 3
    parts = sorted((tmp_path / "memo").glob(PM.PART_GLOB))
    assert [p.name for p in parts] == ["part-00000.arrow", "part-00001.arrow"]
    assert os.stat(parts[0]).st_ino == os.stat(tmp_path / "base.arrow").st_ino   # linked, not copied
    (tmp_path / "base.arrow").unlink()
    (tmp_path / "tonight.arrow").unlink()
    memo = PageMemo.open(tmp_path / "memo")
    assert memo.get(edited) == ("new text", ["B"], [1, 0, 0]) and memo.get(b) == ("b text", [], [0, 0, 0])
    assert memo.get(a) == ("old text", None, [0, 0, 0])   # the base row of a revised page: space only
    parts[1].unlink()   # a part removed by hand: the keys name rows no part holds
    with pytest.raises(FileNotFoundError, match="its parts hold 2 rows"):
        PageMemo.open(tmp_path / "memo")
    assert PageMemo.write(tmp_path / "empty", []) == 0 and PageMemo.open(tmp_path / "empty").get(a) is None
