"""The memory-mapped embedding index: published through the real publisher, read back through
``open_embedding_index``, it ranks units and passages exactly as the in-memory index does, and
both rank as a brute-force reference computed by hand (no model: seeded unit vectors)."""
from __future__ import annotations

import numpy as np
import pytest

from tasks.funnel.embeddings import (
    EmbeddingIndex,
    MappedEmbeddingIndex,
    open_embedding_index,
    publish_embedding_index,
    publish_mapped_embedding_index,
)
from tasks.funnel.stored import rank_units_stored

DIM = 16
META = {"corpus_digest": "digest-a", "model_version": "v" * 64, "dim": DIM, "max_length": 0, "text": "{title}. {text}"}


def _corpus(seed: int = 0):
    """Ids in the corpus format, cluster by cluster (3-6 units of 1-5 passages each), unit vectors
    with four components of +-1/2 (exact in float16 and float32, so every dot product with a
    query of multiples of 1/8 is exact whatever the summation order, and equal scores, the
    tie-breaks, occur often)."""
    rng = np.random.default_rng(seed)
    pids, uids, cids = [], [], []
    for c in range(12):
        for k in range(int(rng.integers(3, 7))):
            for j in range(int(rng.integers(1, 6))):
                pids.append(f"c{c:07d}.u{k:03d}.p{j:03d}")
                uids.append(f"c{c:07d}.u{k:03d}")
                cids.append(c)
    vec = np.zeros((len(pids), DIM), np.float32)
    for r in range(len(pids)):
        vec[r, rng.choice(DIM, size=4, replace=False)] = rng.choice([-0.5, 0.5], size=4)
    return EmbeddingIndex(pids, uids, np.asarray(cids, np.int32), vec, dict(META))


def _reference(index: EmbeddingIndex, query: np.ndarray, clusters: list[int], n_units: int, n_final: int,
               bm25: np.ndarray | None = None, shortlist: int = 0):
    """MaxP by hand: per-passage dot products, the max per unit, units by (score desc, id asc),
    then the best passages of the top units by (score desc, corpus row asc). With a shortlist,
    only the ``shortlist`` rows of the clusters with the highest ``bm25[row]`` (ties by row) count."""
    rows = [r for c in clusters for r in range(len(index)) if index.cluster_ids[r] == c]
    if shortlist:
        rows = sorted(rows, key=lambda r: (-float(bm25[r]), r))[:shortlist]
    score = {r: sum(float(a) * float(b) for a, b in zip(index.vectors[r], query)) for r in rows}
    best: dict[str, float] = {}
    for r in rows:
        u = index.unit_ids[r]
        best[u] = max(best.get(u, -np.inf), score[r])
    units = sorted(best, key=lambda u: (-best[u], u))
    keep = set(units[:n_units])
    top = sorted((r for r in rows if index.unit_ids[r] in keep), key=lambda r: (-score[r], r))[:n_final]
    return units, [index.passage_ids[r] for r in top]


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    index = _corpus()
    root = tmp_path_factory.mktemp("stores")
    publish_embedding_index(root / "parquet", index)
    for dtype in ("float32", "float16"):
        publish_mapped_embedding_index(root / dtype, index.passage_ids, index.unit_ids, index.cluster_ids,
                                       lambda rows: index.vectors[rows], META, dtype=dtype, block_rows=7)
    return index, {k: open_embedding_index(root / k, META["corpus_digest"], META["model_version"])
                   for k in ("parquet", "float32", "float16")}


def test_mapped_index_is_read_through_memory_maps(published):
    index, opened = published
    for dtype in ("float32", "float16"):
        mapped = opened[dtype]
        assert isinstance(mapped, MappedEmbeddingIndex) and isinstance(mapped.vectors, np.memmap)
        assert mapped.vectors.dtype == np.dtype(dtype) and len(mapped) == len(index) and mapped.dim == DIM
        rows = mapped.rows_of_clusters([7, 2])
        assert [int(mapped.cluster_ids[r]) for r in rows] == [7] * int((index.cluster_ids == 7).sum()) + \
            [2] * int((index.cluster_ids == 2).sum())
        assert mapped.passage_ids_at(rows) == [index.passage_ids[r] for r in index.rows_of_clusters([7, 2])]
    np.testing.assert_array_equal(opened["float32"].gather(np.arange(len(index))), index.vectors)


def test_mapped_and_in_memory_rank_alike_and_as_the_reference(published):
    index, opened = published
    rng = np.random.default_rng(1)
    for trial in range(25):
        query = rng.integers(-4, 5, size=DIM).astype(np.float32) / 8
        clusters = [int(c) for c in rng.choice(12, size=int(rng.integers(1, 5)), replace=False)]
        n_units, n_final = int(rng.integers(1, 6)), int(rng.integers(1, 8))
        want_units, want_passages = _reference(index, query, clusters, n_units, n_final)
        for kind in ("memory", "parquet", "float32", "float16"):
            ix = index if kind == "memory" else opened[kind]
            ranking = rank_units_stored(query, ix, clusters)
            assert ranking.unit_ids == want_units, (kind, trial)
            got = [ix.passage_ids[r] for r, _ in ranking.top_passages(ix, n_units, n_final)]
            assert got == want_passages, (kind, trial)


def test_with_a_bm25_shortlist_mapped_and_in_memory_rank_alike_and_as_the_reference(published):
    index, opened = published
    rng = np.random.default_rng(2)
    for trial in range(25):
        query = rng.integers(-4, 5, size=DIM).astype(np.float32) / 8
        bm25 = rng.integers(0, 4, size=len(index)).astype(np.float32)      # ties are frequent
        clusters = [int(c) for c in rng.choice(12, size=int(rng.integers(1, 5)), replace=False)]
        n_units, n_final, m = int(rng.integers(1, 6)), int(rng.integers(1, 8)), int(rng.integers(1, 15))
        want_units, want_passages = _reference(index, query, clusters, n_units, n_final, bm25, m)
        for kind in ("memory", "parquet", "float32", "float16"):
            ix = index if kind == "memory" else opened[kind]
            ranking = rank_units_stored(query, ix, clusters, lambda rows: bm25[rows], shortlist=m)
            assert ranking.unit_ids == want_units, (kind, trial)
            got = [ix.passage_ids[r] for r, _ in ranking.top_passages(ix, n_units, n_final)]
            assert got == want_passages, (kind, trial)


def test_mapped_publisher_refuses_bad_vectors(tmp_path):
    index = _corpus()
    with pytest.raises(ValueError, match="not a unit vector"):
        publish_mapped_embedding_index(tmp_path / "s", index.passage_ids, index.unit_ids, index.cluster_ids,
                                       lambda rows: 2 * index.vectors[rows], META)
    with pytest.raises(ValueError, match="dtype"):
        publish_mapped_embedding_index(tmp_path / "s", index.passage_ids, index.unit_ids, index.cluster_ids,
                                       lambda rows: index.vectors[rows], META, dtype="int8")
    assert not (tmp_path / "s" / "current").exists()
