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


def test_mapped_lookup_reads_as_the_in_memory_lookup(tmp_path):
    import pyarrow.parquet as pq  # noqa: PLC0415  (only these tests write parquet)

    from tasks.evaluate.retrieval import MappedPassageLookup, write_passage_text_store  # noqa: PLC0415

    table = _chunked_passages()
    pq.write_table(table, tmp_path / "passages.parquet")
    store = write_passage_text_store(tmp_path / "passages.parquet", tmp_path / "passages.arrow", batch_rows=4)
    mapped, memory = MappedPassageLookup(store), PassageLookup(table)
    assert len(mapped) == 9
    for ids in (["p7", "p0", "p4", "p7"], [f"p{i}" for i in range(9)], ["p8"], []):
        assert mapped.get(ids) == memory.get(ids)
    assert mapped.get_rows([8, 3]) == memory.get(["p8", "p3"])
    for missing in ("p99", "a", "p45", "q"):                      # before, between and after the ids
        with pytest.raises(KeyError, match=missing):
            mapped.get(["p1", missing])


def test_mapped_lookup_finds_ids_that_do_not_sort_in_file_order(tmp_path):
    """Content ids are in cluster order, not id order: the store keeps rows in file order (the
    index files' row numbers) and finds ids through its ``by_id`` permutation."""
    import pyarrow.parquet as pq  # noqa: PLC0415  (only these tests write parquet)

    from tasks.evaluate.retrieval import MappedPassageLookup, write_passage_text_store  # noqa: PLC0415

    shuffled = _chunked_passages().take([4, 0, 8, 2, 7, 1, 5, 3, 6])
    pq.write_table(shuffled, tmp_path / "passages.parquet")
    mapped = MappedPassageLookup(write_passage_text_store(tmp_path / "passages.parquet", tmp_path / "passages.arrow",
                                                          batch_rows=4))
    memory = PassageLookup(shuffled)
    assert mapped.get([f"p{i}" for i in range(9)]) == memory.get([f"p{i}" for i in range(9)])
    assert [mapped.row_of(f"p{i}") for i in range(9)] == [1, 5, 3, 7, 0, 6, 8, 4, 2]
    assert mapped.get_rows([0, 2]) == memory.get(["p4", "p8"])
    for missing in ("p99", "a", "p45", "q"):
        with pytest.raises(KeyError, match=missing):
            mapped.get([missing])


def test_text_store_refuses_a_repeated_id(tmp_path):
    import pyarrow.parquet as pq  # noqa: PLC0415  (only these tests write parquet)

    from tasks.evaluate.retrieval import write_passage_text_store  # noqa: PLC0415

    table = _chunked_passages()
    pq.write_table(table.take([0, 2, 1, 2]), tmp_path / "passages.parquet")
    with pytest.raises(ValueError, match="passage id 'p2' repeats"):
        write_passage_text_store(tmp_path / "passages.parquet", tmp_path / "passages.arrow")
    assert not (tmp_path / "passages.arrow").exists()
