"""Configuration, result summary, errors and reason codes of the ingest stage."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from funnelrag.errors import BadInput
from tasks.sources.ingest.wikitext import DEFAULT_DISAMBIGUATION_TEMPLATES

FORMATS = ("wikispeedia", "mediawiki", "jsonl")

# Report statuses and skip reasons (values of ingest_report.status / .reason).
KEPT, REDIRECT, SKIPPED = "kept", "redirect", "skipped"
MALFORMED_PAGE = "malformed_page"
INVALID_UTF8 = "invalid_utf8"
OTHER_NAMESPACE = "other_namespace"
OVERSIZE = "oversize"
DUPLICATE_TITLE = "duplicate_title"
DISAMBIGUATION = "disambiguation"
EMPTY_TEXT = "empty_text"
MALFORMED_LINK = "malformed_link"


class IngestError(BadInput):
    """An input cannot be read to the end (truncated archive, malformed XML); never retried
    (a :class:`funnelrag.errors.BadInput`).

    The message names the file, the position (line/column or decompressed byte offset) and
    the last complete record read before the failure. No artifact is written.
    """


@dataclass(frozen=True)
class IngestConfig:
    """Configuration of :func:`tasks.sources.ingest.ingest`.

    Parameters
    ----------
    format : {"wikispeedia", "mediawiki", "jsonl"}
        Input format: the two Wikispeedia ``.tar.gz`` archives (plain-text articles and
        ``links.tsv``); MediaWiki ``pages-articles`` XML (plain, ``.bz2`` incl. multistream,
        or ``.gz``); or JSON lines with ``title``, ``text`` and optional ``links`` (list of
        titles), optionally ``.gz``/``.bz2``.
    shard_size : int
        Pages per temporary shard in pass 1 (bounds memory: about ``shard_size`` cleaned pages
        are held at once; pass 2 holds 512 pages per shard). Does not change the output.
    max_page_bytes : int
        Pages whose raw text exceeds this many UTF-8 bytes are skipped (``oversize``).
        Default 4 MiB, twice MediaWiki's default ``$wgMaxArticleSize`` of 2 MiB.
    exclude_disambiguation : bool
        Skip disambiguation pages (reason ``disambiguation``); if False they are kept.
    disambiguation_templates : tuple of str
        Template names (any case, ``_`` or space) marking a disambiguation page; titles ending
        in ``(disambiguation)`` always count.
    min_text_chars : int
        Pages whose cleaned text is shorter than this many characters are skipped
        (``empty_text``).
    drop_self_links : bool
        Drop links from a page to itself (MediaWiki renders them as bold text, not links);
        counted as ``self_link``. Default False: ``links.tsv`` of Wikispeedia has 110 of them
        and the graph stage ignores self-loops anyway.
    """

    format: str = "wikispeedia"
    shard_size: int = 50_000
    max_page_bytes: int = 4 * 1024 * 1024
    exclude_disambiguation: bool = True
    disambiguation_templates: tuple[str, ...] = DEFAULT_DISAMBIGUATION_TEMPLATES
    min_text_chars: int = 1
    drop_self_links: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"IngestConfig.format must be one of {FORMATS}, got {self.format!r}")
        if self.shard_size < 1:
            raise ValueError(f"IngestConfig.shard_size must be >= 1, got {self.shard_size}")
        if self.max_page_bytes < 1:
            raise ValueError(f"IngestConfig.max_page_bytes must be >= 1, got {self.max_page_bytes}")
        if self.min_text_chars < 0:
            raise ValueError(f"IngestConfig.min_text_chars must be >= 0, got {self.min_text_chars}")

    def template_set(self) -> frozenset[str]:
        """Disambiguation template names, lower-cased with single spaces."""
        return frozenset(" ".join(t.replace("_", " ").lower().split()) for t in self.disambiguation_templates)


@dataclass
class LinkCounts:
    """What happened to every link seen (counts of link occurrences).

    ``seen`` equals the sum of all other fields except ``via_redirect`` and ``self_kept``
    (subsets of ``kept``). MediaWiki links are only extracted from kept pages; a Wikispeedia/JSONL link
    whose source page was skipped counts as ``source_skipped``.
    """

    seen: int = 0
    kept: int = 0                # rows of links.parquet
    via_redirect: int = 0        # kept links whose target was reached through a redirect
    self_kept: int = 0           # kept links from a page to itself
    other_namespace: int = 0     # File:, Category:, Template:, ...
    interwiki: int = 0           # wikt:, fr:, ...
    invalid: int = 0             # empty, "#section" only, forbidden characters
    duplicate: int = 0           # repeated (source, target) pair, also after redirect resolution
    self_link: int = 0           # self links dropped (``drop_self_links=True``)
    to_excluded: int = 0         # target page exists but was skipped, or a redirect that does not resolve
    unresolved: int = 0          # no page with that title in the input (missing page)
    source_skipped: int = 0      # the link's source page was not kept
    unknown_source: int = 0      # links.tsv source with no article in the archive
    malformed: int = 0           # links.tsv line that is not "source TAB target"

    def accounted(self) -> int:
        """Sum of the disjoint outcomes; equals ``seen``."""
        return (self.kept + self.other_namespace + self.interwiki + self.invalid + self.duplicate
                + self.self_link + self.to_excluded + self.unresolved + self.source_skipped
                + self.unknown_source + self.malformed)


@dataclass(frozen=True)
class IngestSummary:
    """Counts returned by :func:`tasks.sources.ingest.ingest` (also derivable from the artifacts).

    Attributes
    ----------
    documents, redirects, links : int
        Rows written to documents.parquet, redirects.parquet, links.parquet.
    records : int
        Rows of ingest_report.parquet (every input record).
    by_status : dict
        ``{status: count}`` over the report (kept, redirect, skipped).
    skipped : dict
        ``{reason: count}`` of skipped records.
    redirect_status : dict
        ``{status: count}`` over redirects.parquet (resolved, cycle, dangling, excluded).
    link_counts : LinkCounts
        Fate of every link seen.
    input_bytes : int
        Bytes of the input files on disk (compressed size).
    uncompressed_bytes : int
        Bytes read after decompression (XML / tar members / JSONL).
    shards : int
        Temporary pass-1 shards written.
    seconds, cpu_seconds : float
        Wall-clock and process CPU time of the call (all threads of the calling process; not the
        worker processes of a parallel ingest).
    pass2_seconds : float
        Wall-clock seconds from the end of pass 1 to the published artifacts: redirect
        resolution, the shard merge, link resolution and the Parquet writes — the serial part
        of a parallel ingest.
    outputs : dict
        ``{artifact name: path}`` of the written files.
    pieces : dict
        Multistream pieces parsed in parallel: ``{"built": n, "reused": m}`` (reused = taken
        from the piece cache because the piece's bytes were unchanged); empty when serial.
    cleaned_pages : dict
        Kept wikitext pages of the parsed pieces: ``{"built": n, "reused": m}`` (reused = cleaned
        text and links taken from the page memo, :mod:`tasks.sources.ingest.page_memo`); empty
        without a piece cache.
    stale_revisions : int
        Adds-changes revisions applied while reading (``changes``) that were skipped because the
        base dump holds the same or a newer revision of their page
        (:func:`tasks.sources.ingest.changes.is_newer`).
    """

    documents: int
    redirects: int
    links: int
    records: int
    by_status: dict[str, int]
    skipped: dict[str, int]
    redirect_status: dict[str, int]
    link_counts: LinkCounts
    input_bytes: int
    uncompressed_bytes: int
    shards: int
    seconds: float
    cpu_seconds: float
    outputs: dict[str, Path] = field(default_factory=dict)
    pass2_seconds: float = 0.0
    pieces: dict[str, int] = field(default_factory=dict)
    cleaned_pages: dict[str, int] = field(default_factory=dict)
    stale_revisions: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (paths as strings), e.g. for ``summary.json`` or MLflow params."""
        out = asdict(self)
        out["outputs"] = {k: str(v) for k, v in self.outputs.items()}
        return out
