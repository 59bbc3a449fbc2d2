"""The passage embedding index: every corpus passage embedded once, offline, by a bi-encoder
pre-ranker version, and published as a versioned artifact.

A bi-encoder pre-ranker scores ``f(q, d) = cos(E(q), E(d))`` (FunnelRAG Eq. 1). ``E(d)`` depends
only on the corpus version and the pre-ranker's weights, so it is computed once per
(corpus content digest, model version) and stored; query time then only embeds the question
and takes dot products (:mod:`tasks.funnel.stored`). The same vectors serve flat dense retrieval
(:mod:`tasks.evaluate.flat_dense`).

What is embedded per passage is ``"{title}. {text}"`` (DPR encodes title and text), truncated to
the pre-ranker's own ``max_length``; the rows are L2-normalised float32.

Layout (``home/stores/embeddings/<corpus>/<model version[:16]>/``, an
:class:`funnelrag.store.ArtifactStore`): ``versions/<id>/passage_embeddings.parquet``
(:data:`data_contracts.embeddings.PASSAGE_EMBEDDINGS`) and ``manifest.json`` with
``corpus_digest``, ``model_version``, ``dim``, ``max_length``, ``text`` and the file hashes;
``current`` names the published version.

Incremental: every vector is also kept by the content of the text it encodes
(:mod:`tasks.funnel.vector_store`, ``home/cache/embed-vectors/``), so a new corpus version embeds
only its new and edited passages, a killed run resumes from the chunks it finished, and workers
embedding parts of a corpus (``rank``/``world`` of :func:`embed_passages`) meet in the same store.
After publishing, the store drops the vectors of texts that no corpus version the home keeps
holds any more, once they are more than ``max_dead_share`` of it (:func:`prune_vector_store`).
The text keys of each published corpus version are hashed once and kept by its content digest
(:func:`corpus_text_keys`), so neither pruning nor a later night hashes a kept version again.
"""
from __future__ import annotations

import copy
import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import torch

from data_contracts.base import sha256_file, temp_name
from data_contracts.corpus import PASSAGES
from data_contracts.embeddings import PASSAGE_EMBEDDINGS
from funnelrag.content_store import distinct_keys, text_keys
from funnelrag.progress import Progress
from funnelrag.stages import stage
from funnelrag.store import ArtifactStore, StageCache
from funnelrag.verify import discard_entry
from models.encoders import BATCH_TOKENS, encode_texts
from models.preranker import require_finite
from tasks.corpus.published import CORPUS_STORE
from tasks.funnel.vector_store import MAX_DEAD_SHARE, Compaction, VectorStore, vector_store_root

log = logging.getLogger(__name__)

TEXT_FORMAT = "{title}. {text}"
MANIFEST_KEYS = ("corpus_digest", "model_version")
CORPUS_KEYS, CORPUS_KEYS_VERSION, KEYS_FILE = "corpus-text-keys", "2", "keys.npy"
"""The stage-cache entry of a corpus version's text keys (:func:`corpus_text_keys`), its version
(``(n, 2)`` uint64 words since 2; version 1 kept ``(n, 16)`` digest bytes under other names: never
read, removed with the retired versions' entries by :func:`retained_text_keys`) and its file."""


class EmbeddingIndexMismatch(ValueError):
    """A stored embedding index was built from another corpus version or another model version."""


@dataclass(frozen=True)
class EmbeddingConfig:
    """Embedding stage settings.

    batch_size : passages per forward pass, at most.
    batch_tokens : padded tokens (rows x longest) per forward pass, at most: batches are cut by
        tokens over length-sorted passages (:func:`models.encoders.token_batches`); a GPU takes
        far larger ones than a CPU.
    shard_rows : passages per chunk written to the vector store as it is embedded (what a killed
        run keeps).
    layout : ``parquet`` (the ``passage_embeddings`` table, read into memory) or ``mapped``
        (:class:`MappedEmbeddingIndex`: read through memory maps, for corpora of millions of
        passages).
    dtype : ``float32`` or ``float16``, the stored vectors of the ``mapped`` layout.
    max_dead_share : after publishing, the vector store is compacted once more than this share
        of its rows are dead (texts no corpus version the home keeps holds, and duplicates;
        :func:`prune_vector_store`); 1.0: never pruned for dead rows.
    """

    batch_size: int = 64
    batch_tokens: int = BATCH_TOKENS
    shard_rows: int = 4096
    layout: str = "parquet"
    dtype: str = "float32"
    max_dead_share: float = MAX_DEAD_SHARE

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.shard_rows < 1 or self.batch_tokens < 1:
            raise ValueError(f"EmbeddingConfig sizes must be >= 1, got {self}")
        if not 0.0 <= self.max_dead_share <= 1.0:
            raise ValueError(f"EmbeddingConfig: max_dead_share must be in [0, 1], got {self.max_dead_share}")
        if self.layout not in ("parquet", "mapped") or self.dtype not in ("float32", "float16"):
            raise ValueError(f"EmbeddingConfig: layout must be parquet | mapped and dtype float32 | float16, got {self}")


def passage_text(title: str, text: str) -> str:
    """What a passage is embedded and scored as: ``"{title}. {text}"``."""
    return TEXT_FORMAT.format(title=title, text=text)


def passage_texts(passages: pa.Table) -> list[str]:
    """:func:`passage_text` of every row of a ``passages`` table (table order)."""
    return [passage_text(t, x) for t, x in zip(passages["title"].to_pylist(), passages["text"].to_pylist())]


def model_version(model) -> str:
    """sha256 of a bi-encoder pre-ranker's document-tower weights and input length: the "model
    version" that keys the index (content, not the place the weights were loaded from). A
    separate query tower is not part of it: a pre-ranker fine-tuned on the query side only
    (:class:`models.preranker.BiEncoderPreRanker` with ``towers="separate"``) reads the index of
    its base model, and nothing needs re-embedding after such a distillation.

    Parameters
    ----------
    model : models.preranker.BiEncoderPreRanker

    Raises
    ------
    ValueError
        ``model`` is not a bi-encoder (a cross-encoder has no passage vectors).
    """
    if getattr(model, "kind", None) != "bi":
        raise ValueError(f"an embedding index needs a bi-encoder pre-ranker, got kind {getattr(model, 'kind', None)!r}")
    h = hashlib.sha256(f"max_length={model.encoder.cfg.max_length}\0normalize={model.encoder.cfg.normalize}\n".encode())
    for name, tensor in sorted(model.encoder.state_dict().items()):
        h.update(name.encode() + b"\0")
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def embed_texts(model, tokenizer, texts: Sequence[str], batch_size: int = 64, bar=None,
                batch_tokens: int = BATCH_TOKENS) -> np.ndarray:
    """L2-normalised document-tower embeddings ``E_d(d)`` of a bi-encoder pre-ranker, float32
    ``(len(texts), dim)``: what the embedding index stores (``bar``: optional
    :class:`funnelrag.progress.Progress` counting the texts; ``batch_size`` rows and
    ``batch_tokens`` padded tokens a forward pass at most)."""
    return encode_texts(model.encoder, tokenizer, texts, batch_size, bar, batch_tokens)


def embed_queries(model, tokenizer, questions: Sequence[str], batch_size: int = 64) -> np.ndarray:
    """L2-normalised query-tower embeddings ``E_q(q)`` of a bi-encoder pre-ranker, float32
    ``(len(questions), dim)`` (the shared encoder's when the model has no separate query tower).

    Raises
    ------
    models.preranker.NonFiniteScoresError
        An embedding has a NaN or infinite value (damaged weights).
    """
    return require_finite(encode_texts(model.query_tower(), tokenizer, questions, batch_size), "query embeddings")


def embed_passages(texts: Sequence[str], model, tokenizer, cfg: EmbeddingConfig = EmbeddingConfig(),
                   store: VectorStore | None = None, progress: Callable[[int, int], None] | None = None,
                   rank: int = 0, world: int = 1, keys: np.ndarray | None = None) -> tuple[np.ndarray | None, dict]:
    """Embed passages, reusing every vector ``store`` holds for the same text.

    Each distinct text is embedded once; texts the store holds (from any earlier corpus version:
    the key is the text's content, not its passage id) are read back, the rest embedded
    ``cfg.shard_rows`` at a time and written to the store as each chunk arrives (a killed run
    keeps its finished chunks).

    Parameters
    ----------
    texts : passage texts (:func:`passage_texts`), corpus order.
    model, tokenizer : the bi-encoder pre-ranker (:class:`models.preranker.BiEncoderPreRanker`).
    cfg : EmbeddingConfig
    store : the content-keyed vectors of this model version
        (:class:`tasks.funnel.vector_store.VectorStore`); None: embed everything, keep nothing.
    progress : ``progress(done, total)`` after each chunk (texts to embed).
    rank, world : this worker's share of the texts to embed (data-parallel embedding: worker
        ``rank`` of ``world`` embeds, of the ``rank``-th of ``world`` contiguous parts of the
        distinct texts, those ``store`` lacks, and returns ``None`` vectors when ``world > 1``; the index step then
        joins the workers' segments by calling this again with ``world = 1``).
    keys : ``(len(texts), 2)`` uint64, optional
        The texts' keys (:func:`funnelrag.content_store.text_keys`) when the caller holds them
        already (:func:`corpus_text_keys`, which the pruning after publishing reads too); hashed
        here otherwise.

    Returns
    -------
    (vectors, info)
        ``vectors``: float32 ``(len(texts), dim)``, rows L2-normalised, input order (None for a
        worker of ``world > 1``). ``info``: ``embedded`` (texts encoded by this call),
        ``reused`` (passages whose vector came from the store), ``discarded_segments``.

    Raises
    ------
    ValueError
        ``world > 1`` without a store, ``rank`` outside ``[0, world)``, or ``keys`` not
        ``(len(texts), 2)``.
    """
    if world > 1 and store is None or not 0 <= rank < world:
        raise ValueError(f"embed_passages: rank {rank} of {world} workers (a store is needed for world > 1)")
    dim = model.encoder.backbone.config.hidden_size
    keys = text_keys(texts) if keys is None else keys                             # (n, 2)
    if keys.shape != (len(texts), 2):
        raise ValueError(f"embed_passages: keys {keys.shape} for {len(texts)} texts")
    ukeys, first, inverse = distinct_keys(keys)
    if store is None:
        found, uvec = np.zeros(len(ukeys), bool), np.zeros((len(ukeys), dim), np.float32)
    else:
        got = store.lookup(ukeys)
        found, uvec = got.found, got.vectors
    order = np.argsort(first, kind="stable")                                       # corpus order of first use
    # The share is cut from every distinct text, not from the missing ones: ranks look the store
    # up at different times (one may see what another already wrote), so cutting what each finds
    # missing would leave texts that no rank embeds.
    mine = np.array_split(order, world)[rank]
    mine = mine[~found[mine]]
    with Progress("embed passages", total=len(mine), unit="passages") as bar:
        bar.update(0, reused=int(found[inverse].sum()))
        for start in range(0, len(mine), cfg.shard_rows):
            part = mine[start:start + cfg.shard_rows]
            emb = embed_texts(model, tokenizer, [texts[int(first[u])] for u in part], cfg.batch_size, bar,
                              cfg.batch_tokens)
            if store is not None:
                store.add(ukeys[part], emb)
            uvec[part] = emb                                                       # (chunk, dim)
            if progress is not None:
                progress(min(start + cfg.shard_rows, len(mine)), len(mine))
    info = {"embedded": int(len(mine)), "reused": int(found[inverse].sum()),
            "discarded_segments": 0 if store is None else len(store.discarded)}
    if world > 1:
        return None, info
    return uvec[inverse].astype(np.float32, copy=False), info


@dataclass
class EmbeddingIndex:
    """Passage vectors with their ids and the (corpus, model) they were built from.

    passage_ids, unit_ids : ``(n,)`` corpus ids of each row.
    cluster_ids : int64 ``(n,)``.
    vectors : float32 ``(n, dim)``, rows L2-normalised.
    meta : ``corpus_digest``, ``model_version``, ``dim``, ``max_length``, ``text``.
    """

    passage_ids: list[str]
    unit_ids: list[str]
    cluster_ids: np.ndarray
    vectors: np.ndarray
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.passage_ids)
        if self.vectors.ndim != 2 or self.vectors.shape[0] != n or len(self.unit_ids) != n or len(self.cluster_ids) != n:
            raise ValueError(f"embedding index: {n} passage ids, {len(self.unit_ids)} unit ids, "
                             f"{len(self.cluster_ids)} cluster ids, vectors {self.vectors.shape}")
        self.cluster_ids = np.asarray(self.cluster_ids, dtype=np.int64)
        self._order = np.argsort(self.cluster_ids, kind="stable")                # rows grouped by cluster
        self._sorted = self.cluster_ids[self._order]
        # unit code of each row: the rank of its unit id among the sorted unit ids, so that codes
        # order units as their ids do (the MaxP tie-break) and group them without string work
        names, codes = np.unique(np.asarray(self.unit_ids, dtype=object).astype(str), return_inverse=True)
        self.unit_codes = codes.astype(np.int64).reshape(-1)                     # (n,)

    def __len__(self) -> int:
        return len(self.passage_ids)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def check(self, corpus_digest: str, version: str) -> None:
        """Refuse an index of another corpus version or model version.

        Raises
        ------
        EmbeddingIndexMismatch
            ``meta["corpus_digest"]`` or ``meta["model_version"]`` differs (names both values).
        """
        for key, want in (("corpus_digest", corpus_digest), ("model_version", version)):
            have = self.meta.get(key)
            if have != want:
                raise EmbeddingIndexMismatch(f"embedding index {key} is {have!r}, expected {want!r}: "
                                             f"re-embed with `funnelrag embed-corpus`")

    def row_of(self) -> dict[str, int]:
        """``passage_id → row`` (built once, then cached)."""
        if getattr(self, "_row_of", None) is None:
            self._row_of = {p: i for i, p in enumerate(self.passage_ids)}
        return self._row_of

    def rows_of_clusters(self, cluster_ids: Sequence[int]) -> np.ndarray:
        """Row indices of every passage of ``cluster_ids``, int64, cluster by cluster in the
        order given, corpus order inside a cluster."""
        # needles of the haystack's own dtype: int64 needles on the int32 ids make numpy cast the
        # whole id array on every call (O(n) per cluster instead of O(log n))
        c = np.asarray(cluster_ids, dtype=self._sorted.dtype)
        lo = np.searchsorted(self._sorted, c, side="left")
        hi = np.searchsorted(self._sorted, c, side="right")
        parts = [self._order[a:b] for a, b in zip(lo, hi)]
        return np.concatenate(parts).astype(np.int64, copy=False) if parts else np.zeros(0, np.int64)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of ``rows`` as float32 ``(len(rows), dim)``."""
        return np.asarray(self.vectors[rows], dtype=np.float32)

    def unit_names_at(self, rows: np.ndarray) -> list[str]:
        """The unit id of each of ``rows``."""
        return [self.unit_ids[int(r)] for r in rows]

    def passage_ids_at(self, rows: np.ndarray) -> list[str]:
        """The passage id of each of ``rows``."""
        return [self.passage_ids[int(r)] for r in rows]

    def to_table(self) -> pa.Table:
        """The contract table (:data:`PASSAGE_EMBEDDINGS`)."""
        flat = pa.array(np.ascontiguousarray(self.vectors, dtype=np.float32).reshape(-1))
        offsets = pa.array(np.arange(0, (len(self) + 1) * self.dim, self.dim, dtype=np.int32))
        return PASSAGE_EMBEDDINGS.validate(pa.table({
            "passage_id": pa.array(self.passage_ids, pa.string()), "unit_id": pa.array(self.unit_ids, pa.string()),
            "cluster_id": pa.array(self.cluster_ids, pa.int64()),
            "embedding": pa.ListArray.from_arrays(offsets, flat)}, schema=PASSAGE_EMBEDDINGS.schema))

    @classmethod
    def from_table(cls, table: pa.Table, meta: dict) -> "EmbeddingIndex":
        n = table.num_rows
        flat = table["embedding"].combine_chunks().flatten().to_numpy(zero_copy_only=False)
        dim = flat.size // n if n else int(meta.get("dim", 0))
        return cls(table["passage_id"].to_pylist(), table["unit_id"].to_pylist(), table["cluster_id"].to_numpy(),
                   flat.reshape(n, dim).astype(np.float32, copy=False), dict(meta))


@stage("passage-embeddings", version="2")
def build_embedding_index(passages: pa.Table, model, tokenizer, corpus_digest: str,
                          cfg: EmbeddingConfig = EmbeddingConfig(), store: VectorStore | None = None,
                          progress: Callable[[int, int], None] | None = None,
                          keys: np.ndarray | None = None) -> tuple[EmbeddingIndex, dict]:
    """Embed every passage of a published corpus with a bi-encoder pre-ranker (the stage core),
    reusing the vectors ``store`` holds for unchanged texts.

    Parameters
    ----------
    passages : the corpus ``passages`` table (passage_id, unit_id, cluster_id, title, text).
    model, tokenizer : bi-encoder pre-ranker and its tokenizer.
    corpus_digest : the corpus content digest (manifest ``content_digest``).
    cfg, store, progress, keys : see :func:`embed_passages`.

    Returns
    -------
    (EmbeddingIndex, info)
        ``info`` = ``{"passages", "embedded", "reused", "discarded_segments", "seconds",
        "passages_per_s"}`` (``passages_per_s``: texts embedded per second of this call).

    Raises
    ------
    ValueError
        ``model`` is not a bi-encoder.
    """
    version = model_version(model)
    t0 = time.perf_counter()
    vectors, info = embed_passages(passage_texts(passages), model, tokenizer, cfg, store, progress,
                                   keys=keys)                                     # (n, dim)
    seconds = time.perf_counter() - t0
    meta = {"corpus_digest": corpus_digest, "model_version": version, "dim": int(vectors.shape[1]),
            "max_length": int(model.encoder.cfg.max_length), "text": TEXT_FORMAT}
    index = EmbeddingIndex(passages["passage_id"].to_pylist(), passages["unit_id"].to_pylist(),
                           passages["cluster_id"].to_numpy(), vectors, meta)
    return index, {"passages": len(index), **info, "seconds": seconds,
                   "passages_per_s": info["embedded"] / max(seconds, 1e-9)}


# ---------------------------------------------------------------------------- store
def passage_vector_store(cache_dir: Path, model) -> VectorStore:
    """The content-keyed vector store of ``model``'s document tower under ``cache_dir``
    (:func:`tasks.funnel.vector_store.vector_store_root`)."""
    return VectorStore(vector_store_root(cache_dir, model_version(model)), model.encoder.backbone.config.hidden_size)


def corpus_keys_entry(cache_dir: Path, corpus_digest: str) -> Path:
    """``<cache>/corpus-text-keys/<key>``: the stage-cache entry (:class:`funnelrag.store.StageCache`)
    of the text keys of one corpus version's passages, keyed by :data:`CORPUS_KEYS_VERSION`, the
    text format (:data:`TEXT_FORMAT`) and the version's content digest."""
    key = StageCache.key(CORPUS_KEYS, CORPUS_KEYS_VERSION, {"text": TEXT_FORMAT}, {"corpus": corpus_digest})
    return Path(cache_dir) / CORPUS_KEYS / key


def _kept_text_keys(entry: Path, rows: int | None, compute: Callable[[], np.ndarray]) -> np.ndarray:
    """The keys the stage-cache entry ``entry`` (:func:`corpus_keys_entry`) holds, else
    ``compute()`` (``(n, 2)`` uint64, passage order) written as that entry. Verified on every read
    (:meth:`funnelrag.store.StageCache.run`: other bytes, a truncation or a missing file discard
    it, its path logged at WARNING, and it is computed again); an entry of other than ``rows``
    keys (None: not checked) is discarded the same way.

    Raises ``ValueError`` when ``compute`` gives other than ``(rows, 2)`` keys."""
    def build(tmp: Path) -> dict:
        keys = np.ascontiguousarray(compute(), np.uint64)
        if keys.ndim != 2 or keys.shape[1] != 2 or (rows is not None and keys.shape[0] != rows):
            raise ValueError(f"text keys of {entry}: computed {keys.shape}, expected ({rows}, 2)")
        np.save(tmp / KEYS_FILE, keys)
        return {"rows": int(keys.shape[0])}

    cache = StageCache(entry.parent.parent)
    keys = np.load(cache.run(CORPUS_KEYS, entry.name, build).path / KEYS_FILE)
    if rows is not None and keys.shape[0] != rows:
        discard_entry(entry, f"{keys.shape[0]} keys, not one per passage ({rows})")
        keys = np.load(cache.run(CORPUS_KEYS, entry.name, build).path / KEYS_FILE)
    return keys


def corpus_text_keys(cache_dir: Path, corpus_digest: str, passages: pa.Table) -> np.ndarray:
    """The text keys (:func:`funnelrag.content_store.text_keys` of :func:`passage_texts`) of a
    published corpus version's passages, in table order: hashed once per version and kept in the
    cache under its content digest (:func:`corpus_keys_entry`, verified on every read), so
    ``embed-corpus``, its pruning on every later night and the evaluation's lazily filled index
    read them instead of hashing every passage again.

    Parameters
    ----------
    cache_dir : ``Workspace.cache_dir``.
    corpus_digest : the version's content digest (``flows.embed.corpus_digest``): the entry's key,
        so ``passages`` must be that version's table (its length is checked).
    passages : the version's ``passages`` table (title, text).

    Returns
    -------
    numpy.ndarray
        ``(passages.num_rows, 2)`` uint64.
    """
    return _kept_text_keys(corpus_keys_entry(cache_dir, corpus_digest), passages.num_rows,
                           lambda: text_keys(passage_texts(passages)))


def retained_text_keys(stores_dir: Path, cache_dir: Path) -> np.ndarray | None:
    """The text keys (:func:`funnelrag.content_store.text_keys` of :func:`passage_texts`) of
    every passage of every corpus version the home keeps: each version under
    ``<stores>/corpus/<name>/versions/`` of every corpus, i.e. what the corpus build's retention
    (``retention.keep_versions``, :meth:`funnelrag.store.ArtifactStore.prune`) left. Every
    encoder's vector store of the home serves these corpora, so a vector whose key is not here
    is dead.

    Each version's keys come from its cache entry (:func:`corpus_text_keys`: keyed by the
    manifest's ``content_digest``, or the manifest's sha256 for a version without one); only a
    version seen for the first time, or whose entry is damaged, has its passages read and
    hashed. Entries of versions the home no longer keeps are removed.

    Returns
    -------
    numpy.ndarray or None
        ``(n, 2)`` uint64, one key per kept passage, version after version (a text several
        versions or passages share is repeated: the compaction's join on sorted keys takes them
        as they are, and ``np.unique(axis=0)`` over them cost more than reading them); None when
        the home keeps no corpus version at all (then nothing tells what is live).

    Raises
    ------
    ValueError
        A kept version's ``passages.parquet`` cannot be read (names the version and the reason):
        its live keys are unknown, so nothing may be pruned.
    """
    parts, kept = [], set()
    root = Path(stores_dir) / CORPUS_STORE
    for corpus in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        store = ArtifactStore(corpus)
        for version in store.versions():
            where = store.versions_dir / version
            manifest = store.read_manifest(version)
            digest = manifest.get("content_digest") or sha256_file(where / "manifest.json")
            rows = manifest.get("files", {}).get(PASSAGES.filename, {}).get("rows")

            def read_and_hash(where: Path = where) -> np.ndarray:
                try:
                    passages = PASSAGES.read(where, columns=["title", "text"])
                except (OSError, ValueError, pa.ArrowException) as exc:
                    raise ValueError(f"retained corpus version {where}: passages unreadable ({exc}); "
                                     f"the vector store is not pruned") from exc
                return text_keys(passage_texts(passages))

            entry = corpus_keys_entry(cache_dir, digest)
            kept.add(entry.name)
            parts.append(_kept_text_keys(entry, rows, read_and_hash))
    if not parts:
        return None
    keys_root = Path(cache_dir) / CORPUS_KEYS
    for entry in sorted(keys_root.iterdir()) if keys_root.is_dir() else []:
        if entry.is_dir() and not entry.name.startswith(".") and entry.name not in kept:   # a retired version's
            trash = keys_root / temp_name(f"removed.{entry.name}")
            os.replace(entry, trash)
            shutil.rmtree(trash, ignore_errors=True)
    return np.concatenate(parts)


def prune_vector_store(store: VectorStore, stores_dir: Path, cache_dir: Path, max_dead_share: float,
                       in_use: np.ndarray | None = None) -> Compaction:
    """Compact ``store`` (:meth:`tasks.funnel.vector_store.VectorStore.compact`), its live keys
    those of the corpus versions the home keeps (:func:`retained_text_keys`, kept per version under
    ``cache_dir``) and ``in_use`` (``(m, 2)`` uint64: the keys of the passages just embedded, live
    whatever the home keeps): once more than ``max_dead_share`` of its rows are dead, the vectors
    of texts no kept version holds are dropped. A home that keeps no corpus version, or a kept
    version that cannot be read (logged at WARNING), leaves every vector in place; duplicates and
    the segment count are still handled."""
    t0 = time.perf_counter()
    try:
        live = retained_text_keys(stores_dir, cache_dir)
    except ValueError as exc:
        log.warning("%s", exc)
        live = None
    if live is not None and in_use is not None:
        live = np.concatenate([live, in_use])
    report = store.compact(live, max_dead_share=max_dead_share)
    report.seconds = time.perf_counter() - t0
    return report


def store_root(stores_dir: Path, corpus: str, version: str) -> Path:
    """``<stores>/embeddings/<corpus>/<model version[:16]>``: one versioned store per model."""
    return Path(stores_dir) / "embeddings" / corpus / version[:16]


def publish_embedding_index(root: Path, index: EmbeddingIndex, extra: dict | None = None) -> Path:
    """Publish ``index`` atomically as a new version of the store at ``root`` and move ``current``.

    The table is written and read back through its contract (row count, ids and vectors
    checked) before ``current`` moves; a failure leaves the previous version current.

    Returns
    -------
    Path
        The published version directory.
    """
    store = ArtifactStore(root)
    staging = Path(root) / f".build-{os.getpid()}"
    path = PASSAGE_EMBEDDINGS.write(index.to_table(), staging)
    digest = sha256_file(path)

    def validate(version_dir: Path) -> None:
        back = PASSAGE_EMBEDDINGS.read(version_dir)
        if back.num_rows != len(index) or back["passage_id"].to_pylist() != index.passage_ids:
            raise ValueError(f"{version_dir}: passage ids differ from the embedded passages")

    try:
        return store.publish(store.new_version_id(digest), {PASSAGE_EMBEDDINGS.filename: path},
                             {**index.meta, "passages": len(index), **dict(extra or {})}, validate)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def open_embedding_index(root: Path, corpus_digest: str, version: str) -> EmbeddingIndex:
    """The current embedding index of the store at ``root``, checked against the corpus and model.

    Raises
    ------
    FileNotFoundError
        Nothing published at ``root``.
    EmbeddingIndexMismatch
        The current version was built from another corpus digest or model version.
    """
    store = ArtifactStore(root)
    manifest = store.read_manifest()
    meta = {k: manifest.get(k) for k in (*MANIFEST_KEYS, "dim", "max_length", "text")}
    probe = EmbeddingIndex([], [], np.zeros(0, np.int32), np.zeros((0, 1), np.float32), meta)
    probe.check(corpus_digest, version)                       # before reading 200+ MB of vectors
    if manifest.get("layout") == MAPPED_LAYOUT:
        return MappedEmbeddingIndex(store.current_dir(), {**meta, "dtype": manifest.get("dtype")})
    index = EmbeddingIndex.from_table(PASSAGE_EMBEDDINGS.read(store.current_dir()), meta)
    return index


def find_embedding_index(stores_dir: Path, corpus: str, corpus_digest: str, model) -> EmbeddingIndex | None:
    """The published embedding index of ``model``'s document tower over this corpus version, or
    None when none is published (query-side distillation and re-ranking read it when it exists).

    Raises
    ------
    EmbeddingIndexMismatch
        The store's current index was built from another corpus version.
    """
    version = model_version(model)
    try:
        return open_embedding_index(store_root(stores_dir, corpus, version), corpus_digest, version)
    except FileNotFoundError:
        return None


def ensure_embedding_index(stores_dir: Path, cache_dir: Path, corpus: str, corpus_digest: str, passages: pa.Table,
                           model, tokenizer, cfg: EmbeddingConfig = EmbeddingConfig(), build: bool = True,
                           progress: Callable[[int, int], None] | None = None,
                           embed_missing: Callable[[list[str], np.ndarray, VectorStore], dict] | None = None,
                           ) -> tuple[EmbeddingIndex, dict]:
    """The published index of (corpus digest, model version), embedding and publishing it first
    when there is none (the stage the ``embed-corpus`` flow and the nightly build run).

    Parameters
    ----------
    stores_dir, cache_dir : ``Workspace.home / "stores"`` and ``Workspace.cache_dir``.
    corpus : corpus name (``wikispeedia``).
    corpus_digest, passages : the published corpus version's content digest and passages.
    model, tokenizer : the bi-encoder pre-ranker.
    build : False: never embed (raise instead when no matching index is published).
    embed_missing : ``embed_missing(texts, keys, store) -> figures`` (``keys``: the texts' keys,
        :func:`corpus_text_keys`), called before the index is built
        when one must be: fills ``store`` with the vectors it lacks elsewhere (the ``embed-corpus``
        flow's data-parallel workers, :func:`flows.launched.embed.embed_with_workers`); the index
        step then joins what the workers wrote. Its figures go to ``info["workers"]``.

    Returns
    -------
    (EmbeddingIndex, info)
        ``info`` = ``{"cache_hit", "model_version", "store", "version", ...}`` plus, when it
        embedded, the build figures of :func:`build_embedding_index`, ``vectors_pruned`` (dead
        vectors dropped from the store) and ``compaction``
        (:meth:`tasks.funnel.vector_store.Compaction.as_dict`). The store is pruned here, after
        publishing, rather than by the corpus build's retention: this step runs after every build
        that moves ``current`` (the nightly's ``embed-champion``), knows the encoder's store, and
        keeps the corpus build ignorant of embeddings.

    Raises
    ------
    FileNotFoundError, EmbeddingIndexMismatch
        ``build`` is False and no index of this corpus and model is published.
    """
    version = model_version(model)
    root = store_root(stores_dir, corpus, version)
    try:
        index = open_embedding_index(root, corpus_digest, version)
        return index, {"cache_hit": True, "model_version": version, "store": str(root),
                       "version": ArtifactStore(root).current_version(), "passages": len(index)}
    except (FileNotFoundError, EmbeddingIndexMismatch):
        if not build:
            raise
    store = passage_vector_store(cache_dir, model)
    keys = corpus_text_keys(cache_dir, corpus_digest, passages)                   # (n, 2), hashed once a version
    workers = None if embed_missing is None else embed_missing(passage_texts(passages), keys, store)
    index, info = build_embedding_index(passages, model, tokenizer, corpus_digest, cfg, store, progress, keys)
    if workers is not None:
        info = {**info, "workers": workers, "embedded": info["embedded"] + int(workers.get("embedded_total", 0))}
    if cfg.layout == MAPPED_LAYOUT:
        path = publish_mapped_embedding_index(root, index.passage_ids, index.unit_ids, index.cluster_ids,
                                              lambda rows: index.vectors[rows],
                                              {**index.meta, "batch_size": cfg.batch_size}, dtype=cfg.dtype)
        index = open_embedding_index(root, corpus_digest, version)
    else:
        path = publish_embedding_index(root, index, {"batch_size": cfg.batch_size})
    compaction = prune_vector_store(store, stores_dir, cache_dir, cfg.max_dead_share, keys)
    return index, {"cache_hit": False, "model_version": version, "store": str(root), "version": path.name, **info,
                   "vectors_pruned": compaction.dead if compaction.rewritten else 0, "compaction": compaction.as_dict()}


# ---------------------------------------------------------------------------- memory-mapped layout
MAPPED_LAYOUT = "mapped"
MAPPED_VECTORS = "passage_vectors.npy"
MAPPED_IDS = "passage_ids.arrow"
VECTOR_DTYPES = ("float32", "float16")


class _ArrowStrings:
    """Read-only ``seq[i] -> str`` over a (memory-mapped) Arrow string array."""

    def __init__(self, array: pa.Array):
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> str:
        return self.array[int(i)].as_py()

    def take(self, rows: np.ndarray) -> list[str]:
        return self.array.take(pa.array(np.asarray(rows, dtype=np.int64))).to_pylist()


class MappedEmbeddingIndex:
    """An embedding index read through memory maps: nothing is loaded that grows with the
    number of passages; a query touches only the pages of the rows it reads.

    Layout of a version directory (``layout: mapped`` in the manifest, written by
    :func:`publish_mapped_embedding_index`): ``passage_vectors.npy`` (``(n, dim)`` float32 or
    float16, L2-normalised rows) and ``passage_ids.arrow`` (an uncompressed Arrow IPC file:
    ``passage_id``, ``unit_id``, ``cluster_id`` int64, ``unit_code`` int32 = the rank of the unit
    id among the sorted unit ids). Rows are grouped by cluster (ascending cluster id, corpus order
    inside a cluster), so the passages of a cluster are one contiguous block of the vector file.
    Same interface as :class:`EmbeddingIndex` for :mod:`tasks.funnel.stored` and the evaluation.
    """

    def __init__(self, directory: Path, meta: dict):
        directory = Path(directory)
        self.vectors = np.load(directory / MAPPED_VECTORS, mmap_mode="r")                 # (n, dim)
        self._source = pa.memory_map(str(directory / MAPPED_IDS))
        table = pa.ipc.open_file(self._source).read_all()                               # zero-copy
        if self.vectors.ndim != 2 or self.vectors.shape[0] != table.num_rows:
            raise ValueError(f"{directory}: {table.num_rows} id rows but vectors {self.vectors.shape}")
        self.passage_ids = _ArrowStrings(table["passage_id"].combine_chunks())
        self.unit_ids = _ArrowStrings(table["unit_id"].combine_chunks())
        self.cluster_ids = table["cluster_id"].combine_chunks().to_numpy()              # (n,) int64, mapped
        self.unit_codes = table["unit_code"].combine_chunks().to_numpy()                # (n,) int32, mapped
        self.meta = dict(meta)

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def check(self, corpus_digest: str, version: str) -> None:
        """See :meth:`EmbeddingIndex.check`."""
        EmbeddingIndex.check(self, corpus_digest, version)

    def row_of(self) -> dict[str, int]:
        """``passage_id → row`` (built once: a dict over every passage, for the flat re-ranker
        of the evaluation; the progressive path does not need it)."""
        if getattr(self, "_row_of", None) is None:
            self._row_of = {p: i for i, p in enumerate(self.passage_ids.array.to_pylist())}
        return self._row_of

    def rows_of_clusters(self, cluster_ids: Sequence[int]) -> np.ndarray:
        """Row indices of every passage of ``cluster_ids``, int64, cluster by cluster in the
        order given (binary search of the mapped, sorted cluster ids: contiguous blocks)."""
        c = np.asarray(cluster_ids, dtype=self.cluster_ids.dtype)          # same dtype: no O(n) cast
        lo = np.searchsorted(self.cluster_ids, c, side="left")
        hi = np.searchsorted(self.cluster_ids, c, side="right")
        return np.concatenate([np.arange(a, b) for a, b in zip(lo, hi)]) if c.size else np.zeros(0, np.int64)

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """The vectors of ``rows`` as float32 ``(len(rows), dim)``: one slice copy out of the map
        per run of consecutive rows (a cluster's passages are one run), then one cast."""
        rows = np.asarray(rows, dtype=np.int64)
        if not rows.size:
            return np.zeros((0, self.dim), np.float32)
        cut = np.flatnonzero(np.diff(rows) != 1) + 1                       # starts of the runs
        starts, ends = np.r_[0, cut], np.r_[cut, rows.size]
        vec = self.vectors.view(np.ndarray)                                # the map, without memmap's wrapping
        parts = [vec[rows[a]:rows[a] + (b - a)] for a, b in zip(starts, ends)]
        return np.concatenate(parts).astype(np.float32, copy=False)

    def unit_names_at(self, rows: np.ndarray) -> list[str]:
        return self.unit_ids.take(rows)

    def passage_ids_at(self, rows: np.ndarray) -> list[str]:
        return self.passage_ids.take(rows)


def publish_mapped_embedding_index(root: Path, passage_ids: Sequence[str], unit_ids: Sequence[str],
                                   cluster_ids: np.ndarray, fill: Callable[[np.ndarray], np.ndarray], meta: dict,
                                   dtype: str = "float32", block_rows: int = 65_536) -> Path:
    """Publish an embedding index in the memory-mapped layout (:class:`MappedEmbeddingIndex`)
    atomically as a new version of the store at ``root`` and move ``current``.

    Parameters
    ----------
    root : the store (:func:`store_root`).
    passage_ids, unit_ids, cluster_ids : ``(n,)`` ids of the corpus passages, corpus order.
    fill : ``fill(rows) -> float32 (len(rows), dim)``: the L2-normalised vectors of those corpus
        rows (called block by block, ``block_rows`` at a time, in the index's row order), so the
        vectors never need to be in memory all at once.
    meta : ``corpus_digest``, ``model_version``, ``dim`` (+ anything else for the manifest).
    dtype : ``float32`` or ``float16`` (half the bytes; scores differ by ~1e-3).

    Returns
    -------
    Path
        The published version directory.

    Raises
    ------
    ValueError
        Unknown dtype, ids of different lengths, a block of the wrong shape, or rows that are not
        unit vectors (norm off by more than 1e-2; names the first bad row).
    """
    if dtype not in VECTOR_DTYPES:
        raise ValueError(f"mapped embedding index dtype must be one of {VECTOR_DTYPES}, got {dtype!r}")
    n, dim = len(passage_ids), int(meta["dim"])
    cluster_ids = np.asarray(cluster_ids, dtype=np.int64)
    if len(unit_ids) != n or cluster_ids.shape != (n,):
        raise ValueError(f"mapped embedding index: {n} passage ids, {len(unit_ids)} unit ids, "
                         f"{cluster_ids.shape[0]} cluster ids")
    order = np.argsort(cluster_ids, kind="stable")                                 # rows grouped by cluster
    names, codes = np.unique(np.asarray(unit_ids, dtype=object).astype(str), return_inverse=True)
    pids = pa.array(passage_ids, pa.string()).take(pa.array(order))
    table = pa.table({"passage_id": pids, "unit_id": pa.array(unit_ids, pa.string()).take(pa.array(order)),
                      "cluster_id": pa.array(cluster_ids[order], pa.int64()),
                      "unit_code": pa.array(codes.reshape(-1)[order].astype(np.int32), pa.int32())})
    store = ArtifactStore(root)
    staging = Path(root) / f".build-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        vec_path, ids_path = staging / MAPPED_VECTORS, staging / MAPPED_IDS
        out = np.lib.format.open_memmap(vec_path, mode="w+", dtype=np.dtype(dtype), shape=(n, dim))
        for start in range(0, n, block_rows):
            rows = order[start:start + block_rows]
            block = np.asarray(fill(rows), dtype=np.float32)
            if block.shape != (len(rows), dim):
                raise ValueError(f"mapped embedding index: fill gave {block.shape} for {len(rows)} rows of dim {dim}")
            bad = np.flatnonzero(np.abs(np.linalg.norm(block, axis=1) - 1.0) > 1e-2)
            if bad.size:
                raise ValueError(f"mapped embedding index: corpus row {int(rows[bad[0]])} "
                                 f"({passage_ids[int(rows[bad[0]])]!r}) is not a unit vector")
            out[start:start + len(rows)] = block
        out.flush()
        del out
        with pa.OSFile(str(ids_path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table.combine_chunks())

        def validate(version_dir: Path) -> None:
            back = MappedEmbeddingIndex(version_dir, meta)
            if len(back) != n or back.dim != dim or back.vectors.dtype != np.dtype(dtype):
                raise ValueError(f"{version_dir}: read back {back.vectors.shape} {back.vectors.dtype}")

        return store.publish(store.new_version_id(sha256_file(ids_path)),
                             {MAPPED_VECTORS: vec_path, MAPPED_IDS: ids_path},
                             {**meta, "layout": MAPPED_LAYOUT, "dtype": dtype, "passages": n}, validate)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


PRECISIONS = ("fp32", "int8", "bf16")


def with_precision(model, precision: str):
    """A copy of a bi-encoder pre-ranker for faster CPU inference, or ``model`` itself for fp32.

    ``int8``: ``torch.ao.quantization.quantize_dynamic`` of every ``nn.Linear`` (int8 weights,
    activations quantised per batch; fbgemm uses AVX-512 VNNI where the CPU has it).
    ``bf16``: weights and activations in bfloat16 (AVX-512 BF16 / AMX where present); the
    pooled embeddings are returned as float32 by :func:`models.encoders.encode`.
    A non-fp32 copy computes other vectors: its :func:`model_version` differs, so its index
    is a different artifact.

    Raises
    ------
    ValueError
        Unknown ``precision``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return model
    fast = copy.deepcopy(model).eval()
    if precision == "int8":
        fast.encoder = torch.ao.quantization.quantize_dynamic(fast.encoder, {torch.nn.Linear}, dtype=torch.qint8)
    else:
        fast.encoder = fast.encoder.to(torch.bfloat16)
    return fast
