"""Artifact contracts: a versioned pyarrow schema per artifact, checked on every write and read.

Every table that crosses a stage boundary is named here with its relative file name, its
schema and a schema version (Kedro's catalog, pyserini's typed index names). A violation raises
:class:`ContractViolation` naming the artifact, the column and the first offending rows.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

_META_NAME = b"funnelrag.contract"
_META_VERSION = b"funnelrag.schema_version"
_MAX_ROWS_IN_ERROR = 5
_ROW_GROUP_SIZE = 64_000  # rows per Parquet row group, as in Contract.write


class ContractViolation(ValueError):
    """A table does not satisfy its artifact contract.

    Attributes
    ----------
    artifact : str
        Contract name, e.g. ``"clusters"``.
    column : str or None
        Offending column, when one can be named.
    rows : list of int
        Up to five offending row indices (0-based), possibly empty.
    """

    def __init__(self, artifact: str, column: str | None, rows: Sequence[int], reason: str):
        self.artifact, self.column, self.rows, self.reason = artifact, column, list(rows), reason
        where = f" column {column!r}" if column else ""
        at = f" rows {self.rows}" if self.rows else ""
        super().__init__(f"artifact {artifact!r}{where}{at}: {reason}")


@dataclass(frozen=True)
class Contract:
    """One artifact: its file name, schema, schema version and row-level checks.

    Parameters
    ----------
    name : str
        Stable artifact name used in manifests and errors.
    filename : str
        Relative file name inside a version directory; says what it holds
        (``clusters.bm25.parquet`` style).
    schema : pa.Schema
        Exact column names, types and nullability. Extra or missing columns are violations.
    version : int
        Bumped on any schema change; a reader refuses files written under another version.
    unique : tuple of str
        Columns whose combined values must be unique (primary key), checked on write.
    checks : tuple of callables
        ``check(table) -> (column, rows, reason) | None`` extra invariants run on write.
    free_text : tuple of str
        Columns of free text (article and passage bodies) that no key or check reads:
        :meth:`verify` checks them from the file's footer (type, null counts) without decoding
        them. Raises ``ValueError`` when one is not in ``schema`` or is a ``unique`` column.
    """

    name: str
    filename: str
    schema: pa.Schema
    version: int = 1
    unique: tuple[str, ...] = ()
    checks: tuple[Callable[[pa.Table], tuple[str, list[int], str] | None], ...] = field(default=())
    free_text: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = [c for c in self.free_text if c not in self.schema.names]
        if unknown or set(self.free_text) & set(self.unique):
            raise ValueError(f"contract {self.name!r}: free_text {list(self.free_text)} must name schema columns "
                             f"outside the unique key {list(self.unique)}")

    # ------------------------------------------------------------------ validation
    def validate(self, table: pa.Table, *, unique: bool = True) -> pa.Table:
        """Return ``table`` cast to the contract schema, or raise :class:`ContractViolation`.

        Column order is normalised to the schema's; ``large_string`` is cast to ``string``
        (polars ``to_arrow()`` yields ``large_string``). Nulls in non-nullable fields,
        missing or extra columns, failed casts, duplicate keys and failed checks all raise.
        ``unique=False`` leaves out the hash-based duplicate-key check, for a caller that checks
        strictly increasing keys instead (:class:`ContractWriter` with ``sorted_keys``), which
        implies it.
        """
        names = set(table.column_names)
        expected = [f.name for f in self.schema]
        missing = [c for c in expected if c not in names]
        if missing:
            raise ContractViolation(self.name, missing[0], [], f"missing column(s) {missing}")
        extra = [c for c in table.column_names if c not in set(expected)]
        if extra:
            raise ContractViolation(self.name, extra[0], [], f"unexpected column(s) {extra}")
        table = table.select(expected)
        for f in self.schema:
            col = table.column(f.name)
            if not f.nullable and col.null_count:
                rows = _first_true(pc.is_null(col))
                raise ContractViolation(self.name, f.name, rows, f"{col.null_count} null value(s) in non-nullable field")
        try:
            table = table.cast(self.schema.remove_metadata())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            bad = _first_bad_cast(table, self.schema)
            raise ContractViolation(self.name, bad, [], f"cannot cast to contract type: {exc}") from exc
        if unique and self.unique and table.num_rows:
            _check_unique(self.name, table, self.unique)
        for check in self.checks:
            res = check(table)
            if res is not None:
                col, rows, reason = res
                raise ContractViolation(self.name, col, rows[:_MAX_ROWS_IN_ERROR], reason)
        return table.replace_schema_metadata(self.metadata())

    def metadata(self) -> dict[bytes, bytes]:
        return {_META_NAME: self.name.encode(), _META_VERSION: str(self.version).encode()}

    # ------------------------------------------------------------------ I/O
    def write(self, table: pa.Table, directory: Path) -> Path:
        """Validate and atomically write ``table`` to ``directory / filename`` (Parquet, zstd).

        Written to a temporary file in the same directory, fsynced and renamed, so a reader
        never sees a half-written file. Output bytes depend only on the table content.

        Returns
        -------
        Path
            The final path.
        """
        table = self.validate(table)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / self.filename

        def _write(tmp: Path) -> None:
            pq.write_table(table, tmp, compression="zstd", row_group_size=64_000, write_statistics=True)

        atomic_write(final, _write)
        return final

    def read(self, directory_or_file: Path, columns: Sequence[str] | None = None) -> pa.Table:
        """Read and validate this artifact.

        Raises
        ------
        FileNotFoundError
            The file does not exist (message names the artifact and path).
        ContractViolation
            Written under another contract or schema version, or the content violates it.
        """
        path = self._checked_path(directory_or_file)
        # memory-mapped: the compressed pages are decoded from the page cache in place, not first copied
        # into fresh buffers (a 1M-passage table: ~0.1 instead of ~0.7 system CPU s, same user time)
        table = pq.read_table(path, columns=list(columns) if columns else None, memory_map=True)
        if columns:
            return table
        return self.validate(table)

    def verify(self, directory_or_file: Path) -> pa.Table:
        """Check a written artifact as :meth:`read` does, without decoding its ``free_text`` columns.

        The file's own schema (its footer) must equal the contract's column for column (names,
        order, types, nullability); every other column is read and validated as :meth:`read`
        does (nulls, unique keys over the whole file, checks). A ``free_text`` column's nulls are
        settled by the footer: a non-nullable column is stored as a Parquet *required* column,
        which has no place for a null (pyarrow refuses to write one there). The bodies of free
        text are not read: what a publish step re-checks costs the ids, not the corpus text
        (measured at 200K pages: 1.5 instead of ~6 CPU s for a whole corpus version,
        :func:`tasks.corpus.stages.validate_corpus`).

        Returns the table of the columns other than ``free_text``, in schema order.

        Raises
        ------
        FileNotFoundError
            The file does not exist.
        ContractViolation
            Written under another contract or schema version, another schema, or the content
            violates the contract (naming the column and rows where it can).
        """
        path = self._path(directory_or_file)
        parquet = pq.ParquetFile(path)   # the footer, read once for the contract's name, version and schema
        self._check_metadata(path, parquet.schema_arrow.metadata)
        found = parquet.schema_arrow.remove_metadata()
        expected = self.schema.remove_metadata()
        if found.names != expected.names:
            raise ContractViolation(self.name, None, [], f"{path} has columns {found.names}, expected {expected.names}")
        for got, want in zip(found, expected):
            if got.type != want.type or got.nullable != want.nullable:
                raise ContractViolation(self.name, want.name, [], f"{path} stores {got.type} (nullable={got.nullable}), "
                                        f"expected {want.type} (nullable={want.nullable})")
        kept = [f for f in self.schema if f.name not in self.free_text]
        part = Contract(self.name, self.filename, pa.schema(kept, metadata=self.schema.metadata), self.version,
                        self.unique, self.checks)
        return part.validate(parquet.read(columns=[f.name for f in kept]))

    def _checked_path(self, directory_or_file: Path) -> Path:
        """The artifact's file, after its footer's contract name and schema version are checked."""
        path = self._path(directory_or_file)
        self._check_metadata(path, pq.read_schema(path).metadata)
        return path

    def _path(self, directory_or_file: Path) -> Path:
        """The artifact's file in ``directory_or_file`` (or that file); ``FileNotFoundError`` if absent."""
        path = Path(directory_or_file)
        if path.is_dir():
            path = path / self.filename
        if not path.exists():
            raise FileNotFoundError(f"artifact {self.name!r}: no file at {path}")
        return path

    def _check_metadata(self, path: Path, metadata: dict[bytes, bytes] | None) -> None:
        """Raise :class:`ContractViolation` unless a file's schema metadata names this contract and version."""
        meta = metadata or {}
        if meta.get(_META_NAME) != self.name.encode():
            raise ContractViolation(self.name, None, [], f"{path} was not written under this contract (found {meta.get(_META_NAME)!r})")
        found = meta.get(_META_VERSION, b"?").decode()
        if found != str(self.version):
            raise ContractViolation(self.name, None, [], f"{path} has schema version {found}, expected {self.version}")

    def open_writer(self, directory: Path, *, sorted_keys: bool = False,
                    row_group_size: int | None = _ROW_GROUP_SIZE) -> "ContractWriter":
        """Open a streaming writer of this artifact in ``directory`` (see :class:`ContractWriter`).

        Use as a context manager: the file appears atomically at ``directory / filename`` when
        the block exits normally and is discarded when it raises. With the default
        ``row_group_size`` the bytes equal those of :meth:`write` on the concatenated table.
        """
        return ContractWriter(self, Path(directory), sorted_keys=sorted_keys, row_group_size=row_group_size)


class ContractWriter:
    """Streaming, validating, atomic Parquet writer of one artifact.

    Each table passed to :meth:`write` is validated with :meth:`Contract.validate` (types,
    nulls, unique keys within the table, checks), buffered, and written in row groups of
    ``row_group_size`` rows; the bytes do not depend on the batch sizes, and with the default
    64,000 rows they equal :meth:`Contract.write` of all rows at once. Memory holds at most one
    row group plus the incoming table. With ``row_group_size=None`` every table is written at
    once as its own row group (the caller sizes row groups, e.g. by bytes for long texts).

    Parameters
    ----------
    contract : Contract
        The artifact; ``contract.checks`` run per table, so only row-local checks are sound.
    directory : Path
        Target directory (created if missing).
    sorted_keys : bool
        If True, rows must arrive in strictly increasing order of ``contract.unique`` (checked
        within and across tables), which makes the keys unique over the whole file. If False,
        uniqueness is only checked within each table.
    row_group_size : int or None
        Rows per Parquet row group; None: one row group per :meth:`write` call.

    Raises
    ------
    ContractViolation
        From :meth:`write`, naming the artifact, column and rows; the temporary file is removed
        when the writer is used as a context manager.
    """

    def __init__(self, contract: Contract, directory: Path, *, sorted_keys: bool = False,
                 row_group_size: int | None = _ROW_GROUP_SIZE):
        if sorted_keys and not contract.unique:
            raise ValueError(f"artifact {contract.name!r} has no unique key to keep sorted")
        if row_group_size is not None and row_group_size < 1:
            raise ValueError(f"row_group_size must be >= 1, got {row_group_size}")
        self.contract, self.sorted_keys, self.row_group_size = contract, sorted_keys, row_group_size
        self.final = Path(directory) / contract.filename
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = _readable_temp(self.final)
        self._schema = contract.schema.remove_metadata().with_metadata(contract.metadata())
        self._writer: pq.ParquetWriter | None = None
        self._pending: list[pa.Table] = []
        self._n_pending = 0
        self._last_key: tuple | None = None
        self.rows_written = 0
        self._closed = False

    def write(self, table: pa.Table | pa.RecordBatch | dict) -> None:
        """Validate ``table`` (a table, record batch or ``{column: values}``) and append it."""
        if self._closed:
            raise ValueError(f"artifact {self.contract.name!r}: writer already closed")
        if isinstance(table, dict):
            table = pa.table(table)
        elif isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if table.num_rows == 0:
            return
        table = self.contract.validate(table, unique=not self.sorted_keys)
        if self.sorted_keys:
            self._check_order(table)   # strictly increasing: implies unique keys
        self._pending.append(table)
        self._n_pending += table.num_rows
        self.rows_written += table.num_rows
        try:
            if self.row_group_size is None:
                self._flush(table.num_rows)
            while self.row_group_size is not None and self._n_pending >= self.row_group_size:
                self._flush(self.row_group_size)
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(exc, self.final) from exc
            raise

    def commit(self) -> Path:
        """Write the last row group, fsync and rename into place; returns the final path."""
        if self._closed:
            raise ValueError(f"artifact {self.contract.name!r}: writer already closed")
        try:
            if self._n_pending:
                self._flush(self._n_pending)
            if self._writer is None:
                pq.write_table(self._schema.empty_table(), self._tmp, compression="zstd",
                               row_group_size=self.row_group_size or _ROW_GROUP_SIZE, write_statistics=True)
            else:
                self._writer.close()
            replace_file(self._tmp, self.final)
        except BaseException as exc:
            self.abort()
            if is_disk_full(exc):
                raise disk_full_error(exc, self.final) from exc
            raise
        self._closed = True
        return self.final

    def abort(self) -> None:
        """Discard everything written; the final path is left untouched."""
        self._closed = True
        self._pending.clear()
        if self._writer is not None:
            try:
                self._writer.close()
            except Exception:  # noqa: BLE001 - the file is being discarded anyway
                pass
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ContractWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()

    def _flush(self, n_rows: int) -> None:
        merged = pa.concat_tables(self._pending).combine_chunks()
        head, rest = merged.slice(0, n_rows), merged.slice(n_rows)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._tmp, self._schema, compression="zstd", write_statistics=True)
        self._writer.write_table(head, row_group_size=max(n_rows, 1))
        self._pending = [rest] if rest.num_rows else []
        self._n_pending = rest.num_rows

    def _check_order(self, table: pa.Table) -> None:
        """Keys strictly increasing within ``table`` and after the previous table's last key.

        One vectorised comparison of each row with the next (O(rows); keys are non-null after
        :meth:`Contract.validate`); strings compare by UTF-8 bytes, i.e. by code point, as
        Arrow's sort and Python do.

        Raises
        ------
        ContractViolation
            Naming the first row whose key is equal to (``duplicate key``) or smaller than
            (``not in increasing order``) the row before it.
        """
        keys = self.contract.unique
        n = table.num_rows
        if n > 1:
            before = [table.column(k).slice(0, n - 1) for k in keys]
            after = [table.column(k).slice(1) for k in keys]
            greater = pc.greater(after[-1], before[-1])
            for b, a in zip(reversed(before[:-1]), reversed(after[:-1])):
                greater = pc.or_(pc.greater(a, b), pc.and_(pc.equal(a, b), greater))
            if not pc.all(greater).as_py():
                i = _first_true(pc.invert(greater))[0]
                row = tuple(table.column(k)[i + 1].as_py() for k in keys)
                if row == tuple(table.column(k)[i].as_py() for k in keys):
                    reason = f"duplicate key {row!r}: rows not in strictly increasing order of {keys}"
                else:
                    reason = f"rows not in increasing order of {keys}: {row!r} after a larger key"
                raise ContractViolation(self.contract.name, ",".join(keys), [i + 1], reason)
        first = tuple(table.column(k)[0].as_py() for k in keys)
        if self._last_key is not None and first <= self._last_key:
            raise ContractViolation(self.contract.name, ",".join(keys), [0],
                                    f"key {first!r} does not follow the previous table's last key {self._last_key!r}")
        self._last_key = tuple(table.column(k)[n - 1].as_py() for k in keys)


# ---------------------------------------------------------------------- helpers
def binary_labels(table: pa.Table):
    """Contract check: every ``label`` is 0 or 1 (``(column, rows, reason)`` of the first bad rows, else None)."""
    rows = _first_true(pc.invert(pc.is_in(table["label"], value_set=pa.array([0, 1], pa.int8()))))
    return ("label", rows, "label must be 0 or 1") if rows else None


def atomic_write(final: Path, writer: Callable[[Path], None], durable: bool = True) -> None:
    """Call ``writer(tmp_path)`` then rename ``tmp_path`` onto ``final`` atomically.

    The temporary file lives in ``final``'s directory (same file system,
    :func:`temp_file_beside`), is fsynced before the rename and the directory after it
    (:func:`replace_file`), and is removed if anything raises, so ``final`` is either the old or
    the new complete file. ``durable=False`` skips the fsyncs (scratch files that a crash
    discards anyway).

    Raises
    ------
    OSError
        A disk-full or quota error (same type and errno) names ``final``; others pass unchanged.
    """
    with names_disk_full(final), temp_file_beside(final) as tmp:   # ENOSPC / EDQUOT: name the file being written
        writer(tmp)
        replace_file(tmp, final, durable)


@contextlib.contextmanager
def names_disk_full(path: Path) -> Iterator[None]:
    """Inside the block, a disk-full or quota ``OSError`` (pyarrow's ``Error writing bytes to
    file`` names no file) is raised again naming ``path`` and what to do (:func:`disk_full_error`:
    same type and errno), unless an inner block named its file already; every other error passes
    unchanged. For writers of a file or of a directory of files (a cache entry, a shard)."""
    try:
        yield
    except OSError as exc:
        if is_disk_full(exc) and _WHILE_WRITING not in (exc.strerror or ""):
            raise disk_full_error(exc, Path(path)) from exc
        raise


@contextlib.contextmanager
def temp_file_beside(final: Path) -> Iterator[Path]:
    """An empty temporary file (mode 0644) in ``final``'s directory, created with the directory;
    removed when the block ends unless it was renamed away (:func:`replace_file`). For writers
    that pick the final name only after writing (content-addressed files)."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _readable_temp(final)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def replace_file(tmp: Path, final: Path, durable: bool = True) -> None:
    """Rename the complete file ``tmp`` onto ``final`` (same directory): with ``durable``, fsync
    ``tmp`` before the rename and the directory after it, so after a crash ``final`` holds the
    old or the new bytes, never an empty or partial file, and the rename itself survives."""
    if durable:
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
    os.replace(tmp, final)
    if durable:
        fsync_directory(Path(final).parent)


def link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` at ``dst`` (the same bytes, no copy), or copy it (with its times) where
    a link cannot be made (another file system); ``dst``'s directory is created."""
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def fsync_directory(directory: Path) -> None:
    """fsync a directory (its entries: a rename into it is on disk after this)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_disk_full(exc: BaseException) -> bool:
    """True for an ``OSError`` saying the file system or the user's quota is full."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_error(exc: OSError, path: Path) -> OSError:
    """``exc`` (ENOSPC/EDQUOT) again as the same type and errno, naming ``path`` and what to do."""
    reason = exc.strerror or os.strerror(exc.errno)
    hint = ("the disk (or your quota) is full: free space on that file system, or point the "
            "workspace home at a larger one; the previous file, if any, is unchanged")
    try:
        return type(exc)(exc.errno, f"{reason}{_WHILE_WRITING}{path}: {hint}", str(path))
    except TypeError:   # a subclass with another constructor
        return OSError(exc.errno, f"{reason}{_WHILE_WRITING}{path}: {hint}", str(path))


_WHILE_WRITING = " while writing "   # in the message of a disk-full error that names its file


def _readable_temp(final: Path) -> Path:
    """An empty temporary file beside ``final`` named by :func:`temp_name` (owner pid, then
    ``final``'s name and a random suffix), mode 0644: mkstemp makes 0600, and published artifacts
    must be readable by every user of a shared home (whole and streamed writes alike)."""
    fd, tmp_name = tempfile.mkstemp(prefix=temp_name(f"{final.name}."), dir=final.parent)
    os.close(fd)
    os.chmod(tmp_name, 0o644)
    return Path(tmp_name)


# ---------------------------------------------------------------------- temp names
TEMP_KINDS = ("tmp", "old")
"""``tmp``: work in progress of its owner; ``old``: the directory :func:`atomic_directory` moved aside."""
_TEMP_NAME = re.compile(r"^\.(tmp|old)-(\d+)-(.+)$")


@dataclass(frozen=True)
class TempName:
    """What a temp name (:func:`temp_name`) says: its kind, its owner's pid, and its label
    (the final name it will take, for :func:`atomic_directory`'s pair)."""

    kind: str
    pid: int
    label: str


def temp_name(label: str, pid: int | None = None, kind: str = "tmp") -> str:
    """The one temp-name scheme of the stores: ``.<kind>-<pid>-<label>``, the owner's pid
    (default: this process) in a fixed position, so a sweep (:func:`funnelrag.reaper.sweep_stale_temp_dirs`)
    can tell a live writer's work from a killed one's; parsed back by :func:`parse_temp_name`.

    Raises
    ------
    ValueError
        An unknown ``kind`` (not in :data:`TEMP_KINDS`) or an empty ``label``.
    """
    if kind not in TEMP_KINDS or not label:
        raise ValueError(f"temp name: kind {kind!r} must be one of {TEMP_KINDS} and the label non-empty ({label!r})")
    return f".{kind}-{os.getpid() if pid is None else pid}-{label}"


def parse_temp_name(name: str) -> TempName | None:
    """The kind, owner pid and label of a :func:`temp_name`; ``None`` for any other name."""
    m = _TEMP_NAME.match(name)
    return TempName(m.group(1), int(m.group(2)), m.group(3)) if m else None


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Build a directory under a temporary sibling name (``.tmp-<pid>-<name>``, :func:`temp_name`)
    and move it onto ``final`` on success.

    Yields the temporary directory. If the block raises, it is removed and ``final`` is left
    as it was. An existing ``final`` is moved aside (``.old-<pid>-<name>``), replaced, then deleted, so a
    reader sees the old or the new complete directory (or, for an instant, none), never a partial one.
    A disk-full error of the block that names no file names ``final`` (:func:`names_disk_full`).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / temp_name(final.name)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with names_disk_full(final):
            yield tmp
        old = final.parent / temp_name(final.name, kind="old")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def move_into_place(tmp: Path, final: Path) -> None:
    """Rename the complete directory ``tmp`` onto ``final`` (a cache entry that every writer of
    the same key fills with the same bytes): when a concurrent writer kept ``final`` first, its
    entry stays and ``tmp`` is removed. Any other failure removes ``tmp`` and raises.

    Raises
    ------
    OSError
        The rename failed for another reason (``final`` is a file, the disk, permissions), naming
        both paths.
    """
    try:
        os.replace(tmp, final)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST) and Path(final).is_dir():
            return   # kept by a concurrent writer of the same entry
        raise OSError(exc.errno, f"cannot move the finished {tmp} onto {final}: {exc.strerror}", str(final)) from exc


def atomic_write_bytes(final: Path, data: bytes) -> None:
    """Atomically replace ``final`` with ``data`` (see :func:`atomic_write`)."""
    atomic_write(Path(final), lambda p: p.write_bytes(data))


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes, read in ``chunk``-byte blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _first_true(mask: pa.ChunkedArray | pa.Array) -> list[int]:
    idx = pc.indices_nonzero(pc.fill_null(mask, False)) if hasattr(pc, "indices_nonzero") else None
    if idx is None:
        return [i for i, v in enumerate(mask.to_pylist()) if v][:_MAX_ROWS_IN_ERROR]
    return idx.slice(0, _MAX_ROWS_IN_ERROR).to_pylist()


def _first_bad_cast(table: pa.Table, schema: pa.Schema) -> str | None:
    for f in schema:
        try:
            table.column(f.name).cast(f.type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return f.name
    return None


def _int_key(table: pa.Table, keys: tuple[str, ...]) -> np.ndarray | None:
    """``(n,)`` integer composite of one integer key column of at most 32 bits, or of two integer
    key columns whose values each span less than ``2**32`` (``links``' page ids): the second column's
    offset from its minimum in the low 32 bits, the first's above, so the composite orders as the
    pair does. ``None`` for other keys."""
    types = [table.schema.field(k).type for k in keys]
    if len(keys) > 2 or not all(pa.types.is_integer(t) for t in types):
        return None
    if len(keys) == 1:
        return table.column(keys[0]).to_numpy().astype(np.int64) if types[0].bit_width <= 32 else None
    a, b = (table.column(k).to_numpy().astype(np.int64) for k in keys)
    if a.size == 0:
        return a
    lows = (int(a.min()), int(b.min()))
    if max(int(a.max()) - lows[0], int(b.max()) - lows[1]) >= 1 << 32:
        return None
    return ((a - lows[0]).astype(np.uint64) << np.uint64(32)) | (b - lows[1]).astype(np.uint64)


def _strictly_increasing(col: pa.ChunkedArray) -> bool:
    """Whether every value of ``col`` (no nulls) is greater than the one before it (byte order for
    strings), hence all distinct: one vectorised comparison of the column with itself shifted."""
    n = len(col)
    if n < 2 or col.null_count:
        return n < 2
    return bool(pc.all(pc.greater(col.slice(1), col.slice(0, n - 1))).as_py())


def _int_pair(table: pa.Table, keys: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """The two int64 columns of a pair of integer key columns whose values span ``2**32`` or
    more (``doc_id`` pairs of title-derived ids), else ``None``."""
    types = [table.schema.field(k).type for k in keys]
    if len(keys) != 2 or not all(pa.types.is_integer(t) for t in types):
        return None
    a, b = (table.column(k).to_numpy().astype(np.int64) for k in keys)
    return a, b


def _check_unique(name: str, table: pa.Table, keys: tuple[str, ...]) -> None:
    key = _int_key(table, keys)
    pair = _int_pair(table, keys) if key is None else None
    if key is not None or pair is not None:   # integer ids, as in the corpus tables: sorted in the common case, O(n)
        if key is not None:
            if key.size < 2 or bool(np.all(key[1:] > key[:-1])):
                return
            ordered = np.sort(key)   # values only: the rows are found below, on a failure
            if not bool(np.any(ordered[1:] == ordered[:-1])):
                return
            order = np.argsort(key, kind="stable")
            repeat = np.flatnonzero(key[order][1:] == key[order][:-1])
        else:
            a, b = pair
            if a.size < 2 or bool(np.all((a[1:] > a[:-1]) | ((a[1:] == a[:-1]) & (b[1:] > b[:-1])))):
                return
            order = np.lexsort((b, a))
            sa, sb = a[order], b[order]
            repeat = np.flatnonzero((sa[1:] == sa[:-1]) & (sb[1:] == sb[:-1]))
        if repeat.size:
            rows = np.unique(order[np.concatenate([repeat, repeat + 1])])[:_MAX_ROWS_IN_ERROR].tolist()
            first = {k: table.column(k)[int(order[repeat[0]])].as_py() for k in keys}
            raise ContractViolation(name, ",".join(keys), rows,
                                    f"{repeat.size} duplicate key value(s), e.g. {first if len(keys) > 1 else first[keys[0]]!r}")
        return
    if len(keys) == 1:
        col = table.column(keys[0])
        if _strictly_increasing(col):   # string ids written in order (passages, units): O(n), no hash table
            return
        n_unique = pc.count_distinct(col).as_py()
        if n_unique != table.num_rows:
            counts = pc.value_counts(col)
            dup_vals = [d["values"] for d in counts.to_pylist() if d["counts"] > 1][:1]
            rows = _first_true(pc.is_in(col, value_set=pa.array(dup_vals, type=col.type)))
            raise ContractViolation(name, keys[0], rows, f"{table.num_rows - n_unique} duplicate key value(s), e.g. {dup_vals[0]!r}")
        return
    grouped = table.group_by(list(keys)).aggregate([])
    if grouped.num_rows != table.num_rows:
        raise ContractViolation(name, ",".join(keys), [], f"{table.num_rows - grouped.num_rows} duplicate key(s) over {keys}")
