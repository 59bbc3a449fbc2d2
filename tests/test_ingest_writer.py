"""``Contract.open_writer``: the streaming, validating, atomic writer the ingest stage uses."""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from data_contracts.base import Contract, ContractViolation, sha256_file
from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS, REDIRECTS


def _links(n: int) -> pa.Table:
    return pa.table({"src_doc_id": [i // 7 for i in range(n)], "dst_doc_id": [i % 7 for i in range(n)]})


def test_streamed_file_is_byte_identical_to_contract_write(tmp_path):
    table = _links(140_000)                        # three row groups of 64,000 rows
    LINKS.write(table, tmp_path / "whole")
    rng = random.Random(0)
    with LINKS.open_writer(tmp_path / "streamed", sorted_keys=True) as w:
        start = 0
        while start < table.num_rows:
            size = rng.randint(1, 40_000)
            w.write(table.slice(start, size))
            start += size
    assert w.rows_written == table.num_rows
    assert sha256_file(tmp_path / "whole" / "links.parquet") == sha256_file(tmp_path / "streamed" / "links.parquet")
    assert LINKS.read(tmp_path / "streamed").equals(LINKS.validate(table))


def test_empty_stream_writes_an_empty_valid_artifact(tmp_path):
    with DOCUMENTS.open_writer(tmp_path) as w:
        pass
    assert DOCUMENTS.read(tmp_path).num_rows == 0
    assert w.final == tmp_path / "documents.parquet"


def test_failure_inside_the_block_leaves_no_file(tmp_path):
    LINKS.write(_links(10), tmp_path)                  # an older complete version
    before = sha256_file(tmp_path / "links.parquet")
    with pytest.raises(RuntimeError):
        with LINKS.open_writer(tmp_path) as w:
            w.write(_links(100))
            raise RuntimeError("stage failed")
    assert sha256_file(tmp_path / "links.parquet") == before
    assert [p.name for p in tmp_path.iterdir()] == ["links.parquet"]      # no temporary left


def test_each_batch_is_validated(tmp_path):
    with pytest.raises(ContractViolation, match=r"'ingest_report' column 'status'.*null"):
        with INGEST_REPORT.open_writer(tmp_path) as w:
            w.write({"source": ["a"], "position": [0], "record": ["r"], "page_id": [None], "title": [None],
                     "status": [None], "reason": [None], "n_bytes": [0], "detail": [None]})
    assert not list(tmp_path.iterdir())


def test_sorted_keys_are_checked_within_and_across_batches(tmp_path):
    with pytest.raises(ContractViolation, match="increasing order"):
        with LINKS.open_writer(tmp_path, sorted_keys=True) as w:
            w.write({"src_doc_id": [0, 2, 1], "dst_doc_id": [0, 0, 0]})
    with pytest.raises(ContractViolation, match="does not follow"):
        with LINKS.open_writer(tmp_path, sorted_keys=True) as w:
            w.write(_links(20))
            w.write(_links(20).slice(19))                                  # repeats the last key
    with pytest.raises(ValueError, match="no unique key"):
        Contract(name="x", filename="x.parquet", schema=LINKS.schema).open_writer(tmp_path, sorted_keys=True)
    assert not list(tmp_path.glob("*.parquet"))


def test_sorted_keys_reject_duplicates_within_a_batch_and_name_the_row(tmp_path):
    # a sorted writer checks strict order instead of hashing the keys: a duplicate is still refused
    with pytest.raises(ContractViolation, match=r"duplicate key \(1, 3\).*rows \[2\]|rows \[2\].*duplicate key \(1, 3\)"):
        with LINKS.open_writer(tmp_path, sorted_keys=True) as w:
            w.write({"src_doc_id": [0, 1, 1, 2], "dst_doc_id": [5, 3, 3, 0]})
    with pytest.raises(ContractViolation, match=r"source_title.*increasing order"):
        with REDIRECTS.open_writer(tmp_path, sorted_keys=True) as w:   # string keys: code-point order
            w.write({"source_title": ["A", "B", "Ä", "Z"], "target_title": [None] * 4, "status": ["dangling"] * 4,
                     "hops": [1] * 4})
    with REDIRECTS.open_writer(tmp_path, sorted_keys=True) as w:
        w.write({"source_title": ["A", "B", "Z", "Ä"], "target_title": [None] * 4, "status": ["dangling"] * 4,
                 "hops": [1] * 4})
    assert REDIRECTS.read(tmp_path).column("source_title").to_pylist() == ["A", "B", "Z", "Ä"]
    assert not list(tmp_path.glob(".*"))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-2, 2)), max_size=10), st.integers(1, 10))
def test_sorted_keys_check_agrees_with_sorting(rows, batch):
    """Accepted exactly when the rows are strictly increasing as (src, dst) tuples, whatever the batches."""
    strictly = all(a < b for a, b in zip(rows, rows[1:]))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with LINKS.open_writer(Path(tmp), sorted_keys=True) as w:
                for start in range(0, len(rows), batch):
                    part = rows[start:start + batch]
                    w.write(pa.table({"src_doc_id": pa.array([r[0] for r in part], pa.int32()),
                                      "dst_doc_id": pa.array([r[1] for r in part], pa.int32())}))
        except ContractViolation:
            assert not strictly
        else:
            assert strictly
            assert list(zip(*LINKS.read(Path(tmp)).to_pydict().values())) == rows


def test_writer_refuses_writes_after_commit(tmp_path):
    w = LINKS.open_writer(tmp_path)
    w.write(_links(3))
    w.commit()
    with pytest.raises(ValueError, match="closed"):
        w.write(_links(3))


def test_row_group_per_write_when_row_group_size_is_none(tmp_path):
    import pyarrow.parquet as pq  # noqa: PLC0415

    with LINKS.open_writer(tmp_path, sorted_keys=True, row_group_size=None) as w:
        for start in (0, 10, 35):
            w.write(_links(70).slice(start, {0: 10, 10: 25, 35: 35}[start]))
    meta = pq.ParquetFile(tmp_path / "links.parquet").metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [10, 25, 35]
    assert LINKS.read(tmp_path).equals(LINKS.validate(_links(70)))
