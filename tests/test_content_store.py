"""The content store (funnelrag/content_store.py): keys, the entry of a config section, lookups,
CSR values, atomic replacement."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from funnelrag.content_store import (ContentMemo, DataParts, contiguous_runs, digest_words, distinct_keys, join_keys, key_digests,
                                     key_order, ranges_take, settings_dir, text_keys)


def test_text_keys_are_the_blake2b_digest_in_big_endian_words():
    digest = hashlib.blake2b("Zürich".encode("utf-8"), digest_size=16).digest()
    keys = text_keys(["Zürich", ""])
    assert keys.shape == (2, 2) and keys.dtype == np.uint64
    assert int(keys[0, 0]) == int.from_bytes(digest[:8], "big") and int(keys[0, 1]) == int.from_bytes(digest[8:], "big")
    assert not np.array_equal(keys[0], keys[1])
    assert key_digests(keys)[0].tobytes() == digest and np.array_equal(digest_words(key_digests(keys)), keys)


def test_a_memo_finds_what_it_was_given_and_nothing_else(tmp_path):
    texts = ["alpha", "beta", "gamma", "beta"]            # a repeated text is kept once
    keys = text_keys(texts)
    values = [[1, 2], [3], [], [3]]
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])])
    assert ContentMemo.write(tmp_path / "m", keys, {"v": (offsets, np.array(sum(values, []), np.int32))}) == 3
    memo = ContentMemo.open(tmp_path / "m", ["v"])
    rows = memo.lookup(text_keys(["gamma", "delta", "alpha", "beta"]))
    assert rows[1] == -1 and (rows[[0, 2, 3]] >= 0).all()
    lengths, got = memo.take("v", rows[[0, 2, 3]])
    assert lengths.tolist() == [0, 2, 1] and got.tolist() == [1, 2, 3]
    assert ContentMemo.open(tmp_path / "m", ["other"]) is None
    assert ContentMemo.open(tmp_path / "absent", ["v"]) is None and ContentMemo.open(None, ["v"]) is None


def test_keys_sharing_a_high_word_are_told_apart_by_the_low_word(tmp_path):
    keys = np.array([[7, 1], [7, 2], [3, 9]], np.uint64)
    ContentMemo.write(tmp_path / "m", keys, {"v": (np.arange(4), np.array([100, 200, 300]))})
    memo = ContentMemo.open(tmp_path / "m", ["v"])
    rows = memo.lookup(np.array([[7, 2], [7, 1], [7, 3], [3, 9]], np.uint64))
    assert rows[2] == -1
    assert memo.take("v", rows[[0, 1, 3]])[1].tolist() == [200, 100, 300]
    assert [memo.find(tuple(k)) for k in [[7, 2], [7, 1], [7, 3], [3, 9], [1, 1]]] == [*rows.tolist(), -1]


def test_a_failed_write_leaves_the_last_memo(tmp_path):
    keys = text_keys(["a", "b"])
    ContentMemo.write(tmp_path / "m", keys, {"v": (np.arange(3), np.array([1, 2]))})
    with pytest.raises(ValueError, match="has 2 offsets for 2 keys"):
        ContentMemo.write(tmp_path / "m", keys, {"v": (np.arange(2), np.array([1]))})
    memo = ContentMemo.open(tmp_path / "m", ["v"])
    assert len(memo) == 2 and memo.take("v", memo.lookup(keys))[1].tolist() == [1, 2]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
def test_a_field_written_in_parts_is_the_same_entry_as_written_whole(tmp_path, dtype):
    """:class:`DataParts` (a field's data streamed part by part, empty parts among them) gives the
    same files, byte for byte, as the concatenated array; so do zero values."""
    rng = np.random.default_rng(0)
    parts = [rng.integers(0, 1_000, n).astype(dtype) for n in (5, 0, 17, 1, 0, 300)]
    data = np.concatenate(parts)
    keys = text_keys([f"text {i}" for i in range(8)])
    offsets = np.sort(np.r_[0, rng.integers(0, data.size, 7), data.size])
    ContentMemo.write(tmp_path / "whole", keys, {"v": (offsets, data)})
    ContentMemo.write(tmp_path / "parts", keys, {"v": (offsets, DataParts(dtype, iter(parts)))})
    for name in sorted(p.name for p in (tmp_path / "whole").iterdir()):
        assert (tmp_path / "parts" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    none = np.zeros(9, np.int64)
    ContentMemo.write(tmp_path / "empty-whole", keys, {"v": (none, np.zeros(0, dtype))})
    ContentMemo.write(tmp_path / "empty-parts", keys, {"v": (none, DataParts(dtype, []))})
    assert ((tmp_path / "empty-parts" / "v.data.npy").read_bytes() == (tmp_path / "empty-whole" / "v.data.npy").read_bytes())


@pytest.mark.parametrize("sizes, says", [((3, 4), "hold 7 values, the offsets 8"), ((3, 4, 2), "hold more than 8 values, the offsets 8")])
def test_parts_that_do_not_fill_the_offsets_are_refused_and_leave_the_last_memo(tmp_path, sizes, says):
    keys = text_keys(["a", "b"])
    ContentMemo.write(tmp_path / "m", keys, {"v": (np.array([0, 1, 2]), np.array([1, 2], np.int32))})
    with pytest.raises(ValueError, match=f"v.data.npy: the parts {says}"):
        ContentMemo.write(tmp_path / "m", keys, {"v": (np.array([0, 5, 8]),
                                                      DataParts(np.int32, [np.ones(n, np.int32) for n in sizes]))})
    memo = ContentMemo.open(tmp_path / "m", ["v"])
    assert memo.take("v", memo.lookup(keys))[1].tolist() == [1, 2]


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


def test_distinct_keys_keep_the_first_row_of_a_repeated_key_in_key_order():
    keys = np.array([[2, 1], [1, 9], [2, 1], [1, 3], [1, 9]], np.uint64)
    distinct, first, inverse = distinct_keys(keys)
    assert first.tolist() == [3, 1, 0] and inverse.tolist() == [2, 1, 2, 0, 1]
    np.testing.assert_array_equal(distinct[inverse], keys)
    assert [a.shape for a in distinct_keys(np.zeros((0, 2), np.uint64))] == [(0, 2), (0,), (0,)]


def test_distinct_keys_partition_the_rows_as_numpy_unique():
    keys = text_keys([f"t{i % 37}" for i in range(200)] + ["", "t1"])
    distinct, first, inverse = distinct_keys(keys)
    plain, plain_first, plain_inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(distinct, plain)                     # (high, low) words: the digests' order
    np.testing.assert_array_equal(first, plain_first)
    np.testing.assert_array_equal(inverse, plain_inverse.reshape(-1))


def test_a_join_on_sorted_keys_finds_the_first_row_of_a_repeated_key_and_nothing_else():
    held = np.array([[5, 1], [5, 2], [5, 2], [7, 0], [9, 9]], np.uint64)   # a repeated key, a shared high word
    assert key_order(held[::-1]).tolist() == [4, 2, 3, 1, 0]           # stable: of equal keys, the first row first
    asked = np.array([[5, 2], [7, 0], [5, 3], [1, 1], [9, 9], [5, 1]], np.uint64)
    assert join_keys(held, asked).tolist() == [1, 3, -1, -1, 4, 0]
    assert join_keys(held[:0], asked).tolist() == [-1] * 6 and join_keys(held, asked[:0]).tolist() == []


def test_a_memo_key_covers_every_field_of_its_config_section(tmp_path):
    """Every memo directory is keyed by the whole config section it reads: a field added to the
    section later (or any field changed) gives another directory, so no memo is silently stale."""
    import dataclasses  # noqa: PLC0415

    from tasks.corpus.index import BM25Config  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415
    from tasks.corpus.sharded.segment_memo import memo_dir  # noqa: PLC0415
    from tasks.corpus.sharded.shards import tokens_memo_dir  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import token_memo_dir  # noqa: PLC0415

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

