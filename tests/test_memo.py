"""Texts as content keys (funnelrag/content_store.py): keys hashed from Arrow buffers, joined texts,
rows and ranges taken from a memo."""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from funnelrag.content_store import text_keys
from funnelrag.content_store import JoinedTexts, Utf8Rows, arrow_text_keys, copy_ranges, take_rows, take_texts


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_arrow_text_keys_equal_the_keys_of_the_python_strings(kind):
    texts = ["", "a", "Ünïcode ✓ text", "title\nbody " * 50, "a"] * 3
    arr = pa.array(texts, kind)
    assert np.array_equal(arrow_text_keys(arr), text_keys(texts))
    chunked = pa.chunked_array([arr.slice(0, 4), arr.slice(4, 7), arr.slice(11)])   # offsets into shared buffers
    assert np.array_equal(arrow_text_keys(chunked), text_keys(texts))
    with_null = pa.array(["x", None, "y"], kind)
    assert np.array_equal(arrow_text_keys(with_null), text_keys(["x", "", "y"]))
    assert arrow_text_keys(pa.array([], kind)).shape == (0, 2)
    with pytest.raises(TypeError, match="string array"):
        arrow_text_keys(pa.array([1, 2]))


def test_take_rows_equals_table_take_for_runs_and_scattered_rows():
    table = pa.table({"i": pa.array(range(1000)), "s": pa.array([f"t{i}" for i in range(1000)])})
    table = pa.concat_tables([table.slice(0, 300), table.slice(300)])   # two chunks
    rng = np.random.default_rng(0)
    for rows in (np.r_[10:200, 250:600, 5:9], rng.integers(0, 1000, 500), np.zeros(0, np.int64)):
        assert take_rows(table, rows).equals(table.take(pa.array(rows, pa.int64())))


def test_take_texts_gathers_from_each_chunk_in_the_asked_order():
    texts = [f"text {i} ✓" for i in range(50)]
    chunked = pa.chunked_array([pa.array(texts[:7]), pa.array(texts[7:7], pa.string()), pa.array(texts[7:31]), pa.array(texts[31:])])
    rows = np.array([49, 0, 7, 6, 30, 31, 7])
    assert take_texts(chunked, rows) == [texts[i] for i in rows]
    assert take_texts(pa.array(texts), rows) == [texts[i] for i in rows]
    assert take_texts(chunked, np.zeros(0, np.int64)) == []


BLANKS = ["", " ", "\t\n", "\x1c\x1f", "\xa0", "\u3000\u2028", "\x85 "]   # Python's Unicode whitespace
WORDS = ["a", " a", "\xa0b", "\u3000\u00e9", "Ünïcode ✓", "\x7fx", "x" * 300 + " ", "\u200b"]   # \u200b is not a space


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string()])
def test_utf8_rows_read_each_value_from_the_arrow_buffers(kind):
    texts = (BLANKS + WORDS) * 2
    arr = pa.array(texts, kind)
    chunked = pa.chunked_array([arr.slice(0, 5), arr.slice(5, 0), arr.slice(5, 9), arr.slice(14)])
    for column in (arr, chunked, pa.chunked_array([arr])):
        rows = Utf8Rows(column)
        assert len(rows) == len(texts)
        assert [bytes(rows[i]) for i in range(len(texts))] == [t.encode("utf-8") for t in texts]
        assert rows.lengths.tolist() == [len(t.encode("utf-8")) for t in texts]
        assert rows.count_blank() == sum(1 for t in texts if not t.strip()) == 2 * len(BLANKS)
    nulls = Utf8Rows(pa.array(["x", None, "yz"], kind))
    assert [bytes(nulls[i]) for i in range(3)] == [b"x", b"", b"yz"] and nulls.count_blank() == 1
    assert len(Utf8Rows(pa.array([], kind))) == 0 and Utf8Rows(pa.array([], kind)).count_blank() == 0
    with pytest.raises(TypeError, match="string array"):
        Utf8Rows(pa.array([1, 2]))


def test_utf8_rows_hash_the_content_whatever_the_chunks():
    texts = WORDS * 3

    def digest(column):
        h = hashlib.sha256()
        Utf8Rows(column).hash_into(h)
        return h.hexdigest()

    arr = pa.array(texts)
    expected = hashlib.sha256(np.array([len(t.encode()) for t in texts], "<i8").tobytes()
                              + "".join(texts).encode()).hexdigest()
    assert digest(arr) == expected
    assert digest(pa.chunked_array([arr.slice(0, 7), arr.slice(7)])) == expected
    assert digest(pa.array(texts, pa.large_string())) == expected
    assert digest(pa.array(["ab", "c"])) != digest(pa.array(["a", "bc"]))   # lengths are hashed
    assert digest(pa.array(["x", None, "y"])) == digest(pa.array(["x", "", "y"]))


def test_joined_texts_hash_and_take_as_the_joined_strings_whatever_the_order():
    titles = pa.chunked_array([["Zürich", "B", ""], ["Ωmega", "E"]])
    texts = pa.chunked_array([["one two", ""], ["x", "drei vier", "fünf"]])
    joined = [f"{t}\n{x}" for t, x in zip(titles.to_pylist(), texts.to_pylist())]
    whole = JoinedTexts(titles, texts)
    assert len(whole) == 5 and np.array_equal(whole.keys(), text_keys(joined))
    assert whole.to_pylist() == joined and whole.take(np.array([4, 1])) == [joined[4], joined[1]]
    rows = np.array([3, 0, 3, 4])                      # cluster order: any order, repeats allowed
    ordered = JoinedTexts(titles, texts, "\n", rows)
    assert np.array_equal(ordered.keys(), text_keys([joined[r] for r in rows]))
    assert ordered.take(np.array([2, 1])) == [joined[3], joined[0]] and len(JoinedTexts(titles, texts, "\n", rows[:0])) == 0


def test_joined_texts_refuse_nulls_unequal_columns_and_rows_outside():
    with pytest.raises(ValueError, match="null"):
        JoinedTexts(pa.array(["a", None]), pa.array(["b", "c"]))
    with pytest.raises(ValueError, match="rows"):
        JoinedTexts(pa.array(["a"]), pa.array(["b", "c"]))
    with pytest.raises(IndexError, match="outside"):
        JoinedTexts(pa.array(["a"]), pa.array(["b"]), "\n", np.array([1]))


def test_copy_ranges_copies_each_range_to_its_place():
    whole = np.arange(12, dtype=np.int32)
    starts, ends, dst = np.array([6, 0, 3, 11, 2]), np.array([9, 2, 7, 12, 2]), np.array([0, 3, 5, 9, 10])
    out = np.full(10, -1, np.int32)
    copy_ranges(whole, starts, ends, out, dst)   # [2, 2) is empty
    want = np.full(10, -1, np.int32)
    for a, b, d in zip(starts, ends, dst):
        want[d:d + b - a] = whole[a:b]
    assert out.tolist() == want.tolist()
    copy_ranges(whole, np.zeros(0), np.zeros(0), out, np.zeros(0))   # nothing to copy
    for a, b in ((-1, 1), (10, 14)):                                   # before the start, past the end
        with pytest.raises(IndexError, match="outside"):
            copy_ranges(whole, np.array([a]), np.array([b]), np.zeros(4, np.int32), np.array([0]))

