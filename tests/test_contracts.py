"""Artifact contracts: every violation names the artifact, the column and the rows."""
import collections

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_contracts import ContractViolation
from data_contracts.base import Contract, _int_key
from data_contracts.corpus import CLUSTER_MEMBERS, DOCUMENT_UNITS, DOCUMENTS, LINKS, PASSAGES


def _docs(**cols):
    base = {"doc_id": [0, 1], "title": ["A", "B"], "text": ["x", "y"], "page_id": [None, 7], "source": ["f", "f"]}
    base.update(cols)
    return pa.table(base)


def test_valid_table_round_trips(tmp_path):
    path = DOCUMENTS.write(_docs(), tmp_path)
    assert path.name == "documents.parquet"
    back = DOCUMENTS.read(tmp_path)
    assert back.column("title").to_pylist() == ["A", "B"]
    assert back.schema.field("doc_id").type == pa.int64()


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
    from tasks.corpus.sharded import shards

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


# ------------------------------------------------------------------ verify: a written file, texts unread
def test_verify_returns_every_column_but_the_free_text_and_checks_the_file(tmp_path):
    DOCUMENTS.write(_docs(), tmp_path)
    got = DOCUMENTS.verify(tmp_path)
    assert got.column_names == ["doc_id", "title", "page_id", "source"]
    assert got.column("title").to_pylist() == ["A", "B"] and got.column("page_id").to_pylist() == [None, 7]
    assert DOCUMENTS.read(tmp_path).drop_columns(["text"]).equals(got)


def test_verify_refuses_a_free_text_column_stored_with_another_type_or_nullability(tmp_path):
    for field in (pa.field("text", pa.large_string(), nullable=False), pa.field("text", pa.string(), nullable=True)):
        schema = DOCUMENTS.schema.set(DOCUMENTS.schema.get_field_index("text"), field)
        table = pa.table(_docs().columns, schema=schema.with_metadata(DOCUMENTS.metadata()))
        pq.write_table(table, tmp_path / DOCUMENTS.filename)
        with pytest.raises(ContractViolation, match="stores .*expected string") as err:
            DOCUMENTS.verify(tmp_path)
        assert err.value.column == "text"
    with pytest.raises(pa.ArrowInvalid):   # why nullability settles nulls: a required column cannot hold one
        pq.write_table(pa.table(_docs(text=["x", None]).columns, schema=DOCUMENTS.schema), tmp_path / "x.parquet")


def test_verify_finds_a_key_repeated_in_another_row_group_and_a_failed_check(tmp_path):
    with DOCUMENTS.open_writer(tmp_path, row_group_size=None) as out:   # each table its own row group
        out.write(_docs())
        out.write(_docs(doc_id=[2, 1]))
    with pytest.raises(ContractViolation, match="duplicate key") as err:
        DOCUMENTS.verify(tmp_path)
    assert err.value.column == "doc_id" and err.value.rows == [1, 3]
    bad = pa.table({"cluster_id": [0, 0], "position": [0, 2], "doc_id": [0, 1]})
    pq.write_table(bad.cast(CLUSTER_MEMBERS.schema).replace_schema_metadata(CLUSTER_MEMBERS.metadata()),
                   tmp_path / CLUSTER_MEMBERS.filename)
    with pytest.raises(ContractViolation, match="positions"):
        CLUSTER_MEMBERS.verify(tmp_path)


def test_verify_refuses_another_contract_and_a_missing_file(tmp_path):
    CLUSTER_MEMBERS.write(pa.table({"cluster_id": [0], "position": [0], "doc_id": [0]}), tmp_path)
    (tmp_path / CLUSTER_MEMBERS.filename).rename(tmp_path / DOCUMENTS.filename)
    with pytest.raises(ContractViolation, match="not written under this contract"):
        DOCUMENTS.verify(tmp_path)
    with pytest.raises(FileNotFoundError, match="passages"):
        PASSAGES.verify(tmp_path)


def test_free_text_must_name_a_column_outside_the_key():
    schema = pa.schema([pa.field("k", pa.int32(), nullable=False), pa.field("body", pa.string(), nullable=False)])
    Contract("ok", "ok.parquet", schema, unique=("k",), free_text=("body",))
    for free in (("nope",), ("k",)):
        with pytest.raises(ValueError, match="free_text"):
            Contract("bad", "bad.parquet", schema, unique=("k",), free_text=free)


# ------------------------------------------------------------------ keys and checks without a Python object a row
def test_integer_keys_unsorted_or_paired_are_checked_exactly():
    assert CLUSTER_MEMBERS.validate(pa.table({"cluster_id": [9, 3, 3], "position": [0, 0, 1], "doc_id": [9, 3, 4]}))
    with pytest.raises(ContractViolation, match="2 duplicate key") as err:
        CLUSTER_MEMBERS.validate(pa.table({"cluster_id": [7, 7, 7], "position": [0, 1, 2], "doc_id": [7, 7, 7]}))
    assert err.value.rows == [0, 1, 2]
    with pytest.raises(ContractViolation, match="cluster_id is not the doc_id of the cluster's first member") as err:
        CLUSTER_MEMBERS.validate(pa.table({"cluster_id": [0, 1], "position": [0, 0], "doc_id": [3, 1]}))
    assert err.value.rows == [0]
    assert LINKS.validate(pa.table({"src_doc_id": [1, 0, 0], "dst_doc_id": [0, 1, -1]}))
    with pytest.raises(ContractViolation, match="1 duplicate key") as err:
        LINKS.validate(pa.table({"src_doc_id": [3, 0, 3], "dst_doc_id": [1, 2, 1]}))
    assert err.value.column == "src_doc_id,dst_doc_id" and err.value.rows == [0, 2]
    with pytest.raises(ContractViolation, match="1 duplicate key"):   # a negative id is a value like another
        LINKS.validate(pa.table({"src_doc_id": [-1, -1], "dst_doc_id": [-2, -2]}))
    # ids spanning less than 2**32 a column are checked as one packed value, wider ones pair by pair: one answer
    for span in (2**32 - 1, 2**32, 2**62):
        src, dst = [span, 0, span, 0, 0], [7, span, 7, 0, 0]
        assert (_int_key(pa.table({"a": src, "b": dst}), ("a", "b")) is None) == (span >= 2**32)
        assert LINKS.validate(pa.table({"src_doc_id": src[:2] + [span], "dst_doc_id": dst[:2] + [0]}))
        with pytest.raises(ContractViolation, match=r"2 duplicate key value\(s\), e.g. {'src_doc_id': 0, 'dst_doc_id': 0}") as err:
            LINKS.validate(pa.table({"src_doc_id": src, "dst_doc_id": dst}))
        assert err.value.rows == [0, 2, 3, 4]


@pytest.mark.parametrize("scale", [1, 2**40])   # page ids (one packed value a pair), title-derived ids (pair by pair)
def test_integer_pair_duplicates_match_a_plain_count(scale):
    rng = np.random.default_rng(scale % 97)
    src, dst = (rng.integers(0, 60, 400) * scale for _ in range(2))
    pairs = list(zip(src.tolist(), dst.tolist()))
    seen = collections.Counter(pairs)
    with pytest.raises(ContractViolation) as err:
        LINKS.validate(pa.table({"src_doc_id": src, "dst_doc_id": dst}))
    first = dict(zip(("src_doc_id", "dst_doc_id"), min(p for p, c in seen.items() if c > 1)))
    assert err.value.reason == f"{len(pairs) - len(seen)} duplicate key value(s), e.g. {first!r}"
    assert err.value.rows == [i for i, p in enumerate(pairs) if seen[p] > 1][:5]


def test_string_keys_in_order_unordered_or_repeated_are_checked_exactly():
    """A string key in byte order (passages, units) is settled by one comparison with itself
    shifted; a repeat next to itself, a repeat far apart and an unsorted column take the exact path."""
    def units(ids, chunks=1):
        n = len(ids)
        table = pa.table({"unit_id": ids, "cluster_id": [0] * n, "position": list(range(n)), "n_tokens": [1] * n,
                          "n_passages": [1] * n, "title": ["t"] * n})
        return pa.concat_tables([table.slice(i, 1) for i in range(n)]) if chunks > 1 else table
    u0, u1, u2 = (f"{k * 16}.u00{i}" for i, k in enumerate("abc"))
    assert DOCUMENT_UNITS.validate(units([u0, u1, u2], chunks=3)).num_rows == 3
    assert DOCUMENT_UNITS.validate(units([u2, u0, u1])).num_rows == 3
    for ids in ([u0, u1, u1], [u1, u0, u1]):
        for chunks in (1, 3):
            with pytest.raises(ContractViolation, match="1 duplicate key value") as err:
                DOCUMENT_UNITS.validate(units(ids, chunks))
            assert err.value.column == "unit_id"


def test_passage_and_unit_ids_must_be_content_ids():
    """``{document key}.p{window}`` / ``.u{window}``: 16 lower-case hex digits, at least three digits
    of window; a positional id (``c0000001.u000.p000``) or a unit id where a passage id belongs is
    refused with its rows."""
    key = "0123456789abcdef"
    pids = [f"{key}.p000", f"{key}.p1234", "c0000001.u000.p000", f"{key}.u000", f"{key.upper()}.p000", f"{key}.p01"]
    n = len(pids)
    table = pa.table({"passage_id": pids, "unit_id": [f"{key}.u000"] * n, "cluster_id": [0] * n, "doc_id": [0] * n,
                      "title": ["t"] * n, "text": ["x"] * n, "n_words": [1] * n, "n_tokens": [1] * n})
    with pytest.raises(ContractViolation, match="not a content id") as err:
        PASSAGES.validate(table)
    assert err.value.column == "passage_id" and err.value.rows == [2, 3, 4, 5]
    assert PASSAGES.validate(table.slice(0, 2)).num_rows == 2
    with pytest.raises(ContractViolation, match="not a content id") as err:
        PASSAGES.validate(table.slice(0, 2).set_column(1, "unit_id", pa.array([f"{key}.u000", "c0000001.u000"])))
    assert err.value.column == "unit_id" and err.value.rows == [1]
