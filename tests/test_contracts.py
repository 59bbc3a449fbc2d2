"""Artifact contracts: every violation names the artifact, the column and the rows."""
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts import ContractViolation
from data_contracts.base import Contract
from data_contracts.corpus import CLUSTER_MEMBERS, DOCUMENTS


def _docs(**cols):
    base = {"doc_id": [0, 1], "title": ["A", "B"], "text": ["x", "y"], "page_id": [None, 7], "source": ["f", "f"]}
    base.update(cols)
    return pa.table(base)


def test_valid_table_round_trips(tmp_path):
    path = DOCUMENTS.write(_docs(), tmp_path)
    assert path.name == "documents.parquet"
    back = DOCUMENTS.read(tmp_path)
    assert back.column("title").to_pylist() == ["A", "B"]
    assert back.schema.field("doc_id").type == pa.int32()


def test_null_in_non_nullable_field_names_column_and_row():
    with pytest.raises(ContractViolation) as err:
        DOCUMENTS.validate(_docs(title=["A", None]))
    assert err.value.artifact == "documents" and err.value.column == "title" and err.value.rows == [1]
    assert "documents" in str(err.value) and "title" in str(err.value)


def test_missing_and_extra_columns():
    with pytest.raises(ContractViolation, match="missing column"):
        DOCUMENTS.validate(_docs().drop(["source"]))
    with pytest.raises(ContractViolation, match="unexpected column") as err:
        DOCUMENTS.validate(_docs().append_column("oops", pa.array([1, 2])))
    assert err.value.column == "oops"


def test_bad_type_is_named():
    with pytest.raises(ContractViolation) as err:
        DOCUMENTS.validate(_docs(doc_id=["a", "b"]))
    assert err.value.column == "doc_id"


def test_duplicate_primary_key_rows():
    with pytest.raises(ContractViolation) as err:
        CLUSTER_MEMBERS.validate(pa.table({"cluster_id": [0, 0, 1], "position": [0, 1, 0], "doc_id": [5, 6, 5]}))
    assert err.value.column == "doc_id" and err.value.rows == [0, 2]


def test_polars_large_string_is_cast():
    table = pl.DataFrame({"doc_id": [0], "title": ["A"], "text": ["t"], "page_id": [None], "source": ["s"]}).to_arrow()
    assert table.schema.field("title").type in (pa.large_string(), pa.string_view(), pa.string())
    out = DOCUMENTS.validate(table)
    assert out.schema.field("title").type == pa.string()


def test_read_refuses_other_contract_or_version(tmp_path):
    DOCUMENTS.write(_docs(), tmp_path)
    bumped = Contract(DOCUMENTS.name, DOCUMENTS.filename, DOCUMENTS.schema, version=DOCUMENTS.version + 1)
    with pytest.raises(ContractViolation, match="schema version"):
        bumped.read(tmp_path)
    pq.write_table(_docs(), tmp_path / "plain.parquet")
    with pytest.raises(ContractViolation, match="not written under this contract"):
        DOCUMENTS.read(tmp_path / "plain.parquet")
    with pytest.raises(FileNotFoundError, match="documents"):
        DOCUMENTS.read(tmp_path / "nope")


def test_failed_write_keeps_previous_file(tmp_path):
    DOCUMENTS.write(_docs(), tmp_path)
    before = (tmp_path / "documents.parquet").read_bytes()
    with pytest.raises(ContractViolation):
        DOCUMENTS.write(_docs(title=[None, "B"]), tmp_path)
    assert (tmp_path / "documents.parquet").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["documents.parquet"]  # no temp file left


def test_writes_are_byte_identical(tmp_path):
    a = DOCUMENTS.write(_docs(), tmp_path / "a").read_bytes()
    b = DOCUMENTS.write(_docs(), tmp_path / "b").read_bytes()
    assert a == b


def test_corpus_build_config_contract_reads_segment_back(tmp_path):
    from data_contracts.corpus import BUILD_CONFIG
    from flows.corpus_build import CorpusBuildConfig
    from funnelrag.config import to_jsonable
    from tasks.corpus.published import CorpusVersion
    from tasks.corpus.segment import SegmentConfig

    cfg = CorpusBuildConfig.model_validate({"segment": {"passage_words": 50, "unit_max_tokens": 300}})
    manifest = BUILD_CONFIG.stamp(to_jsonable(cfg.model_dump(exclude={"workspace"})))
    assert manifest["config_version"] == BUILD_CONFIG.version
    version = CorpusVersion(path=tmp_path, version="v", manifest=manifest)
    assert version.segment_config() == SegmentConfig(passage_words=50, unit_max_tokens=300, tokenizer="t5")

    broken = {**manifest, "config": {**manifest["config"], "segment": {"passage_words": 50}}}
    with pytest.raises(ValueError, match=r"manifest.json: config.segment lacks \['unit_max_tokens', 'tokenizer'\]"):
        CorpusVersion(path=tmp_path, version="v", manifest=broken).segment_config()
    with pytest.raises(ValueError, match="build config version 99"):
        CorpusVersion(path=tmp_path, version="v", manifest={**manifest, "config_version": 99}).segment_config()
    with pytest.raises(ValueError, match="lacks"):
        BUILD_CONFIG.stamp({**manifest["config"], "bm25": {"k1": 0.9}})


def test_an_error_mid_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    """Every hand-off of a file goes through ``atomic_write`` / ``replace_file``: a writer that
    fails after writing part of the bytes leaves the old file and nothing else; a complete
    write fsyncs the file before the rename and the directory after it."""
    import os

    from data_contracts.base import atomic_write, atomic_write_bytes, replace_file, temp_file_beside

    final = tmp_path / "sub" / "data.bin"
    atomic_write_bytes(final, b"old")

    def half(tmp):
        tmp.write_bytes(b"ne")   # part of the new bytes, then a crash
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic_write(final, half)
    assert final.read_bytes() == b"old" and [p.name for p in final.parent.iterdir()] == ["data.bin"]

    with pytest.raises(KeyboardInterrupt), temp_file_beside(final) as tmp:   # content-addressed writers
        tmp.write_bytes(b"new")
        raise KeyboardInterrupt
    assert [p.name for p in final.parent.iterdir()] == ["data.bin"]

    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.path.isdir(f"/proc/self/fd/{fd}")) or real_fsync(fd))
    atomic_write(final, lambda tmp: tmp.write_bytes(b"new"))
    assert final.read_bytes() == b"new" and synced == [False, True]   # the file, then its directory
    assert oct(final.stat().st_mode & 0o777) == "0o644" and [p.name for p in final.parent.iterdir()] == ["data.bin"]
    synced.clear()
    with temp_file_beside(final) as tmp:
        tmp.write_bytes(b"scratch")
        replace_file(tmp, final.with_name("other.bin"), durable=False)
    assert synced == [] and sorted(p.name for p in final.parent.iterdir()) == ["data.bin", "other.bin"]


def test_a_failed_partition_write_leaves_no_temp_file(tmp_path, monkeypatch):
    """The segment stage's document partition (a retried worker call) writes through the same helper."""
    import numpy as np

    from data_contracts.corpus import DOCUMENTS as DOCS
    from tasks.corpus import shards

    DOCS.write(_docs(page_id=[3, 7]), tmp_path / "ingest")
    np.save(tmp_path / "shard_of_doc.npy", np.array([0, 1], np.int32))
    out = tmp_path / "parts"
    assert shards.partition_range(str(tmp_path / "ingest"), 0, 2, str(tmp_path / "shard_of_doc.npy"), str(out)) == 2
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def failing(table, where, **kwargs):
        open(where, "wb").write(b"PAR1 half")
        raise OSError("killed mid-write")

    monkeypatch.setattr(shards.pq, "write_table", failing)
    with pytest.raises(OSError, match="mid-write"):
        shards.partition_range(str(tmp_path / "ingest"), 0, 2, str(tmp_path / "shard_of_doc.npy"), str(out))
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_binary_labels_names_the_first_rows_that_are_not_0_or_1():
    from data_contracts import dr_rag, r2ag
    from data_contracts.base import binary_labels

    labels = pa.table({"label": pa.array([0, 1, 2, 1, -1], pa.int8())})
    assert binary_labels(labels) == ("label", [2, 4], "label must be 0 or 1")
    assert binary_labels(labels.slice(0, 2)) is None
    users = [c for m in (dr_rag, r2ag) for c in vars(m).values()
             if isinstance(c, Contract) and binary_labels in c.checks]
    assert len(users) >= 4   # DR-RAG pairs, R²AG lists, features, scores: one check
