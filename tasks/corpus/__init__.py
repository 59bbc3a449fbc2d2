"""Corpus build: ingest, hyperlink graph, Algorithm 1 clustering, token counts, segmentation, BM25 indexes."""
