"""Nothing read from a cache is trusted blindly: every cache entry's digest manifest.

A cache entry is a directory of files that a build wrote and a later build reads instead of
computing them again (a stage output, a shard's output, a memo, a kept ingest piece). When it is
written, :func:`record_digests` writes ``digests.json`` into it last: the size and sha256 of each
of its other files. Before a build reads an entry, :func:`verified_entry` re-hashes its files
against that manifest; an entry with a file of other bytes, a truncated or missing file, an
unlisted file or no manifest (one written before entries recorded their digests) is moved aside
atomically and deleted (:func:`discard_entry`), its path and the reason logged at WARNING, and the
caller builds it again, as when it was never there. git verifies each object it reads the same way.

The digests are sha256 (hashlib's OpenSSL SHA-256: 1.4 GB/s a core on the development box,
twice blake2b's), the hash the stage cache and the published manifests already take.

:func:`first_difference` compares the files of two builds (``funnelrag build-corpus --verify``)
and names the first table and row where they differ.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pyarrow.parquet as pq

from data_contracts.base import atomic_write_bytes, sha256_file, temp_name

log = logging.getLogger(__name__)

DIGESTS_FILE = "digests.json"
"""An entry's digest manifest: ``{"digests_version", "files": {relative name: {"bytes", "sha256"}}}``."""
DIGESTS_VERSION = 1


def entry_files(directory: Path) -> list[Path]:
    """Every file of the entry ``directory`` (recursively, sorted) but its digest manifest."""
    directory = Path(directory)
    return [p for p in sorted(directory.rglob("*")) if p.is_file() and p.relative_to(directory).as_posix() != DIGESTS_FILE]


def record_digests(directory: Path | str, known: Mapping[str, str] | None = None) -> dict[str, str]:
    """Write the digest manifest of the entry ``directory`` (:data:`DIGESTS_FILE`), last, after
    every other file of it is written and before it is renamed into place.

    Parameters
    ----------
    directory : path
        The entry's (temporary) directory, complete but for the manifest.
    known : mapping of relative name → sha256, optional
        Digests already taken of some of its files (the stage cache's marker; files hard-linked
        from an entry that was verified when opened), so they are not read again. A name whose
        file is not there is ignored.

    Returns
    -------
    dict
        ``{relative name: sha256}`` of every file recorded.
    """
    directory = Path(directory)
    known = known or {}
    files: dict[str, dict[str, Any]] = {}
    for path in entry_files(directory):
        name = path.relative_to(directory).as_posix()
        files[name] = {"bytes": path.stat().st_size, "sha256": known.get(name) or sha256_file(path)}
    body = {"digests_version": DIGESTS_VERSION, "files": files}
    atomic_write_bytes(directory / DIGESTS_FILE, (json.dumps(body, sort_keys=True, indent=1) + "\n").encode())
    return {name: info["sha256"] for name, info in files.items()}


def entry_problem(directory: Path | str) -> str | None:
    """Why the entry ``directory`` cannot be trusted, or ``None`` when every file it recorded is
    there with its recorded size and sha256 and it holds no other file.

    Checked in order of cost: the manifest (absent, unreadable, another version), each listed
    file's presence and size (a truncation is found without reading), unlisted files, then the
    sha256 of each file."""
    directory = Path(directory)
    manifest = directory / DIGESTS_FILE
    if not manifest.is_file():
        return f"no digest manifest ({DIGESTS_FILE}: written before entries recorded their digests, or not complete)"
    try:
        body = json.loads(manifest.read_text())
        files = {str(k): (int(v["bytes"]), str(v["sha256"])) for k, v in body["files"].items()}
        if body.get("digests_version") != DIGESTS_VERSION:
            return f"{DIGESTS_FILE} of version {body.get('digests_version')!r}, not {DIGESTS_VERSION}"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"unreadable {DIGESTS_FILE} ({exc!r})"
    for name, (size, _) in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            return f"missing file {name}"
        actual = path.stat().st_size
        if actual != size:
            return f"file {name} has {actual:,} bytes, {size:,} when written ({'truncated' if actual < size else 'grown'})"
    present = {p.relative_to(directory).as_posix() for p in entry_files(directory)}
    if extra := sorted(present - set(files)):
        return f"file {extra[0]} not in its {DIGESTS_FILE}" + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else "")
    for name, (_, digest) in sorted(files.items()):
        if sha256_file(directory / name) != digest:
            return f"file {name} has other bytes than when written (sha256 differs)"
    return None


def discard_entry(directory: Path | str, reason: str) -> None:
    """Move the entry ``directory`` aside (one atomic rename to a ``.tmp-<pid>-discarded.…``
    sibling, :func:`data_contracts.base.temp_name`, which :func:`funnelrag.reaper.sweep_stale_temp_dirs` removes should this process die
    first), delete it, and log its path and ``reason`` at WARNING. An entry gone meanwhile (another
    build discarded it) is left alone."""
    directory = Path(directory)
    trash = directory.parent / temp_name(f"discarded.{directory.name}")
    try:
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(directory, trash)
    except FileNotFoundError:
        return
    log.warning("cache entry %s discarded: %s; it is built again", directory, reason)
    shutil.rmtree(trash, ignore_errors=True)


def verified_entry(directory: Path | str | None) -> bool:
    """Whether the cache entry ``directory`` may be read: it exists and :func:`entry_problem`
    finds nothing. An entry that exists but fails the check is discarded (:func:`discard_entry`:
    moved aside, its path and the reason logged at WARNING), so the caller builds it again and
    stores the new one in its place. ``None`` or an absent directory: ``False``, nothing logged."""
    if directory is None or not Path(directory).is_dir():
        return False
    problem = entry_problem(directory)
    if problem is None:
        return True
    discard_entry(directory, problem)
    return False


# ---------------------------------------------------------------------------- first difference
def first_difference(left: Mapping[str, Path], right: Mapping[str, Path], batch_rows: int = 65_536) -> dict[str, Any] | None:
    """The first file of two builds (``{relative name: path}`` each; ``left``'s names in its order,
    then those only ``right`` has) whose bytes differ, and where: ``{"file", "row"}`` for Parquet
    tables (the first row, 0-based, whose values differ, ``"column"`` the first column that differs
    there; a row past the end of the shorter table when one holds more rows; ``"error"`` when a
    file cannot be read as a table, with the first differing ``"byte"``), ``{"file", "element"}``
    for ``.npy`` arrays (flat index; ``"shape"`` when the shapes differ), ``{"file", "byte"}``
    for other files; ``{"file", "missing"}`` names the side without the file (``"left"`` or
    ``"right"``). ``None`` when both hold the same names with the same bytes.

    Files are compared by size and sha256 first; only the first differing one is read."""
    for name in [*left, *(n for n in right if n not in left)]:
        a, b = left.get(name), right.get(name)
        if a is None or b is None or not Path(a).is_file() or not Path(b).is_file():
            return {"file": name, "missing": "left" if a is None or not Path(a).is_file() else "right"}
        a, b = Path(a), Path(b)
        if a.stat().st_size == b.stat().st_size and sha256_file(a) == sha256_file(b):
            continue
        if name.endswith(".parquet"):
            return {"file": name, **_first_row(a, b, batch_rows)}
        if name.endswith(".npy"):
            return {"file": name, **_first_element(a, b)}
        return {"file": name, "byte": _first_byte(a, b)}
    return None


def _first_row(a: Path, b: Path, batch_rows: int) -> dict[str, Any]:
    """Where two Parquet files first differ in their rows (see :func:`first_difference`)."""
    try:
        ta, tb = pq.read_table(a, memory_map=True), pq.read_table(b, memory_map=True)
    except (OSError, ValueError) as exc:   # pyarrow's errors on a damaged file are both
        return {"row": None, "error": f"unreadable as a table ({exc})", "byte": _first_byte(a, b)}
    if ta.schema.remove_metadata() != tb.schema.remove_metadata():
        return {"row": 0, "schema": "the two tables' schemas differ"}
    n = min(ta.num_rows, tb.num_rows)
    for lo in range(0, n, batch_rows):
        sa, sb = ta.slice(lo, batch_rows), tb.slice(lo, batch_rows)
        if sa.equals(sb):
            continue
        for column in ta.column_names:
            va, vb = sa.column(column).to_pylist(), sb.column(column).to_pylist()
            if va != vb:
                row = next(i for i, (x, y) in enumerate(zip(va, vb)) if x != y)
                return {"row": lo + row, "column": column}
    if ta.num_rows != tb.num_rows:
        return {"row": n, "rows": [ta.num_rows, tb.num_rows]}
    return {"row": None, "metadata": "same rows; the files differ in their metadata or encoding"}


def _first_element(a: Path, b: Path) -> dict[str, Any]:
    """Where two ``.npy`` arrays first differ (see :func:`first_difference`)."""
    try:
        xa, xb = np.load(a, mmap_mode="r"), np.load(b, mmap_mode="r")
    except ValueError:   # unreadable (e.g. truncated) or an object array: the bytes say where
        return {"byte": _first_byte(a, b)}
    if xa.shape != xb.shape or xa.dtype != xb.dtype:
        return {"shape": [list(xa.shape), list(xb.shape)], "dtype": [str(xa.dtype), str(xb.dtype)]}
    fa, fb = xa.reshape(-1), xb.reshape(-1)
    for lo in range(0, fa.size, 1 << 22):
        diff = np.flatnonzero(fa[lo:lo + (1 << 22)] != fb[lo:lo + (1 << 22)])
        if diff.size:
            return {"element": lo + int(diff[0])}
    return {"byte": _first_byte(a, b)}


def _first_byte(a: Path, b: Path, chunk: int = 1 << 20) -> int:
    """Offset of the first byte where two files differ (the shorter one's size if it is a prefix)."""
    offset = 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            ba, bb = fa.read(chunk), fb.read(chunk)
            if ba != bb:
                return offset + next((i for i, (x, y) in enumerate(zip(ba, bb)) if x != y), min(len(ba), len(bb)))
            if not ba:
                return offset
            offset += len(ba)
