"""A published corpus version's reads (`tasks/corpus/published.py`)."""
from pathlib import Path

import pyarrow as pa

from data_contracts import corpus as C
from tasks.corpus.published import CorpusVersion


def _chunked(schema: pa.Schema, columns: dict, cut: list[int]) -> pa.Table:
    """A table of ``columns`` held in several record batches, cut before the rows in ``cut``."""
    whole = pa.table(columns, schema=schema)
    edges = [0, *cut, whole.num_rows]
    return pa.Table.from_batches([b for a, z in zip(edges, edges[1:]) for b in whole.slice(a, z - a).to_batches()], schema)


def test_members_of_gathers_titles_and_texts_from_every_chunk_in_cluster_order():
    # documents in title order (doc_id not ascending) and spread over 3 chunks, as a corpus whose
    # texts passed 2 GiB is read (ChunkedArray.take would concatenate the chunks and overflow)
    doc_ids = [40, 10, 30, 20, 50]
    titles = ["Alpha", "Beta", "Delta", "Epsilon", "Gamma"]
    texts = [f"text of {t}" for t in titles]
    documents = _chunked(C.DOCUMENTS.schema, {"doc_id": doc_ids, "title": titles, "text": texts,
                                              "page_id": doc_ids, "source": ["x"] * 5}, [2, 3])
    # cluster 7 = [20, 40] by position, cluster 3 = [50, 10, 30]; file order: 7's rows first
    members = _chunked(C.CLUSTER_MEMBERS.schema, {"cluster_id": [7, 3, 7, 3, 3], "position": [1, 2, 0, 0, 1],
                                                  "doc_id": [40, 30, 20, 50, 10]}, [1, 4])
    assert documents.column("text").num_chunks == 3
    version = CorpusVersion(Path("unused"), "v", {})
    version.documents, version.cluster_members = documents, members     # the lazy tables, given
    got = version.members_of([3, 7])
    assert list(got) == [3, 7]
    assert got[7] == [(20, "Epsilon", "text of Epsilon"), (40, "Alpha", "text of Alpha")]
    assert got[3] == [(50, "Gamma", "text of Gamma"), (10, "Beta", "text of Beta"), (30, "Delta", "text of Delta")]
    assert version.members_of([3]) == {3: got[3]}
