"""The enwiki sample through the corpus stage cores (whitespace token counts: fast), shared by the
index tests."""
from __future__ import annotations

from pathlib import Path

from funnelrag.datasets import resolve
from tasks.corpus import stages as S
from tasks.corpus.clustering import ClusteringConfig
from tasks.sources.ingest import IngestConfig, ingest
from tasks.corpus.segment import SegmentConfig


def enwiki_sample_stages(root: Path, data_mirror: Path, segment: bool = False) -> Path:
    """Ingest, tokens and cluster (and ``segment``) of the enwiki sample under ``root/<stage>``."""
    ingest([resolve("enwiki-sample", data_mirror)], root / "ingest", IngestConfig(format="mediawiki"))
    seg = SegmentConfig(tokenizer="whitespace")
    S.run_tokens(root / "ingest", root / "tokens", seg, None)
    S.run_cluster(root / "ingest", root / "tokens", root / "cluster", ClusteringConfig(tokenizer="whitespace"))
    if segment:
        S.run_segment(root / "ingest", root / "tokens", root / "cluster", root / "segment", seg, None)
    return root
