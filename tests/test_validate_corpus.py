"""The publish step's checks of a staged corpus version (:func:`tasks.corpus.stages.validate_corpus`):
every table against its contract, without decoding the article and passage texts, and the
cross-artifact invariants, each failing on a version built from the real enwiki sample and then
broken in one place."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from corpus_stages import enwiki_sample_stages

from data_contracts import ContractViolation
from data_contracts import corpus as C
from tasks.corpus import stages as S
from tasks.corpus.index import BM25Config

MAX_TOKENS = 4096   # ClusteringConfig's default S, the one enwiki_sample_stages clusters with


@pytest.fixture(scope="module")
def staged(tmp_path_factory, data_mirror) -> Path:
    """A version directory laid out as the publish step stages it: the tables and both indexes."""
    root = enwiki_sample_stages(tmp_path_factory.mktemp("stages"), data_mirror, segment=True)
    S.run_index(root / "ingest", root / "cluster", root / "segment", root / "index", BM25Config())
    version = root / "version"
    version.mkdir()
    for c in C.CORPUS_CONTRACTS:
        found = [p for stage in ("ingest", "cluster", "segment") if (p := root / stage / c.filename).exists()]
        shutil.copy(found[0], version / c.filename)
    shutil.copytree(root / "index" / "index", version / "index")
    return version


@pytest.fixture
def version(staged, tmp_path) -> Path:
    return Path(shutil.copytree(staged, tmp_path / "version"))


def test_a_built_version_passes_with_the_row_counts_of_its_tables(version):
    counts = S.validate_corpus(version, MAX_TOKENS)
    assert counts == {c.name: pq.read_metadata(version / c.filename).num_rows for c in C.CORPUS_CONTRACTS}
    assert counts["documents"] == 98 and counts["passages"] > 1000


def _rewrite(version: Path, contract, change) -> None:
    """Rewrite ``contract``'s table through the contract after ``change`` (a valid table)."""
    table = change(contract.read(version))
    (version / contract.filename).unlink()
    contract.write(table, version)


def test_a_passage_the_index_does_not_hold_fails(version):
    _rewrite(version, C.PASSAGES, lambda t: t.slice(0, t.num_rows - 1))
    with pytest.raises(ValueError, match="passages.bm25: index ids do not match the passage_ids"):
        S.validate_corpus(version, MAX_TOKENS)


def test_a_document_in_no_cluster_fails(version):
    _rewrite(version, C.CLUSTER_MEMBERS, lambda t: t.filter(pc.not_equal(t.column("doc_id"), t.column("doc_id")[5])))
    with pytest.raises(ValueError, match="cluster_members: 97 rows for 98 documents"):
        S.validate_corpus(version, MAX_TOKENS)


def test_a_cluster_over_s_tokens_fails(version):
    with pytest.raises(ValueError, match=r"clusters: \[.*\] exceed 100 tokens with more than one member"):
        S.validate_corpus(version, 100)


def test_a_passage_of_a_missing_document_fails(version):
    _rewrite(version, C.PASSAGES, lambda t: t.set_column(t.schema.get_field_index("doc_id"), "doc_id",
                                                          pa.array([-1] * t.num_rows, pa.int64())))
    with pytest.raises(ValueError, match="passages: a passage refers to a document that does not exist"):
        S.validate_corpus(version, MAX_TOKENS)


def test_a_text_column_stored_as_another_type_fails_without_reading_the_texts(version):
    table = pq.read_table(version / C.DOCUMENTS.filename)
    table = table.set_column(2, pa.field("text", pa.large_string(), nullable=False), table.column("text").cast(pa.large_string()))
    pq.write_table(table, version / C.DOCUMENTS.filename)
    with pytest.raises(ContractViolation, match="large_string") as err:
        S.validate_corpus(version, MAX_TOKENS)
    assert err.value.artifact == "documents" and err.value.column == "text"


def test_index_ids_compare_as_a_multiset_of_strings():
    assert S.same_ids(["2", "10", "1"], pa.chunked_array([[1, 2], [10]]))
    assert S.same_ids([], pa.array([], pa.int32()))
    assert not S.same_ids(["1", "1", "2"], pa.array([1, 2, 2]))
    assert not S.same_ids(["1", "2"], pa.array(["1", "2", "3"]))
    assert not S.same_ids(["01"], pa.array([1]))
