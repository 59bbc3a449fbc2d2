"""Versioned artifact store and content-keyed stage cache.

A flow run stages its artifacts in ``versions/.staging-<id>/``, writes ``manifest.json`` last,
renames the directory to ``versions/<id>/``, validates it, and only then moves the ``current``
pointer (a one-line file replaced atomically). A failed or killed run leaves ``current`` and
every published version untouched. Stage outputs live in a cache keyed by the sha256 of the
stage name, its code version, its config and the digests of its inputs (content, never paths),
so a re-run reuses every stage whose inputs did not change.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import pyarrow.parquet as pq

from data_contracts.base import atomic_write, atomic_write_bytes, link_or_copy, sha256_file, temp_name
from funnelrag import __version__
from funnelrag.config import config_hash, redact, to_jsonable
from funnelrag.reaper import sweep_stale_temp_dirs
from funnelrag.verify import DIGESTS_FILE, record_digests, verified_entry

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
COMPLETE = "COMPLETE"
MANIFEST_VERSION = 1


def code_version() -> str:
    """``funnelrag <version>+g<git sha>[.dirty]`` of the checkout, or the package version alone."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return f"funnelrag {__version__}+g{sha}{'.dirty' if dirty else ''}"
    except (OSError, subprocess.SubprocessError):
        return f"funnelrag {__version__}"


def canonical_json(obj: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, 1-space indent, trailing newline)."""
    return (json.dumps(to_jsonable(obj), sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def dir_digest(files: Mapping[str, str]) -> str:
    """Digest of a set of files given as ``{relative name: sha256}``."""
    return config_hash(sorted(files.items()))


def describe_file(path: Path, sha256: str | None = None) -> dict[str, Any]:
    """sha256, size (bytes) and, for Parquet, rows and contract name/version of one file.
    ``sha256``: the file's digest when already known (read from a stage cache entry's marker),
    so the file is not read again."""
    info: dict[str, Any] = {"sha256": sha256 or sha256_file(path), "bytes": path.stat().st_size}
    if path.suffix == ".parquet":
        md = pq.read_metadata(path)
        info["rows"] = md.num_rows
        meta = md.schema.to_arrow_schema().metadata or {}
        if b"funnelrag.contract" in meta:
            info["contract"] = meta[b"funnelrag.contract"].decode()
            info["schema_version"] = int(meta[b"funnelrag.schema_version"].decode())
    return info


# ---------------------------------------------------------------------------- stage cache
@dataclass(frozen=True)
class StageResult:
    """Outputs of one stage in the cache: directory, file digests, stage summary, hit flag."""

    path: Path
    files: dict[str, str]
    summary: dict[str, Any]
    cache_hit: bool

    @property
    def digest(self) -> str:
        return dir_digest(self.files)


class StageCache:
    """Content-keyed cache of stage output directories under ``root/<stage>/<key>/``."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @staticmethod
    def key(stage: str, stage_version: str, config: Any, inputs: Mapping[str, str]) -> str:
        """sha256 over the stage name, its code version, its config and its input digests."""
        return config_hash({"stage": stage, "version": stage_version, "config": config, "inputs": dict(sorted(inputs.items()))})

    def run(self, stage: str, key: str, build: Callable[[Path], dict[str, Any]]) -> StageResult:
        """Return the cached outputs for ``key`` or call ``build(tmp_dir) -> summary`` to make them.

        ``build`` writes its files into ``tmp_dir``; on success the directory gets a
        ``COMPLETE`` marker (with file digests and the summary) and its digest manifest
        (:func:`funnelrag.verify.record_digests`, last) and is renamed into place. A hit is read
        only after its files match that manifest (:func:`funnelrag.verify.verified_entry`); an
        entry that does not (other bytes, a truncated or missing file, no manifest: a killed run
        or an older release) is discarded, logged and rebuilt.
        """
        final = self.root / stage / key
        marker = final / COMPLETE
        if verified_entry(final) and marker.exists():
            meta = json.loads(marker.read_text())
            mark_used(final)
            log.info("stage %s: cache hit %s", stage, key[:12])
            return StageResult(final, meta["files"], meta["summary"], True)

        sweep_stale_temp_dirs(self.root / stage)  # left by killed runs (GBs at full scale)
        tmp = self.root / stage / temp_name(key)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            summary = build(tmp)
            files = {p.relative_to(tmp).as_posix(): sha256_file(p)
                     for p in sorted(tmp.rglob("*")) if p.is_file()}
            atomic_write_bytes(tmp / COMPLETE, canonical_json({"files": files, "summary": summary}))
            record_digests(tmp, files)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return StageResult(final, files, summary, False)


# ---------------------------------------------------------------------------- cache retention
# Files whose modification time records an entry's last use, by kind of entry: every entry's
# digest manifest (funnelrag.verify); in entries written before it, stage and shard entries'
# COMPLETE, ingest pieces' piece.json, passage index shards' params.index.json.
ENTRY_MARKERS = (DIGESTS_FILE, COMPLETE, "piece.json", "params.index.json")


def entry_marker(entry: Path | str) -> Path:
    """The file whose modification time is ``entry``'s last use (:data:`ENTRY_MARKERS`), or the
    directory itself when it holds none."""
    entry = Path(entry)
    return next((entry / n for n in ENTRY_MARKERS if (entry / n).is_file()), entry)


def mark_used(entry: Path | str) -> None:
    """Record that a build used the cache entry directory ``entry`` now (its marker's
    modification time, :data:`ENTRY_MARKERS`), which :func:`prune_cache` reads. Every cache hit
    calls it; an entry removed meanwhile is left alone (the caller then finds it missing)."""
    try:
        os.utime(entry_marker(entry))
    except FileNotFoundError:
        pass


def cache_entries(root: Path | str) -> list[Path]:
    """The entries of a cache tree: a directory directly under ``root`` that holds a marker
    (a memo, e.g. ``bm25-memo-passages-<settings>/``) is one entry; any other directory there
    (``<stage>/``, ``segment-shards/``, ...) holds one entry per sub-directory. Names that start
    with a dot (work in progress, ``.tmp-…``) are never entries."""
    root = Path(root)
    found: list[Path] = []
    if not root.is_dir():
        return found
    for group in sorted(root.iterdir()):
        if not group.is_dir() or group.name.startswith("."):
            continue
        if entry_marker(group) != group:
            found.append(group)
            continue
        found += [e for e in sorted(group.iterdir()) if e.is_dir() and not e.name.startswith(".")]
    return found


@dataclass
class PruneReport:
    """What :func:`prune_cache` removed: entries, bytes freed (files no published version still
    links), their paths relative to the cache root."""

    entries: int = 0
    bytes_freed: int = 0
    removed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"entries": self.entries, "bytes_freed": self.bytes_freed}


def _remove_dir(path: Path) -> None:
    """Rename ``path`` to a ``.tmp-<pid>-removed.<name>`` sibling (atomic; a killed removal is swept
    like a killed build's temp directory, :func:`funnelrag.reaper.sweep_stale_temp_dirs`), then delete it."""
    trash = path.parent / temp_name(f"removed.{path.name}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def sweep_cache_temps(root: Path | str) -> list[Path]:
    """Remove what killed runs left in a cache tree (:func:`funnelrag.reaper.sweep_stale_temp_dirs`:
    temp names whose owner pid is gone): in the root (the memos' :func:`data_contracts.base.atomic_directory`
    temps, removed entries, a build's scratch directories) and in each group (stage builds, cache
    entries written by killed pool workers). Returns what was removed; a live writer's work stays."""
    root = Path(root)
    removed = sweep_stale_temp_dirs(root)
    for group in (sorted(root.iterdir()) if root.is_dir() else []):
        if group.is_dir() and not group.name.startswith("."):
            removed += sweep_stale_temp_dirs(group)
    return removed


def prune_cache(root: Path | str, max_age_s: float, now: float | None = None) -> PruneReport:
    """Retention of a cache tree: remove every entry (:func:`cache_entries`) that no build used
    for ``max_age_s`` seconds (:func:`mark_used`; an entry is used when it is made or hit).

    Removing an entry never breaks a build: each entry is self-contained and a missing one is
    rebuilt when a build needs it again (a memo that is gone makes the next build tokenize or
    segment every text once). Published versions hold hard links to the stage outputs they were
    assembled from, so an entry's bytes are freed only once no version links them
    (``bytes_freed`` counts those). Temp directories of killed runs are swept too, in the root (the
    memos') and in each group. A build of another corpus in the same home that hits an entry in the
    instant it is removed fails reading it (nothing is corrupted; its next run rebuilds the entry).

    Raises ``ValueError`` for ``max_age_s`` <= 0.
    """
    if max_age_s <= 0:
        raise ValueError(f"prune_cache: max age {max_age_s} s must be positive")
    root = Path(root)
    cutoff = (time.time() if now is None else now) - max_age_s
    report = PruneReport()
    for entry in cache_entries(root):
        try:
            if entry_marker(entry).stat().st_mtime >= cutoff:
                continue
            freed = sum(st.st_size for st in (f.stat() for f in entry.rglob("*") if f.is_file()) if st.st_nlink == 1)
            _remove_dir(entry)
        except FileNotFoundError:   # removed meanwhile
            continue
        report.entries += 1
        report.bytes_freed += freed
        report.removed.append(entry.relative_to(root).as_posix())
    sweep_cache_temps(root)
    if report.entries:
        log.info("retention: removed %d cache entries unused for %.1f days from %s (%.1f MB freed)",
                 report.entries, max_age_s / 86400, root, report.bytes_freed / 1e6)
    return report


# ---------------------------------------------------------------------------- versioned store
class ArtifactStore:
    """Published versions of one artifact set (e.g. the corpus) with a ``current`` pointer."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.versions_dir = self.root / "versions"

    def versions(self) -> list[str]:
        if not self.versions_dir.exists():
            return []
        return sorted(p.name for p in self.versions_dir.iterdir()
                      if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST).exists())

    def new_version_id(self, digest: str, now: float | None = None) -> str:
        """A fresh version name: UTC time to the microsecond, then the first 8 hex of ``digest``.

        Names sort chronologically. Two publishes of the same content within one clock tick
        (a cached re-run finishes in well under a second) get a ``-N`` suffix instead of colliding.

        Parameters
        ----------
        digest : str
            Content digest of the version (hex).
        now : float, optional
            POSIX seconds; the current time by default.
        """
        micros = time.time_ns() // 1000 if now is None else int(now * 1_000_000)
        base = (time.strftime("%Y%m%dT%H%M%S", time.gmtime(micros // 1_000_000))
                + f".{micros % 1_000_000:06d}Z-{digest[:8]}")
        candidate, n = base, 1
        while (self.versions_dir / candidate).exists() or (self.versions_dir / f".staging-{candidate}").exists():
            n += 1
            candidate = f"{base}-{n}"
        return candidate

    def current_version(self) -> str | None:
        pointer = self.root / "current"
        if not pointer.exists():
            return None
        return pointer.read_text().strip() or None

    def current_dir(self) -> Path:
        """Directory of the current version.

        Raises
        ------
        FileNotFoundError
            Nothing has been published yet, or the pointer names a missing version.
        """
        version = self.current_version()
        if version is None:
            raise FileNotFoundError(f"no published version in {self.root} (run `funnelrag build-corpus` first)")
        path = self.versions_dir / version
        if not (path / MANIFEST).exists():
            raise FileNotFoundError(f"current pointer of {self.root} names {version}, which has no manifest")
        return path

    def read_manifest(self, version: str | None = None) -> dict[str, Any]:
        path = self.current_dir() if version is None else self.versions_dir / version
        return json.loads((path / MANIFEST).read_text())

    def publish(self, version_id: str, files: Mapping[str, Path], manifest_extra: Mapping[str, Any],
                validate: Callable[[Path], None], make_current: bool = True,
                digests: Mapping[str, str] | None = None) -> Path:
        """Assemble, validate and publish a version; move ``current`` only if all of it passed.

        Parameters
        ----------
        version_id : str
            Directory name of the new version (refused if it already exists).
        files : mapping of relative name → source path
            Hard-linked (or copied across devices) into the version directory.
        manifest_extra : mapping
            Config, code version, counts: stored in the manifest beside the file descriptions.
        validate : callable
            ``validate(version_dir)`` raises on any problem; then nothing is published.
        make_current : bool
            Move ``current`` to the new version (``False``: a quality gate decides later,
            :meth:`set_current`).
        digests : mapping of relative name → sha256, optional
            Digests already known of some of ``files`` (the stage cache's, taken when its entry
            was written; entries are never modified after): the manifest takes them instead of
            reading those files again. :meth:`verify` still checks them against the files.

        Returns
        -------
        Path
            The published version directory.
        """
        final = self.versions_dir / version_id
        if final.exists():
            raise FileExistsError(f"version {version_id} already exists in {self.versions_dir}")
        staging = self.versions_dir / f".staging-{version_id}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            for name, src in sorted(files.items()):
                link_or_copy(src, staging / name)
            described = {name: describe_file(staging / name, (digests or {}).get(name)) for name in sorted(files)}
            manifest = {"manifest_version": MANIFEST_VERSION, "files": described, **manifest_extra}
            atomic_write_bytes(staging / MANIFEST, canonical_json(redact(manifest)))  # written last; no URL's credentials
            validate(staging)
            os.replace(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        log.info("published %s", final)
        if make_current:
            self.set_current(version_id)
        return final

    def prune(self, keep: int) -> list[str]:
        """Retention: remove every published version but the newest ``keep`` (names sort
        chronologically) and ``current``, whichever it is. A version is renamed out of
        ``versions/`` first (atomic), so a reader sees it whole or not at all. Returns the removed
        version ids, oldest first.

        Raises ``ValueError`` for ``keep`` < 1."""
        if keep < 1:
            raise ValueError(f"keep the newest {keep} versions: keep at least 1")
        current = self.current_version()
        versions = self.versions()
        dropped = [v for v in versions[:max(len(versions) - keep, 0)] if v != current]
        for version in dropped:
            _remove_dir(self.versions_dir / version)
            log.info("retention: removed version %s of %s", version, self.root)
        return dropped

    def set_current(self, version_id: str) -> None:
        """Atomically point ``current`` at a published version.

        Raises
        ------
        FileNotFoundError
            ``version_id`` is not a published version (no manifest).
        """
        if not (self.versions_dir / version_id / MANIFEST).exists():
            raise FileNotFoundError(f"cannot make {version_id} current: not a published version in {self.versions_dir}")
        atomic_write_bytes(self.root / "current", (version_id + "\n").encode())
        log.info("current → %s", version_id)

    def verify(self, version: str | None = None) -> None:
        """Re-hash every file of a version against its manifest.

        Raises
        ------
        ValueError
            A file is missing or its sha256 differs (names the file).
        """
        path = self.current_dir() if version is None else self.versions_dir / version
        manifest = json.loads((path / MANIFEST).read_text())
        for name, info in manifest["files"].items():
            f = path / name
            if not f.exists():
                raise ValueError(f"{path}: file {name} listed in the manifest is missing")
            if sha256_file(f) != info["sha256"]:
                raise ValueError(f"{path}: file {name} does not match its manifest sha256")


def write_json(path: Path, obj: Any) -> None:
    """Atomically write canonical JSON (a run summary, a report), the credentials of every URL in it
    redacted (:func:`funnelrag.config.redact`)."""
    atomic_write(Path(path), lambda p: p.write_bytes(canonical_json(redact(obj))))
