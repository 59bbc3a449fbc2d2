"""Pass 1's page memo (tasks/corpus/ingest/page_memo.py): parts, the memo they make, lookups."""
from __future__ import annotations

from tasks.corpus.ingest.config import IngestConfig
from tasks.corpus.ingest.page_memo import PageMemo, memo_dir, page_key, write_part


def test_parts_make_a_memo_that_finds_each_page_once(tmp_path):
    a, b, c = page_key("'''Alpha''' is [[Beta]]."), page_key("Beta text"), page_key("short")
    write_part(tmp_path / "p1.arrow", [(a, "Alpha is Beta.", ["Beta"], [1, 0, 0]), (c, "short", None, [0, 0, 0])])
    write_part(tmp_path / "p2.arrow", [(b, "Beta text", [], [0, 0, 0]), (a, "Alpha is Beta.", ["Beta"], [1, 0, 0])])
    write_part(tmp_path / "empty.arrow", [])
    n = PageMemo.write(tmp_path / "memo", [tmp_path / "p1.arrow", tmp_path / "p2.arrow", tmp_path / "empty.arrow"])
    assert n == 3   # the page in both parts is kept once
    memo = PageMemo.open(tmp_path / "memo")
    assert memo.get(a) == ("Alpha is Beta.", ["Beta"], [1, 0, 0])
    assert memo.get(c) == ("short", None, [0, 0, 0]) and memo.get(b)[1] == []
    assert memo.get(page_key("never seen")) is None
    assert memo.get((a[0], a[1] ^ 1)) is None   # same high word, another low word
    assert PageMemo.open(tmp_path / "absent") is None and PageMemo.open(None) is None


def test_the_memo_directory_depends_on_settings_and_namespaces(tmp_path):
    cfg = IngestConfig(format="mediawiki")
    one = memo_dir(tmp_path, cfg, frozenset({"file", "category"}))
    assert one == memo_dir(tmp_path, cfg, frozenset({"category", "file"}))
    assert one != memo_dir(tmp_path, cfg, frozenset({"file"}))
    assert one != memo_dir(tmp_path, IngestConfig(format="mediawiki", min_text_chars=cfg.min_text_chars + 1),
                           frozenset({"file", "category"}))
