"""Errors the platform treats specially, defined here so that stage code can raise them without
the platform importing any stage package."""
from __future__ import annotations


class BadInput(RuntimeError):
    """An input that fails the same way on every try (a truncated archive, malformed XML, an
    empty file). :func:`funnelrag.stages.retry_transient` never retries it; stage packages
    subclass it for their own input errors (:class:`tasks.sources.ingest.IngestError`)."""
