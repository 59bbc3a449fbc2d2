"""``TitleIndex``: the compiled title -> row lookup of pass 2's link resolution equals a dict."""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks.sources.ingest.lookup import TitleIndex

# titles over characters of 1 to 4 UTF-8 bytes, with prefixes in common and the empty title
_TITLES = st.text(alphabet="aAb é日\U0001f600_", max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(_TITLES, unique=True, max_size=60), st.lists(_TITLES, max_size=80), st.integers(0, 5),
       st.booleans())
def test_rows_equal_a_dict(keys, queries, cut, large):
    """Every query gets the row of the equal key or -1, for plain, sliced, chunked and large_string arrays."""
    kind = pa.large_string() if large else pa.string()
    padded = pa.array(["pad"] * cut + keys, kind).slice(cut)          # a slice: offsets start past 0
    index = TitleIndex(padded)
    expected = [{k: i for i, k in enumerate(keys)}.get(q, -1) for q in queries]
    assert index.rows(pa.array(queries, pa.string())).tolist() == expected
    half = len(queries) // 2
    chunked = pa.chunked_array([pa.array(queries[:half], kind), pa.array(queries[half:], kind)], type=kind)
    assert index.rows(chunked).tolist() == expected
    assert index.rows(pa.array(["pad"] * cut + queries, pa.string()).slice(cut)).tolist() == expected


def test_many_keys_probe_past_collisions_of_the_slot_bits():
    """30,000 keys in 65,536 slots: many share their first slot; every key is found at its own row
    and near-misses (one character more, one less, another last byte) are not found."""
    rng = random.Random(7)
    keys = list(dict.fromkeys("".join(rng.choice("ab日é") for _ in range(rng.randint(1, 9))) for _ in range(60_000)))
    keys = keys[:30_000]
    index = TitleIndex(pa.array(keys))
    assert len(index._slots) == 65_536
    order = list(range(len(keys)))
    rng.shuffle(order)
    assert index.rows(pa.array([keys[i] for i in order])).tolist() == order
    known = set(keys)
    near = [k + "a" for k in keys[:2000]] + [k[:-1] for k in keys[:2000]] + [k[:-1] + "z" for k in keys[:2000]]
    assert index.rows(pa.array(near)).tolist() == [keys.index(q) if q in known else -1 for q in near]


def test_empty_index_and_empty_queries():
    assert TitleIndex(pa.array([], pa.string())).rows(pa.array(["a", ""])).tolist() == [-1, -1]
    assert TitleIndex(pa.array(["", "a"])).rows(pa.array(["", "a", "b"])).tolist() == [0, 1, -1]
    assert TitleIndex(pa.array(["a"])).rows(pa.array([], pa.string())).dtype == np.int64


def test_bad_keys_and_queries_are_refused():
    with pytest.raises(ValueError, match=r"'Paris' occurs more than once \(rows 1 and 3\)"):
        TitleIndex(pa.array(["Lyon", "Paris", "Nice", "Paris"]))
    with pytest.raises(ValueError, match="1 null key"):
        TitleIndex(pa.array(["Lyon", None]))
    with pytest.raises(ValueError, match="2 null query"):
        TitleIndex(pa.array(["Lyon"])).rows(pa.array([None, "Lyon", None]))
    with pytest.raises(TypeError, match="must be strings"):
        TitleIndex(pa.array([1, 2]))
