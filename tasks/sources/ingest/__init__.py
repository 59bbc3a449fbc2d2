"""Ingest stage of the corpus build: raw Wikipedia-like dumps → documents, redirects, links and
an ingest report (``data_contracts.corpus``).

Public API::

    from tasks.sources.ingest import IngestConfig, ingest
    summary = ingest([articles_tar, graph_tar], out_dir, IngestConfig(format="wikispeedia"))

Formats: MediaWiki ``pages-articles`` XML (plain/bz2/multistream/gz), the Wikispeedia archives,
generic JSONL. See ``tasks/sources/ingest/README.md`` for the bad-input decisions.
"""
from tasks.sources.ingest.config import FORMATS, IngestConfig, IngestError, IngestSummary, LinkCounts
from tasks.sources.ingest.run import ingest
from tasks.sources.ingest.titles import classify_link, normalise_title
from tasks.sources.ingest.wikitext import clean_wikitext, extract_link_targets, is_disambiguation

__all__ = ["FORMATS", "IngestConfig", "IngestError", "IngestSummary", "LinkCounts", "ingest",
           "classify_link", "normalise_title", "clean_wikitext", "extract_link_targets",
           "is_disambiguation"]
