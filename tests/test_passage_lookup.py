"""PassageLookup: ids to (title, text) over a multi-chunk passages table, in the order asked."""
from __future__ import annotations

import pyarrow as pa
import pytest

from tasks.evaluate.retrieval import PassageLookup


def _chunked_passages() -> pa.Table:
    parts = [pa.table({"passage_id": [f"p{i}" for i in range(lo, lo + 3)],
                       "title": [f"T{i}" for i in range(lo, lo + 3)],
                       "text": [f"text {i}" for i in range(lo, lo + 3)]}) for lo in (0, 3, 6)]
    table = pa.concat_tables(parts)
    assert table["text"].num_chunks == 3
    return table


def test_lookup_returns_rows_in_the_order_asked_across_chunks():
    lookup = PassageLookup(_chunked_passages())
    assert len(lookup) == 9
    assert lookup.get(["p7", "p0", "p4", "p7"]) == [("p7", "T7", "text 7"), ("p0", "T0", "text 0"),
                                                    ("p4", "T4", "text 4"), ("p7", "T7", "text 7")]
    assert lookup.get([]) == []


def test_lookup_names_an_unknown_id():
    with pytest.raises(KeyError, match="p99"):
        PassageLookup(_chunked_passages()).get(["p1", "p99"])
