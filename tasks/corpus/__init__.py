"""Corpus build stages of the paper: hyperlink graph, Algorithm 1 clustering, token counts, segmentation,
BM25 indexes, the quality gate; the same stages in shards in ``sharded``. The dumps they read: ``tasks.sources``."""
