"""Segmentation: articles → ~100-word passage windows; clusters → ≤ ~1K-token document units.

FunnelRAG's coarse-to-fine units: clusters (≤ 4K tokens, :mod:`tasks.corpus.clustering`) are cut into
*document units* of ≤ ~1K tokens (pre-ranker input) made of *passages* (post-ranker input),
the DPR-style ~100-word windows of each article.

* Windows: an article's text is split on whitespace (``str.split()``) and cut every
  ``passage_words`` words; the last window of an article may be shorter; an empty article has
  no window. Window text is the words joined by single spaces.
* Token counts are per window, in the configured tokenizer (:mod:`tasks.corpus.tokenize`); an
  article's length (the ``n_tokens`` Algorithm 1 uses) is the sum over its windows.
* Units: the windows of a cluster's members, in cluster order, are packed greedily into units
  of consecutive whole windows with at most ``unit_max_tokens`` tokens (a unit may span
  articles of the cluster); a single window longer than the limit is a unit of its own.
* Ids from content (:func:`passage_id`, :func:`unit_id`): a passage is named by its document and
  its window, ``{key}.p{w:03d}`` (``key`` = :func:`document_key` of the document's title, ``w`` = the
  window's index in its article), a unit by its first passage's document and window,
  ``{key}.u{w:03d}`` (:func:`window_ids` spells them for many windows at once, in Arrow). An
  unchanged article keeps its passage ids from one build to the next, whatever cluster and unit
  Algorithm 1 puts it in; ids do not sort in file order.

:func:`segment_clusters` is the one segmentation: offline (whole corpus → the
``document_units`` and ``passages`` tables, :func:`segment_corpus`; a shard of clusters, and the
clusters a nightly build cuts again) and at query time ("later chunking" of retrieved clusters,
:func:`segment_cluster`, its rows as objects), so every path gives the same passages with the same ids.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from data_contracts.corpus import DOCUMENT_UNITS, PASSAGES, document_key, member_order, rows_of
from tasks.corpus.tokenize import TokenCounter

log = logging.getLogger(__name__)

Member = tuple[int, str, str]  # (doc_id, title, text)

WINDOW_RULE_VERSION = "1"
"""The rule :func:`article_windows` cuts by (Python's ``str.split()``, ``passage_words`` words a
window, joined by one space). Keys that stand for a window's text without hashing it
(:func:`tasks.corpus.sharded.piece_keys.window_keys`) include it: change it with the rule
(``tests/test_piece_keys.py`` pins the rule's output on a fixed text, so a change cannot go unseen)."""


@dataclass(frozen=True)
class SegmentConfig:
    """Segmentation settings.

    passage_words : words per passage window (DPR: 100).
    unit_max_tokens : token limit of a document unit (FunnelRAG: ~1K).
    tokenizer : token counter name (``"t5"`` or ``"whitespace"``, :mod:`tasks.corpus.tokenize`).
    """

    passage_words: int = 100
    unit_max_tokens: int = 1024
    tokenizer: str = "t5"

    def __post_init__(self) -> None:
        if self.passage_words < 1:
            raise ValueError(f"SegmentConfig.passage_words must be >= 1, got {self.passage_words}")
        if self.unit_max_tokens < 1:
            raise ValueError(f"SegmentConfig.unit_max_tokens must be >= 1, got {self.unit_max_tokens}")


@dataclass(frozen=True)
class Passage:
    """One ~100-word window: a row of the ``passages`` table."""

    passage_id: str
    unit_id: str
    cluster_id: int
    doc_id: int
    title: str
    text: str
    n_words: int
    n_tokens: int


@dataclass(frozen=True)
class DocumentUnit:
    """Consecutive passages of one cluster with ≤ ``unit_max_tokens`` tokens (unless one
    passage alone is longer)."""

    unit_id: str
    cluster_id: int
    position: int
    passages: tuple[Passage, ...]

    @property
    def n_tokens(self) -> int:
        return sum(p.n_tokens for p in self.passages)

    @property
    def title(self) -> str:
        """Title of the unit's first passage."""
        return self.passages[0].title

    @property
    def text(self) -> str:
        """Passage texts joined by single spaces."""
        return " ".join(p.text for p in self.passages)


@dataclass(frozen=True)
class ClusterSegments:
    """The document units (and through them the passages) of one cluster."""

    cluster_id: int
    units: tuple[DocumentUnit, ...]

    @property
    def passages(self) -> list[Passage]:
        return [p for u in self.units for p in u.passages]


def window_id(key: str, kind: str, window: int) -> str:
    """``{key}.{kind}{window:03d}``: the one spelling of unit (``kind`` ``"u"``) and passage
    (``"p"``) ids, ``key`` being the article's :func:`data_contracts.corpus.document_key`."""
    return f"{key}.{kind}{window:03d}"


def unit_id(title: str, window: int) -> str:
    """``{document_key(title)}.u{window:03d}``: a unit named by its first passage's article and
    window (a window starts at most one unit, so the id is unique)."""
    return window_id(document_key(title), "u", window)


def passage_id(title: str, window: int) -> str:
    """``{document_key(title)}.p{window:03d}``: window ``window`` (0-based, :func:`article_windows`)
    of the article titled ``title``."""
    return window_id(document_key(title), "p", window)


def window_ids(keys: pa.Array, kind: str, windows: np.ndarray) -> pa.Array:
    """:func:`window_id` of many windows at once, in Arrow kernels (no Python string a row).

    Parameters
    ----------
    keys : ``(n,)`` string array of the windows' :func:`data_contracts.corpus.document_key`.
    kind : ``"u"`` or ``"p"``.
    windows : ``(n,)`` int64 (≥ 0), each window's index in its article.

    Returns
    -------
    pa.Array
        ``(n,)`` strings ``{keys[i]}.{kind}{windows[i]:03d}`` (zero-padded to three digits, more
        digits past 999: ``…p1000``), equal to :func:`window_id` row by row.
    """
    digits = pc.utf8_lpad(pc.cast(pa.array(windows, pa.int64()), pa.string()), width=3, padding="0")
    return pc.binary_join_element_wise(keys, digits, f".{kind}")


def window_numbers(n_windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each window's article and its index in it, from the windows per article.

    Parameters
    ----------
    n_windows : ``(n_articles,)`` int64 windows of each article (articles' windows one after the other).

    Returns
    -------
    (article, window) : ``(n_windows.sum(),)`` int64 each: the article (index into ``n_windows``) of
        each window and the window's 0-based index in its article.
    """
    article = np.repeat(np.arange(n_windows.size), n_windows)
    return article, np.arange(article.size) - np.repeat(np.cumsum(n_windows) - n_windows, n_windows)


def _join_windows(words: list[str], passage_words: int) -> list[str]:
    """The windows of an article split into ``words``: every ``passage_words`` words joined by one space."""
    return [" ".join(words[i:i + passage_words]) for i in range(0, len(words), passage_words)]


def article_windows(text: str, passage_words: int) -> list[str]:
    """Cut one article into DPR-style windows of ``passage_words`` whitespace words.

    Returns
    -------
    list of str
        ``ceil(n_words / passage_words)`` windows (words joined by one space); the last may be
        shorter; ``[]`` for a text without words.
    """
    return _join_windows(text.split(), passage_words)


def pack_units(window_tokens: Sequence[int] | np.ndarray, unit_max_tokens: int) -> list[int]:
    """Greedy packing of consecutive windows into units of ≤ ``unit_max_tokens`` tokens.

    Returns
    -------
    list of int
        Boundaries ``b`` of length ``n_units + 1``: unit ``k`` holds windows
        ``b[k]:b[k + 1]``. A window is added to the open unit unless that would exceed the
        limit and the unit is non-empty, so a window longer than the limit is its own unit.
    """
    bounds = [0]
    total = 0
    for i, t in enumerate(window_tokens):
        t = int(t)
        if i > bounds[-1] and total + t > unit_max_tokens:
            bounds.append(i)
            total = 0
        total += t
    if len(window_tokens):
        bounds.append(len(window_tokens))
    return bounds


def check_tokenizer(cfg: SegmentConfig, tokenizer: TokenCounter) -> None:
    """Raise ``ValueError`` unless ``tokenizer`` is the counter ``cfg.tokenizer`` names (window
    token counts, hence units, depend on it)."""
    if tokenizer.name != cfg.tokenizer:
        raise ValueError(f"SegmentConfig.tokenizer is {cfg.tokenizer!r} but the token counter is {tokenizer.name!r}")


ClusterInput = tuple[int, Sequence[int], Sequence[str], Sequence[str], "Sequence[np.ndarray] | None"]
"""One cluster to segment: ``(cluster_id, doc_ids, titles, texts, window_tokens)``, its members in
cluster order (``window_tokens``: each member's window token counts, or ``None`` to count them)."""


def _check_counts(given: np.ndarray, n_windows: np.ndarray, members_of: np.ndarray, cluster_ids: list[int],
                  doc_ids: np.ndarray) -> None:
    """Raise ``ValueError`` naming the first member (its cluster and doc id) whose precomputed window
    token counts are not one a window: ``given`` ``(n_members,)`` counts given (``-1``: counted here),
    ``n_windows`` ``(n_members,)`` its windows, ``members_of`` ``(n_clusters,)`` members a cluster."""
    bad = np.flatnonzero((given >= 0) & (given != n_windows))
    if bad.size:
        m = int(bad[0])
        c = int(np.searchsorted(np.cumsum(members_of), m, side="right"))
        raise ValueError(f"cluster {cluster_ids[c]}, doc {doc_ids[m]}: {given[m]} precomputed window token counts "
                         f"for {n_windows[m]} windows")


def _segment_columns(clusters: Iterable[ClusterInput], cfg: SegmentConfig, tokenizer: TokenCounter
                     ) -> tuple[dict[str, pa.Array], dict[str, pa.Array], np.ndarray]:
    """The columns of the ``document_units`` and ``passages`` rows of ``clusters``, one cluster
    after the other, and ``(n_clusters, 2)`` int64 each cluster's units and passages: the one
    segmentation behind :func:`segment_clusters` and :func:`segment_cluster`.

    Python cuts each article into its window texts (``str.split`` and ``" ".join``, the module's
    whitespace) and packs each cluster's windows (:func:`pack_units`); every other column is computed
    over all clusters at once (numpy, Arrow): window numbers from the articles' word counts, ids by
    :func:`window_ids`, members' values taken a window. Columns are Arrow arrays of the contracts' types.

    Raises
    ------
    ValueError
        The tokenizer is not the configured one, or a cluster's precomputed token counts are not one
        array a member (names the cluster) with one count a window (names the cluster and the doc id).
    """
    check_tokenizer(cfg, tokenizer)
    per_window = cfg.passage_words
    cluster_ids: list[int] = []
    members_of: list[int] = []                 # (n_clusters,) members
    windows_of: list[int] = []                 # (n_clusters,) windows (passages)
    doc_ids: list[np.ndarray] = []             # a cluster's members' doc ids
    titles: list[str] = []                     # (n_members,)
    article_words: list[int] = []              # (n_members,) whitespace words of each article
    given: list[int] = []                      # (n_members,) precomputed counts given, -1: counted here
    texts: list[str] = []                      # (n_windows,)
    tokens: list = []                          # windows' token counts: a member's or a counted cluster's
    for cluster_id, ids, names, articles, window_tokens in clusters:
        first, before = len(texts), len(article_words)
        for text in articles:
            words = text.split()
            article_words.append(len(words))
            texts.extend(_join_windows(words, per_window))
        n_members = len(article_words) - before
        if window_tokens is None:
            if len(texts) > first:
                tokens.append(tokenizer.count(texts[first:]))
            given.extend([-1] * n_members)
        elif len(window_tokens) != n_members:
            raise ValueError(f"cluster {cluster_id}: {len(window_tokens)} window count arrays for {n_members} members")
        else:
            tokens.extend(window_tokens)
            given.extend(map(len, window_tokens))
        cluster_ids.append(int(cluster_id))
        members_of.append(n_members)
        windows_of.append(len(texts) - first)
        doc_ids.append(np.asarray(ids, np.int64).reshape(-1))
        titles.extend(names)
    words_of = np.array(article_words, np.int64)                           # (n_members,)
    n_windows = -(-words_of // per_window)
    member_doc = np.concatenate(doc_ids) if doc_ids else np.zeros(0, np.int64)
    _check_counts(np.array(given, np.int64), n_windows, np.array(members_of, np.int64), cluster_ids, member_doc)
    # unsafe: an empty list (float64 to numpy) among int32 arrays; counts are cast as np.asarray(w, int) would
    n_tokens = np.concatenate(tokens, dtype=np.int64, casting="unsafe") if tokens else np.zeros(0, np.int64)
    counts, unit_starts, units_of, at = n_tokens.tolist(), [], [], 0
    for n in windows_of:                                                   # greedy packing, cluster by cluster
        bounds = pack_units(counts[at:at + n], cfg.unit_max_tokens)
        unit_starts.extend(at + b for b in bounds[:-1])
        units_of.append(len(bounds) - 1)
        at += n
    member, window = window_numbers(n_windows)                            # (n_windows,) each
    starts = np.array(unit_starts, np.int64)                               # (n_units,)
    sizes_u = np.diff(np.r_[starts, member.size])                          # windows of each unit
    unit_cluster, position = window_numbers(np.array(units_of, np.int64))
    keys = pa.array([document_key(t) for t in titles], pa.string())        # one hash a member
    names = pa.array(titles, pa.string())
    uids = window_ids(keys.take(member[starts]), "u", window[starts])
    units = {"unit_id": uids,
             "cluster_id": pa.array(np.array(cluster_ids, np.int64)[unit_cluster], pa.int64()),
             "position": pa.array(position, pa.int32()),
             "n_tokens": pa.array(np.add.reduceat(n_tokens, starts) if starts.size else starts, pa.int32()),
             "n_passages": pa.array(sizes_u, pa.int32()),
             "title": names.take(member[starts])}
    passages = {"passage_id": window_ids(keys.take(member), "p", window),
                "unit_id": uids.take(np.repeat(np.arange(starts.size), sizes_u)),
                "cluster_id": pa.array(np.repeat(np.array(cluster_ids, np.int64), windows_of), pa.int64()),
                "doc_id": pa.array(member_doc[member], pa.int64()),
                "title": names.take(member),
                "text": pa.array(texts, pa.string()),
                "n_words": pa.array(np.minimum(per_window, words_of[member] - window * per_window), pa.int32()),
                "n_tokens": pa.array(n_tokens, pa.int32())}
    return units, passages, np.column_stack((np.array(units_of, np.int64), np.array(windows_of, np.int64)))


def segment_clusters(clusters: Iterable[ClusterInput], cfg: SegmentConfig, tokenizer: TokenCounter
                     ) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """Cut clusters into the rows of the ``document_units`` and ``passages`` tables (later
    chunking; the offline build, whole corpus or a shard of it, :func:`segment_corpus`).

    Parameters
    ----------
    clusters : per cluster (any iterable) ``(cluster_id, doc_ids, titles, texts, window_tokens)``:
        its id and its members' document ids, titles and texts in cluster order
        (``cluster_members.position``), and each member's window token counts
        (``WindowTokens.of(row)``, int32, one per window of :func:`article_windows`) or ``None``
        to count them with ``tokenizer``.
    cfg : the segmentation settings.
    tokenizer : the counter named ``cfg.tokenizer``.

    Returns
    -------
    (units, passages, counts)
        The contract-validated ``document_units`` and ``passages`` rows, clusters in input order
        (unit position, passage position within each), and ``(n_clusters, 2)`` int64: each
        cluster's units and passages. Members without words contribute no passage.

    Raises
    ------
    ValueError
        The tokenizer is not the configured one, or a member's token counts do not match its
        windows (names the cluster and the document).
    """
    units, passages, counts = _segment_columns(clusters, cfg, tokenizer)
    return (DOCUMENT_UNITS.validate(pa.table(units, schema=DOCUMENT_UNITS.schema)),
            PASSAGES.validate(pa.table(passages, schema=PASSAGES.schema)),
            counts)


def segment_cluster(cluster_id: int, members: Sequence[Member], cfg: SegmentConfig, tokenizer: TokenCounter,
                    window_tokens: Sequence[np.ndarray] | None = None) -> ClusterSegments:
    """Cut one cluster into document units of passages (at query time: the rows
    :func:`segment_clusters` makes, as objects).

    Parameters
    ----------
    cluster_id : int
        Cluster id (a column of the rows; the ids come from the members' titles and windows).
    members : sequence of (doc_id, title, text)
        The cluster's documents in cluster order (``cluster_members.position``).
    cfg : SegmentConfig
    tokenizer : TokenCounter
        Counter named ``cfg.tokenizer``.
    window_tokens : sequence of np.ndarray, optional
        Precomputed token counts of each member's windows (``WindowTokens.of(row)``, the document's row), to
        skip re-tokenizing offline; must equal what ``tokenizer`` counts.

    Returns
    -------
    ClusterSegments
        Units in order; members without words contribute no passage.

    Raises
    ------
    ValueError
        The tokenizer is not the configured one, or ``window_tokens`` does not match the
        members' windows (names the doc id).
    """
    cluster = (cluster_id, [m[0] for m in members], [m[1] for m in members], [m[2] for m in members], window_tokens)
    units, rows, _ = _segment_columns([cluster], cfg, tokenizer)
    passages = [Passage(*values) for values in zip(*(rows[name].to_pylist() for name in PASSAGES.schema.names))]
    out, at = [], 0
    for uid, cid, position, n in zip(*(units[name].to_pylist() for name in ("unit_id", "cluster_id", "position", "n_passages"))):
        out.append(DocumentUnit(unit_id=uid, cluster_id=cid, position=position, passages=tuple(passages[at:at + n])))
        at += n
    return ClusterSegments(cluster_id=int(cluster_id), units=tuple(out))


def segments_to_tables(segments: Iterable[ClusterSegments]) -> tuple[pa.Table, pa.Table]:
    """Rows of the ``document_units`` and ``passages`` tables (contract-validated), in input
    order, from :func:`segment_cluster` outputs."""
    units = {k: [] for k in DOCUMENT_UNITS.schema.names}
    passages = {k: [] for k in PASSAGES.schema.names}
    for seg in segments:
        for u in seg.units:
            for key, value in (("unit_id", u.unit_id), ("cluster_id", u.cluster_id), ("position", u.position),
                               ("n_tokens", u.n_tokens), ("n_passages", len(u.passages)), ("title", u.title)):
                units[key].append(value)
            for p in u.passages:
                for key in passages:
                    passages[key].append(getattr(p, key))
    return (DOCUMENT_UNITS.validate(pa.table(units, schema=DOCUMENT_UNITS.schema)),
            PASSAGES.validate(pa.table(passages, schema=PASSAGES.schema)))


# ---------------------------------------------------------------------- whole corpus (offline)
@dataclass(frozen=True, eq=False)
class WindowTokens:
    """Token counts of every article's windows (CSR by doc id).

    Attributes
    ----------
    indptr : np.ndarray
        ``(n_docs + 1,)`` int64; windows of the document in row ``d`` (``documents.parquet``'s row
        order, not its ``doc_id``) are ``n_tokens[indptr[d]:indptr[d + 1]]``.
    n_tokens : np.ndarray
        ``(n_windows,)`` int32 tokens per window.
    tokenizer : str
        Name of the counter used.
    """

    indptr: np.ndarray
    n_tokens: np.ndarray
    tokenizer: str

    def of(self, row: int) -> np.ndarray:
        """``(n_windows_of_doc,)`` int32 token counts of the windows of the article in row ``row``."""
        return self.n_tokens[self.indptr[row]:self.indptr[row + 1]]

    def article_tokens(self) -> np.ndarray:
        """``(n_docs,)`` int64 article lengths in tokens (sum over windows; 0 without words)."""
        sums = np.concatenate([[0], np.cumsum(self.n_tokens, dtype=np.int64)])
        return sums[self.indptr[1:]] - sums[self.indptr[:-1]]

    def n_windows(self) -> np.ndarray:
        """``(n_docs,)`` int64 windows per article."""
        return np.diff(self.indptr)


def count_window_tokens(texts: Sequence[str] | pa.Table, cfg: SegmentConfig, tokenizer: TokenCounter,
                        batch_windows: int = 16384, bar=None) -> WindowTokens:
    """Count the tokens of every window of every article, in large tokenizer batches.

    The article lengths of Algorithm 1 are ``count_window_tokens(...).article_tokens()``.

    Parameters
    ----------
    texts : sequence of str, or pa.Table
        ``(n_docs,)`` article texts, or a ``documents`` table (``text``), in the table's row order
        (the build's private document order: ``documents.parquet`` is in title order).
    cfg : SegmentConfig
    tokenizer : TokenCounter
        Counter named ``cfg.tokenizer``.
    batch_windows : int
        Windows per ``tokenizer.count`` call (bounds memory).
    bar : funnelrag.progress.Progress, optional
        Counts the documents whose windows were counted.

    Returns
    -------
    WindowTokens

    Raises
    ------
    ValueError
        The tokenizer is not the configured one.
    """
    check_tokenizer(cfg, tokenizer)
    if isinstance(texts, pa.Table):
        texts = texts.column("text").to_pylist()
    if getattr(tokenizer, "by_word", False):
        return _count_window_words(texts, cfg.passage_words, tokenizer, batch_windows, bar)
    n_docs = len(texts)
    indptr = np.zeros(n_docs + 1, dtype=np.int64)
    chunks: list[np.ndarray] = []
    pending: list[str] = []
    for d, text in enumerate(texts):
        windows = article_windows(text, cfg.passage_words)
        indptr[d + 1] = indptr[d] + len(windows)
        pending.extend(windows)
        if len(pending) >= batch_windows:
            chunks.append(tokenizer.count(pending))
            pending = []
            if bar is not None:
                bar.update(d + 1 - bar.n)
    if pending:
        chunks.append(tokenizer.count(pending))
    if bar is not None:
        bar.update(n_docs - bar.n)
    n_tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    return WindowTokens(indptr=indptr, n_tokens=n_tokens.astype(np.int32), tokenizer=tokenizer.name)


def window_sums(word_counts: np.ndarray, doc_words: np.ndarray, passage_words: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-window sums of per-word counts: the windows of :func:`article_windows` without their texts.

    Parameters
    ----------
    word_counts : ``(n_words,)`` tokens of each word, the documents' words one after the other.
    doc_words : ``(n_docs,)`` int64 words of each document (summing to ``n_words``).
    passage_words : words a window.

    Returns
    -------
    windows : ``(n_docs,)`` int64 windows of each document, ``ceil(doc_words / passage_words)``.
    n_tokens : ``(n_windows,)`` int64 tokens of each window, documents in order.
    """
    windows = -(-doc_words // passage_words)
    first = np.zeros(doc_words.size, np.int64)                 # each document's first word
    np.cumsum(doc_words[:-1], out=first[1:])
    doc_of, k = window_numbers(windows)                        # (n_windows,) each: document, window number in it
    begin = first[doc_of] + k * passage_words
    end = first[doc_of] + np.minimum((k + 1) * passage_words, doc_words[doc_of])
    summed = np.zeros(word_counts.size + 1, np.int64)
    np.cumsum(word_counts, out=summed[1:])
    return windows, summed[end] - summed[begin]


def _count_window_words(texts: Sequence[str], passage_words: int, tokenizer: TokenCounter, batch_windows: int,
                        bar) -> WindowTokens:
    """:func:`count_window_tokens` by a counter whose text counts are sums of their words' counts
    (``tokenizer.by_word``): each document split into words once, its windows' counts summed from
    its words' counts (:func:`window_sums`) instead of joining each window's words into a text and
    splitting it again; same counts (a window's words are exactly its text's ``split()``)."""
    n_docs = len(texts)
    indptr = np.zeros(n_docs + 1, dtype=np.int64)
    chunks: list[np.ndarray] = []
    pending: list[str] = []
    sizes: list[int] = []
    first = 0

    def flush(upto: int) -> None:
        windows, n_tokens = window_sums(tokenizer.count_words(pending), np.array(sizes, np.int64), passage_words)
        np.cumsum(windows, out=indptr[first + 1:upto + 1])
        indptr[first + 1:upto + 1] += indptr[first]
        chunks.append(n_tokens.astype(np.int32))
        if bar is not None:
            bar.update(upto - bar.n)
    budget = batch_windows * passage_words
    for d, text in enumerate(texts):
        words = text.split()
        pending.extend(words)
        sizes.append(len(words))
        if len(pending) >= budget:
            flush(d + 1)
            pending, sizes, first = [], [], d + 1
    if sizes:
        flush(n_docs)
    if bar is not None:
        bar.update(n_docs - bar.n)
    n_tokens = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int32)
    return WindowTokens(indptr=indptr, n_tokens=n_tokens, tokenizer=tokenizer.name)


def check_members(doc_ids: np.ndarray, member_doc_ids: np.ndarray) -> np.ndarray:
    """The document row of every cluster member: ``(n_members,)`` int64 rows into ``doc_ids``
    (the documents' ids in table order) of ``member_doc_ids`` (``cluster_members.doc_id``).

    Raises
    ------
    ValueError
        A member is not a document, or a document is in no cluster or in several (names its id).
    """
    try:
        rows = rows_of(doc_ids, member_doc_ids, "documents")
    except ValueError as exc:
        raise ValueError(f"cluster_members: a member is not a document ({exc})") from None
    times = np.bincount(rows, minlength=len(doc_ids))
    if (times != 1).any():
        bad = int(np.flatnonzero(times != 1)[0])
        raise ValueError(f"cluster_members: document {int(doc_ids[bad])} is in {int(times[bad])} clusters; "
                         "every document must be in exactly one")
    return rows


@dataclass(frozen=True, eq=False)
class CorpusSegments:
    """Output of :func:`segment_corpus`.

    units, passages : the contract-validated ``document_units`` and ``passages`` tables.
    n_articles_without_passages : articles whose text has no word (they stay cluster members
        but contribute no passage; counted, never silently dropped).
    """

    units: pa.Table
    passages: pa.Table
    n_articles_without_passages: int


def segment_corpus(documents: pa.Table, cluster_members: pa.Table, cfg: SegmentConfig, tokenizer: TokenCounter,
                   window_tokens: WindowTokens | None = None, clusters_per_batch: int = 8192) -> CorpusSegments:
    """Segment every cluster of the corpus with :func:`segment_clusters` (offline path).

    Parameters
    ----------
    documents : pa.Table
        ``documents.parquet`` (at least ``doc_id``, ``title``, ``text``), in its row order (the
        order of ``window_tokens``).
    cluster_members : pa.Table
        ``cluster_members.parquet`` (``cluster_id``, ``position``, ``doc_id``); clusters are cut in
        the order they first appear (the file's: Algorithm 1's).
    cfg : SegmentConfig
    tokenizer : TokenCounter
        Counter named ``cfg.tokenizer``.
    window_tokens : WindowTokens, optional
        Precomputed counts (:func:`count_window_tokens`, as used for the article lengths of
        Algorithm 1), so the corpus is tokenized once.
    clusters_per_batch : int
        Clusters converted to Arrow at a time.

    Returns
    -------
    CorpusSegments
        Rows in (cluster order, unit position, passage position) order.

    Raises
    ------
    ValueError
        A cluster member that is not a document, a document in no cluster
        or in several, or ``window_tokens`` from another tokenizer or corpus.
    """
    check_tokenizer(cfg, tokenizer)
    n_docs = documents.num_rows
    if window_tokens is not None and (window_tokens.tokenizer != cfg.tokenizer or window_tokens.indptr.size != n_docs + 1):
        raise ValueError(f"window_tokens were counted with {window_tokens.tokenizer!r} over "
                         f"{window_tokens.indptr.size - 1} documents; expected {cfg.tokenizer!r} over {n_docs}")
    members = cluster_members.take(member_order(cluster_members.column("cluster_id").to_numpy(),
                                                cluster_members.column("position").to_numpy()))
    cids = members.column("cluster_id").to_numpy()
    doc_ids = documents.column("doc_id").to_numpy()
    rows = check_members(doc_ids, members.column("doc_id").to_numpy())
    titles = documents.column("title").to_pylist()
    texts = documents.column("text").to_pylist()
    starts = np.flatnonzero(np.r_[True, cids[1:] != cids[:-1]]) if cids.size else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], cids.size]
    unit_tables, passage_tables = [], []
    for b in range(0, starts.size, clusters_per_batch):
        batch = []
        for s, e in zip(starts[b:b + clusters_per_batch].tolist(), ends[b:b + clusters_per_batch].tolist()):
            docs = rows[s:e].tolist()
            batch.append((int(cids[s]), doc_ids[docs], [titles[d] for d in docs], [texts[d] for d in docs],
                          [window_tokens.of(d) for d in docs] if window_tokens is not None else None))
        units, passages, _ = segment_clusters(batch, cfg, tokenizer)
        unit_tables.append(units)
        passage_tables.append(passages)
    if not unit_tables:
        units, passages, _ = segment_clusters([], cfg, tokenizer)
        unit_tables, passage_tables = [units], [passages]
    n_empty = sum(1 for t in texts if not t.strip())  # strip() and split() share Unicode whitespace
    if n_empty:
        log.warning("segmentation: %d article(s) have no words and contribute no passage", n_empty)
    return CorpusSegments(units=DOCUMENT_UNITS.validate(pa.concat_tables(unit_tables)),
                          passages=PASSAGES.validate(pa.concat_tables(passage_tables)),
                          n_articles_without_passages=n_empty)
