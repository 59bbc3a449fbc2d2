"""The per-document memo (tasks/corpus/memo.py): keys, lookups, CSR values, atomic replacement."""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from tasks.corpus.memo import (DocumentMemo, first_of_each_key, JoinedTexts, PartedArray, Utf8Rows, arrow_text_keys, contiguous_runs, copy_ranges, csr_take, keep_extending,
                               ranges_take, take_rows, take_texts, text_keys)


def test_text_keys_are_the_blake2b_digest_in_big_endian_words():
    digest = hashlib.blake2b("Zürich".encode("utf-8"), digest_size=16).digest()
    keys = text_keys(["Zürich", ""])
    assert keys.shape == (2, 2) and keys.dtype == np.uint64
    assert int(keys[0, 0]) == int.from_bytes(digest[:8], "big") and int(keys[0, 1]) == int.from_bytes(digest[8:], "big")
    assert not np.array_equal(keys[0], keys[1])


def test_csr_take_gathers_rows_in_the_asked_order():
    offsets, data = np.array([0, 2, 2, 5]), np.array([10, 11, 30, 31, 32])
    lengths, values = csr_take(offsets, data, np.array([2, 0, 1, 2]))
    assert lengths.tolist() == [3, 2, 0, 3] and values.tolist() == [30, 31, 32, 10, 11, 30, 31, 32]
    assert csr_take(offsets, data, np.array([1]))[1].size == 0


def test_a_memo_finds_what_it_was_given_and_nothing_else(tmp_path):
    texts = ["alpha", "beta", "gamma", "beta"]            # a repeated text is kept once
    keys = text_keys(texts)
    values = [[1, 2], [3], [], [3]]
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])])
    assert DocumentMemo.write(tmp_path / "m", keys, {"v": (offsets, np.array(sum(values, []), np.int32))}) == 3
    memo = DocumentMemo.open(tmp_path / "m", ["v"])
    rows = memo.lookup(text_keys(["gamma", "delta", "alpha", "beta"]))
    assert rows[1] == -1 and (rows[[0, 2, 3]] >= 0).all()
    lengths, got = memo.take("v", rows[[0, 2, 3]])
    assert lengths.tolist() == [0, 2, 1] and got.tolist() == [1, 2, 3]
    assert DocumentMemo.open(tmp_path / "m", ["other"]) is None
    assert DocumentMemo.open(tmp_path / "absent", ["v"]) is None and DocumentMemo.open(None, ["v"]) is None


def test_keys_sharing_a_high_word_are_told_apart_by_the_low_word(tmp_path):
    keys = np.array([[7, 1], [7, 2], [3, 9]], np.uint64)
    DocumentMemo.write(tmp_path / "m", keys, {"v": (np.arange(4), np.array([100, 200, 300]))})
    memo = DocumentMemo.open(tmp_path / "m", ["v"])
    rows = memo.lookup(np.array([[7, 2], [7, 1], [7, 3], [3, 9]], np.uint64))
    assert rows[2] == -1
    assert memo.take("v", rows[[0, 1, 3]])[1].tolist() == [200, 100, 300]


def test_a_failed_write_leaves_the_last_memo(tmp_path):
    keys = text_keys(["a", "b"])
    DocumentMemo.write(tmp_path / "m", keys, {"v": (np.arange(3), np.array([1, 2]))})
    with pytest.raises(ValueError, match="has 2 offsets for 2 keys"):
        DocumentMemo.write(tmp_path / "m", keys, {"v": (np.arange(2), np.array([1]))})
    memo = DocumentMemo.open(tmp_path / "m", ["v"])
    assert len(memo) == 2 and memo.take("v", memo.lookup(keys))[1].tolist() == [1, 2]


def _csr(values):
    return np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int64), np.array(sum(values, []), np.int32)


def test_an_extended_memo_links_the_old_values_and_finds_old_and_new_alike(tmp_path):
    DocumentMemo.write(tmp_path / "m", text_keys(["alpha", "beta"]), {"v": _csr([[1, 2], [3]])})
    inode = (tmp_path / "m" / "v.data.npy").stat().st_ino
    memo = DocumentMemo.open(tmp_path / "m", ["v"])
    # tonight: beta again (held: not written twice), gamma twice (kept once), delta with no values
    texts = ["beta", "gamma", "delta", "gamma"]
    assert memo.extend(text_keys(texts), {"v": _csr([[3], [4, 5], [], [4, 5]])}) == 4
    assert (tmp_path / "m" / "v.data.npy").stat().st_ino == inode               # linked, not copied
    assert np.load(tmp_path / "m" / "v.data.1.npy").tolist() == [4, 5]           # only the new values
    again = DocumentMemo.open(tmp_path / "m", ["v"])
    assert isinstance(again.fields["v"][1], PartedArray) and again.data_files == 2 and memo.data_files == 1
    rows = again.lookup(text_keys(["delta", "alpha", "gamma", "beta", "omega"]))
    assert rows[4] == -1
    lengths, got = again.take("v", rows[:4])
    assert lengths.tolist() == [0, 2, 2, 1] and got.tolist() == [1, 2, 4, 5, 3]
    # a third night: three data files, read as one array, and the same as one memo written whole
    again.extend(text_keys(["epsilon"]), {"v": _csr([[6, 7, 8]])})
    parted = DocumentMemo.open(tmp_path / "m", ["v"])
    whole_texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    DocumentMemo.write(tmp_path / "w", text_keys(whole_texts), {"v": _csr([[1, 2], [3], [4, 5], [], [6, 7, 8]])})
    whole = DocumentMemo.open(tmp_path / "w", ["v"])
    keys = text_keys(whole_texts[::-1])
    assert [x.tolist() for x in parted.take("v", parted.lookup(keys))] == [x.tolist() for x in whole.take("v", whole.lookup(keys))]
    with pytest.raises(ValueError, match="extend needs the fields"):
        parted.extend(text_keys(["z"]), {"w": _csr([[1]])})
    with pytest.raises(ValueError, match="has 3 offsets for 1 keys"):
        parted.extend(text_keys(["z"]), {"v": (np.arange(3), np.array([1, 2]))})
    assert len(DocumentMemo.open(tmp_path / "m", ["v"])) == 5                    # a refused extension wrote nothing


def test_an_extension_merges_keys_that_share_a_high_word_in_order(tmp_path):
    DocumentMemo.write(tmp_path / "m", np.array([[3, 9], [7, 1], [7, 5]], np.uint64), {"v": (np.arange(4), np.array([1, 2, 3]))})
    memo = DocumentMemo.open(tmp_path / "m", ["v"])
    new = np.array([[7, 3], [7, 9], [7, 0], [2, 2], [9, 9], [7, 1]], np.uint64)   # the last one is held
    assert memo.extend(new, {"v": (np.arange(7), np.array([10, 20, 30, 40, 50, 60]))}) == 8
    got = DocumentMemo.open(tmp_path / "m", ["v"])
    keys = np.asarray(got.keys)
    assert keys.tolist() == sorted(keys.tolist()) and len({tuple(k) for k in keys.tolist()}) == 8
    everything = np.array([[3, 9], [7, 1], [7, 5], [7, 3], [7, 9], [7, 0], [2, 2], [9, 9]], np.uint64)
    assert got.take("v", got.lookup(everything))[1].tolist() == [1, 2, 3, 10, 20, 30, 40, 50]


def test_a_parted_array_reads_like_the_parts_joined():
    parts = [np.arange(0, 3), np.arange(3, 3), np.arange(3, 7), np.arange(7, 8)]
    a, joined = PartedArray(parts), np.arange(8)
    assert len(a) == 8 and a.dtype == joined.dtype
    for i in range(9):
        for j in range(i, 9):
            assert a[i:j].tolist() == joined[i:j].tolist(), (i, j)
    assert a[:].tolist() == joined.tolist() and a[5:2].tolist() == []
    idx = np.array([7, 0, 3, 3, 6, 2])
    assert a[idx].tolist() == joined[idx].tolist()
    lengths, values = ranges_take(np.array([6, 1, 2]), np.array([8, 2, 4]), a)
    assert lengths.tolist() == [2, 1, 2] and values.tolist() == [6, 7, 1, 2, 3]
    with pytest.raises(IndexError):
        a[np.array([8])]
    with pytest.raises(ValueError, match="one dtype"):
        PartedArray([np.arange(2), np.arange(2.0)])


def test_a_memo_is_extended_while_at_most_a_fifth_of_it_is_dead():
    assert keep_extending(memo_rows=100, new_rows=2, live_rows=100)        # 2 of 102 rows dead
    assert keep_extending(memo_rows=100, new_rows=25, live_rows=100)       # 25 of 125: exactly a fifth
    assert not keep_extending(memo_rows=100, new_rows=26, live_rows=100)
    assert not keep_extending(memo_rows=0, new_rows=0, live_rows=0)
    assert keep_extending(memo_rows=100, new_rows=0, live_rows=50, max_dead=0.5)
    assert keep_extending(100, 2, 100, data_files=31) and not keep_extending(100, 2, 100, data_files=32)


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


def test_contiguous_runs_merge_ranges_that_follow_one_another():
    starts, ends = np.array([0, 3, 5, 9, 2]), np.array([3, 5, 7, 10, 4])
    rs, re_ = contiguous_runs(starts, ends)
    assert rs.tolist() == [0, 9, 2] and re_.tolist() == [7, 10, 4]
    assert contiguous_runs(np.zeros(0), np.zeros(0))[0].size == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ranges_take_by_runs_and_by_gather_give_the_same_values(seed):
    rng = np.random.default_rng(seed)
    data = np.arange(10_000, dtype=np.int32) * 7
    bounds = np.sort(rng.choice(10_000, 400, replace=False))
    starts, ends = bounds[:-1], bounds[1:]
    ends = np.where(rng.random(starts.size) < 0.1, starts, ends)   # some empty ranges
    expected_values = np.concatenate([data[a:b] for a, b in zip(starts, ends)])
    for pick in (np.arange(starts.size),                       # in data order: long runs, copied by slices
                 rng.permutation(starts.size)):                # scattered: gathered
        lengths, values = ranges_take(starts[pick], ends[pick], data)
        assert lengths.tolist() == (ends[pick] - starts[pick]).tolist()
        assert np.array_equal(values, np.concatenate([data[a:b] for a, b in zip(starts[pick], ends[pick])]))
    assert np.array_equal(ranges_take(starts, ends, data)[1], expected_values)


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


def test_copy_ranges_copies_each_range_from_its_part_or_across_parts():
    parts = [np.arange(0, 5, dtype=np.int32), np.arange(5, 9, dtype=np.int32), np.arange(9, 12, dtype=np.int32)]
    whole = np.concatenate(parts)
    starts, ends, dst = np.array([6, 0, 3, 11, 2]), np.array([9, 2, 7, 12, 2]), np.array([0, 3, 5, 9, 10])
    for source in (PartedArray(parts), whole):              # [3, 7) spans parts 0 and 1; [2, 2) is empty
        out = np.full(10, -1, np.int32)
        copy_ranges(source, starts, ends, out, dst)
        want = np.full(10, -1, np.int32)
        for a, b, d in zip(starts, ends, dst):
            want[d:d + b - a] = whole[a:b]
        assert out.tolist() == want.tolist()
    copy_ranges(whole, np.zeros(0), np.zeros(0), out, np.zeros(0))   # nothing to copy
    with pytest.raises(IndexError, match="negative"):
        copy_ranges(whole, np.array([-1]), np.array([1]), out, np.array([0]))
    with pytest.raises(ValueError):                            # past the end: the slice is short
        copy_ranges(PartedArray(parts), np.array([10]), np.array([14]), np.zeros(4, np.int32), np.array([0]))


def test_first_of_each_key_keeps_the_first_row_of_a_repeated_key_in_key_order():
    keys = np.array([[2, 1], [1, 9], [2, 1], [1, 3], [1, 9]], np.uint64)
    assert first_of_each_key(keys).tolist() == [3, 1, 0]
    assert first_of_each_key(np.zeros((0, 2), np.uint64)).tolist() == []


def test_a_memo_key_covers_every_field_of_its_config_section(tmp_path):
    """Every memo directory is keyed by the whole config section it reads: a field added to the
    section later (or any field changed) gives another directory, so no memo is silently stale."""
    import dataclasses  # noqa: PLC0415

    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.memo import settings_dir  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415
    from tasks.corpus.segment_memo import memo_dir  # noqa: PLC0415
    from tasks.corpus.shards import tokens_memo_dir  # noqa: PLC0415
    from tasks.corpus.token_memo import token_memo_dir  # noqa: PLC0415

    for cfg, directory in [(BM25Config(), lambda c: token_memo_dir(tmp_path, "passages", c)),
                           (SegmentConfig(), lambda c: memo_dir(tmp_path, c)),
                           (SegmentConfig(), lambda c: tokens_memo_dir(tmp_path, c))]:
        base = directory(cfg)
        assert directory(dataclasses.replace(cfg)) == base          # same settings, same memo
        for field in dataclasses.fields(cfg):                       # every field is in the key
            value = getattr(cfg, field.name)
            other = (not value) if isinstance(value, bool) else (value + 1 if isinstance(value, (int, float))
                                                                  else f"{value}-other")
            assert directory(dataclasses.replace(cfg, **{field.name: other})) != base, field.name
        extended = dataclasses.make_dataclass(type(cfg).__name__, [("added", int, dataclasses.field(default=0))],
                                              bases=(type(cfg),), frozen=True)
        assert directory(extended()) != base    # a field added to the section changes the key
    assert settings_dir(tmp_path, "m", "1", BM25Config()) != settings_dir(tmp_path, "m", "2", BM25Config())
