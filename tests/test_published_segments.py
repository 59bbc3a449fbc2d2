"""Later chunking read back from a published ``passages`` table equals cutting the clusters again
(real NQ-open oracle gold passages, 3 articles per cluster; the real Wikispeedia build is compared
in the demo's distillation, whose candidates read its clusters this way)."""
from __future__ import annotations

import pytest
from oracle_corpus import oracle_clusters

from tasks.corpus.segment import SegmentConfig, segment_cluster, segments_to_tables
from tasks.corpus.tokenize import WhitespaceCounter
from tasks.funnel.candidates import chunk_clusters, published_segments

SEG = SegmentConfig(passage_words=30, unit_max_tokens=70, tokenizer="whitespace")


def test_published_segments_equal_later_chunking(data_mirror):
    _, clusters, _ = oracle_clusters(data_mirror, 24)
    segs = [segment_cluster(c, clusters[c], SEG, WhitespaceCounter()) for c in sorted(clusters)]
    _, passages = segments_to_tables(segs)
    wanted = sorted(clusters)[::2] + sorted(clusters)[:2]            # repeats, any order
    again = chunk_clusters(wanted, lambda ids: {c: clusters[c] for c in ids}, SEG, WhitespaceCounter())
    read_back = published_segments(passages, wanted)
    assert read_back == again and sorted(read_back) == sorted(set(wanted))
    assert any(len(s.units) > 1 for s in read_back.values())          # unit order within a cluster is checked
    with pytest.raises(KeyError, match="cluster 999999"):
        published_segments(passages, [999999])
