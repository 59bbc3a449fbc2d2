"""The per-document memo (tasks/corpus/memo.py): keys, lookups, CSR values, atomic replacement."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from tasks.corpus.memo import DocumentMemo, csr_take, text_keys


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
