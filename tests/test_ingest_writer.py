"""``Contract.open_writer``: the streaming, validating, atomic writer the ingest stage uses."""
from __future__ import annotations

import random

import pyarrow as pa
import pytest

from data_contracts.base import Contract, ContractViolation, sha256_file
from data_contracts.corpus import DOCUMENTS, INGEST_REPORT, LINKS


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
