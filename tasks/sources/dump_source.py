"""Wikimedia dumps as a corpus source: the newest finished full dump and the daily adds-changes
dumps of a mirror, fetched with resume and verified against the published checksums.

A *mirror* is an HTTP(S) base URL in the layout of https://dumps.wikimedia.org (or one of its
mirrors), or a local directory laid out the same way::

    <mirror>/<wiki>/<YYYYMMDD>/dumpstatus.json
    <mirror>/<wiki>/<YYYYMMDD>/<wiki>-<YYYYMMDD>-pages-articles-multistream.xml.bz2   (+ -index.txt.bz2)
    <mirror>/other/incr/<wiki>/<YYYYMMDD>/status.txt            ("done" once the day is complete)
    <mirror>/other/incr/<wiki>/<YYYYMMDD>/md5sums.txt           ("<md5>  <file name>" lines)
    <mirror>/other/incr/<wiki>/<YYYYMMDD>/maxrevid.txt
    <mirror>/other/incr/<wiki>/<YYYYMMDD>/<wiki>-<YYYYMMDD>-pages-meta-hist-incr.xml.bz2

A full dump counts once the ``dumpstatus.json`` job that lists the combined multistream dump
(:data:`FULL_JOBS`) says ``done``; its files' ``size`` and ``sha1`` (else ``md5``) are checked after
the download. Adds-changes days after the full dump are taken in date order while their
``status.txt`` says done; a day with no directory while later days have one is a counted skip
(``missing``), and the first day not done stops the list (it and later days wait for another
night). Transfers use httpx (one client, its transport retries on connection errors); an
interrupted download keeps its ``.part`` file and the next call resumes it with an HTTP range
request. Nothing here imports Prefect.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import httpx

from data_contracts.base import atomic_write, names_disk_full
from funnelrag.config import split_url_credentials
from funnelrag.errors import BadInput
from funnelrag.progress import Progress

log = logging.getLogger(__name__)

FULL_JOBS = ("articlesmultistreamdumprecombine", "articlesmultistreamdump")
"""``dumpstatus.json`` jobs that may list the combined ``pages-articles-multistream`` file (the
recombine job on wikis whose dump is written in parts, the plain job elsewhere)."""
DONE = "done"
CHUNK = 1 << 20


class DumpSourceError(BadInput):
    """The mirror cannot give a usable dump: a file is missing, truncated beyond resume, or its
    checksum differs from the published one. The message names the file and the reason; no
    build starts and ``current`` does not move."""


class ChecksumMismatch(DumpSourceError):
    """A downloaded file's digest differs from ``dumpstatus.json`` / ``md5sums.txt``."""


class DownloadFailed(httpx.TransportError):
    """A transfer from an HTTP mirror failed (connection dropped, refused, timed out, an HTTP error
    status): names the URL, and for a download the ``.part`` file and the bytes it holds, which the
    next run resumes. An ``httpx.HTTPError``, so callers that retry transfers still do; the original
    error is its ``__cause__``."""


class DumpNotReady(DumpSourceError):
    """A dump whose ``dumpstatus.json`` job is not ``done`` (still running, failed, waiting)."""


@dataclass(frozen=True)
class RemoteFile:
    """One published file: where it lies under the mirror, its size and digest."""

    relpath: str             # under the mirror root, "/"-separated
    size: int | None
    digest: str              # hex
    algorithm: str           # "sha1" | "md5"

    @property
    def name(self) -> str:
        return self.relpath.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class FullDump:
    """A finished full ``pages-articles-multistream`` dump: its date and two files."""

    wiki: str
    date: str                # YYYYMMDD
    dump: RemoteFile
    index: RemoteFile | None


@dataclass(frozen=True)
class IncrDay:
    """One finished adds-changes day: its ``pages-meta-hist-incr`` file and ``maxrevid``."""

    wiki: str
    date: str
    file: RemoteFile
    max_rev_id: int | None


@dataclass
class DayScan:
    """The adds-changes days after a full dump: ``days`` to apply (date order) and the rest counted."""

    days: list[IncrDay] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)     # dates with no directory (gaps): skipped
    waiting: list[str] = field(default_factory=list)     # the first not-done day and every later one
    reasons: dict[str, str] = field(default_factory=dict)  # date -> why it is missing / waiting

    def as_dict(self) -> dict:
        return {"days": [d.date for d in self.days], "missing": self.missing, "waiting": self.waiting,
                "reasons": self.reasons}


MIRROR_USER_ENV, MIRROR_PASSWORD_ENV = "FUNNELRAG_MIRROR_USER", "FUNNELRAG_MIRROR_PASSWORD"


def mirror_auth(environ: Mapping[str, str]) -> httpx.Auth | None:
    """The login of an HTTP mirror whose URL carries none, from the environment ``environ`` (read
    by the flow, passed here): HTTP basic auth with ``FUNNELRAG_MIRROR_USER`` and
    ``FUNNELRAG_MIRROR_PASSWORD`` when the user is set; else the netrc file ``$NETRC`` or
    ``$HOME/.netrc`` when it exists (``httpx.NetRCAuth``: the ``machine`` entry of the mirror's
    host, none for another host); else None.

    Raises
    ------
    netrc.NetrcParseError
        The netrc file is malformed (names the file and line).
    """
    user = environ.get(MIRROR_USER_ENV)
    if user:
        return httpx.BasicAuth(user, environ.get(MIRROR_PASSWORD_ENV, ""))
    netrc_file = environ.get("NETRC") or (str(Path(environ["HOME"]) / ".netrc") if environ.get("HOME") else None)
    return httpx.NetRCAuth(netrc_file) if netrc_file and Path(netrc_file).is_file() else None


class Mirror:
    """Read access to a mirror: ``https://…`` / ``http://…`` base URL or a local directory.

    Parameters
    ----------
    root : str
        Base URL (``https://dumps.wikimedia.org``) or directory path. Credentials in the URL
        (``https://user:password@host``) are taken out of it: ``self.root``, and so every message,
        plan and manifest, holds the URL without them; they log in as HTTP basic auth.
    timeout_s : float
        httpx timeout per connect / read, seconds.
    retries : int
        httpx transport retries on connection errors.
    auth : httpx.Auth, optional
        The login when the URL carries none (:func:`mirror_auth`).
    """

    def __init__(self, root: str, timeout_s: float = 60.0, retries: int = 3, auth: httpx.Auth | None = None):
        self.root = str(root)
        self.is_http = self.root.startswith(("http://", "https://"))
        if self.is_http:
            self.root, inline = split_url_credentials(self.root)
            auth = httpx.BasicAuth(*inline) if inline else auth
        self._client = (httpx.Client(transport=httpx.HTTPTransport(retries=retries), timeout=timeout_s, auth=auth,
                                     follow_redirects=True, headers={"User-Agent": "funnelrag-corpus-nightly",
                                              "Accept-Encoding": "identity"})   # byte ranges of the file itself
                        if self.is_http else None)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> "Mirror":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def where(self, relpath: str) -> str:
        """The URL or path of ``relpath`` (for messages)."""
        return f"{self.root.rstrip('/')}/{relpath}" if self.is_http else str(Path(self.root) / relpath)

    def local_path(self, relpath: str) -> Path | None:
        """The file itself for a directory mirror (read in place), None for HTTP."""
        return None if self.is_http else Path(self.root) / relpath

    def read_text(self, relpath: str) -> str | None:
        """The text of a small file, or None when it does not exist (404 / no such file)."""
        if not self.is_http:
            path = Path(self.root) / relpath
            return path.read_text(encoding="utf-8") if path.is_file() else None
        try:
            resp = self._client.get(self.where(relpath))
            if resp.status_code == 404:
                return None
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            raise DownloadFailed(f"{self.where(relpath)}: {_http_error(exc)}") from exc
        return resp.text

    def list_dates(self, reldir: str) -> list[str]:
        """``YYYYMMDD`` sub-directories of ``reldir``, sorted (an HTTP mirror's index page: its
        ``href="YYYYMMDD/"`` links)."""
        if not self.is_http:
            base = Path(self.root) / reldir
            names = [p.name for p in base.iterdir() if p.is_dir()] if base.is_dir() else []
        else:
            text = self.read_text(reldir.rstrip("/") + "/") or ""
            names = re.findall(r'href="(?:[^"]*/)?(\d{8})/?"', text)
        return sorted({n for n in names if re.fullmatch(r"\d{8}", n) and _valid_date(n)})

    def open_range(self, relpath: str, start: int) -> Iterator[tuple[int | None, Iterator[bytes]]]:
        """Bytes of ``relpath`` from ``start`` on: yields once ``(offset_served, chunks)``, where
        ``offset_served`` is ``start`` when the server honoured the range, 0 when it sent the
        whole file, and None for a directory mirror (read from ``start``)."""
        if not self.is_http:
            def chunks() -> Iterator[bytes]:
                with open(Path(self.root) / relpath, "rb") as fh:
                    fh.seek(start)
                    while block := fh.read(CHUNK):
                        yield block
            yield None, chunks()
            return
        headers = {"Range": f"bytes={start}-"} if start else {}
        with self._client.stream("GET", self.where(relpath), headers=headers) as resp:
            if resp.status_code == 404:
                raise DumpSourceError(f"{self.where(relpath)}: not found on the mirror (HTTP 404)")
            if resp.status_code == 416:   # nothing left past ``start``: the part is whole (or longer)
                yield start, iter(())
                return
            resp.raise_for_status()
            yield (start if resp.status_code == 206 else 0), resp.iter_bytes()   # as received: a cut keeps what came


def _http_error(exc: httpx.HTTPError) -> str:
    """``"<error class>: <message>"`` of an httpx error (its message alone often names nothing)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _valid_date(s: str) -> bool:
    try:
        dt.datetime.strptime(s, "%Y%m%d")
    except ValueError:
        return False
    return True


def full_dump_name(wiki: str, date: str) -> str:
    """``<wiki>-<date>-pages-articles-multistream.xml.bz2``."""
    return f"{wiki}-{date}-pages-articles-multistream.xml.bz2"


def index_name(dump_name: str) -> str:
    """The multistream index beside a dump: ``…-multistream-index.txt.bz2``."""
    return dump_name[: -len(".xml.bz2")] + "-index.txt.bz2"


def incr_name(wiki: str, date: str) -> str:
    """``<wiki>-<date>-pages-meta-hist-incr.xml.bz2``."""
    return f"{wiki}-{date}-pages-meta-hist-incr.xml.bz2"


def parse_dumpstatus(text: str, wiki: str, date: str, where: str) -> FullDump:
    """The multistream dump and index of one full-dump run from its ``dumpstatus.json``.

    Parameters
    ----------
    text : the JSON text; ``where`` names it in errors.

    Raises
    ------
    DumpNotReady
        The job listing the dump file is not ``done`` (names the job and its status).
    DumpSourceError
        Not JSON, or no job lists ``<wiki>-<date>-pages-articles-multistream.xml.bz2``, or a
        file entry has neither ``sha1`` nor ``md5``.
    """
    try:
        jobs = json.loads(text)["jobs"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DumpSourceError(f"{where}: not a dumpstatus.json with a 'jobs' object ({exc})") from None
    name = full_dump_name(wiki, date)
    for job_name in FULL_JOBS:
        job = jobs.get(job_name)
        if not isinstance(job, dict):
            continue
        status = job.get("status")
        if status != DONE:
            raise DumpNotReady(f"{where}: job {job_name} is {status!r}, not {DONE!r} (the dump is still being "
                               "written or failed); an older finished dump is used")
        if name not in (job.get("files") or {}):
            continue
        files = job["files"]
        ix = index_name(name)
        return FullDump(wiki, date, _remote(f"{wiki}/{date}/{name}", files[name], where),
                        _remote(f"{wiki}/{date}/{ix}", files[ix], where) if ix in files else None)
    raise DumpSourceError(f"{where}: no job among {', '.join(FULL_JOBS)} lists {name}")


def _remote(relpath: str, entry: dict, where: str) -> RemoteFile:
    for algorithm in ("sha1", "md5"):
        if entry.get(algorithm):
            size = entry.get("size")
            return RemoteFile(relpath, int(size) if size is not None else None, str(entry[algorithm]).lower(), algorithm)
    raise DumpSourceError(f"{where}: {relpath.rsplit('/', 1)[-1]} has neither sha1 nor md5")


def latest_full_dump(mirror: Mirror, wiki: str, after: str | None = None,
                     unusable: dict[str, str] | None = None) -> tuple[FullDump | None, dict[str, str]]:
    """The newest full dump of ``wiki`` whose job is done (newer than ``after`` when given).

    Returns ``(dump or None, {date: why it was passed over})``: dates whose ``dumpstatus.json``
    is missing, unreadable or not done are passed over (counted), the next older date is tried;
    so are the dates of ``unusable`` (``{date: reason}``: a dump said done whose files are missing
    or fail their checksum), with their reason.
    """
    passed: dict[str, str] = {}
    for date in reversed(mirror.list_dates(wiki)):
        if after is not None and date <= after:
            break
        if unusable and date in unusable:
            passed[date] = unusable[date]
            continue
        where = mirror.where(f"{wiki}/{date}/dumpstatus.json")
        text = mirror.read_text(f"{wiki}/{date}/dumpstatus.json")
        if text is None:
            passed[date] = f"{where}: no dumpstatus.json"
            continue
        try:
            return parse_dumpstatus(text, wiki, date, where), passed
        except DumpSourceError as exc:
            passed[date] = str(exc)
            log.warning("full dump %s of %s passed over: %s", date, wiki, exc)
    return None, passed


def scan_days(mirror: Mirror, wiki: str, after: str) -> DayScan:
    """The adds-changes days of ``wiki`` dated after ``after`` (YYYYMMDD), in date order.

    A day is taken when its ``status.txt`` says done and ``md5sums.txt`` lists its
    ``pages-meta-hist-incr`` file. A date with no directory between ``after`` and the newest
    listed day is *missing* (counted, skipped: its changes arrive with the next full dump), and so
    is a day said done whose ``md5sums.txt`` is absent or unusable (no line ``<32 hex digits>
    <the day's file name>``: other names such as ``../…``, unparsable lines): its file cannot be
    checked, and waiting for it would hold every later day back for ever. The first day not done
    (no ``status.txt``, another status) ends the scan: it and every later day are *waiting* for a
    later night.
    """
    reldir = f"other/incr/{wiki}"
    listed = [d for d in mirror.list_dates(reldir) if d > after]
    scan = DayScan()
    if not listed:
        return scan
    present = set(listed)
    day = _next_day(after)
    while day <= listed[-1]:
        if day not in present:
            scan.missing.append(day)
            scan.reasons[day] = f"{mirror.where(f'{reldir}/{day}/')}: no such adds-changes day on the mirror"
            day = _next_day(day)
            continue
        problem, item = _read_day(mirror, wiki, day)
        if problem and problem.startswith(_UNUSABLE):
            scan.missing.append(day)
            scan.reasons[day] = problem[len(_UNUSABLE):]
            log.warning("adds-changes day %s skipped as missing: %s", day, scan.reasons[day])
            day = _next_day(day)
            continue
        if problem:
            waiting = [d for d in listed if d >= day]
            scan.waiting.extend(waiting)
            scan.reasons[day] = problem
            break
        scan.days.append(item)
        day = _next_day(day)
    return scan


def _next_day(date: str) -> str:
    return (dt.datetime.strptime(date, "%Y%m%d") + dt.timedelta(days=1)).strftime("%Y%m%d")


_UNUSABLE = "unusable: "   # a _read_day problem that makes the day missing, not waiting
_MD5 = re.compile(r"[0-9a-f]{32}")


def _read_day(mirror: Mirror, wiki: str, day: str) -> tuple[str | None, IncrDay | None]:
    base = f"other/incr/{wiki}/{day}"
    status = mirror.read_text(f"{base}/status.txt")
    if status is None:
        return f"{mirror.where(base + '/status.txt')}: missing (the day is not done)", None
    if status.strip().split(":")[0] != DONE:
        return f"{mirror.where(base + '/status.txt')}: says {status.strip()!r}, not {DONE!r}", None
    name = incr_name(wiki, day)
    sums = mirror.read_text(f"{base}/md5sums.txt")
    if sums is None:
        return f"{_UNUSABLE}{mirror.where(base + '/md5sums.txt')}: missing although the day is done", None
    md5 = next((parts[0].lower() for parts in map(str.split, sums.splitlines())
                if len(parts) == 2 and parts[1].lstrip("*") == name and _MD5.fullmatch(parts[0].lower())), None)
    if md5 is None:
        return (f"{_UNUSABLE}{mirror.where(base + '/md5sums.txt')}: unusable, no line '<md5>  {name}' "
                f"(lines: {len(sums.splitlines())})"), None
    maxrev = (mirror.read_text(f"{base}/maxrevid.txt") or "").strip()
    return None, IncrDay(wiki, day, RemoteFile(f"{base}/{name}", None, md5, "md5"),
                         int(maxrev) if maxrev.isdigit() else None)


# ---------------------------------------------------------------------------------- downloads
def fetch(mirror: Mirror, remote: RemoteFile, downloads: Path, progress_desc: str | None = None) -> Path:
    """A verified local copy of ``remote``.

    A directory mirror's file is verified in place and returned (no copy). From an HTTP mirror the
    file goes to ``downloads/<relpath>.part``, resumed with a range request when a part is there,
    then hashed, checked against the published size and digest and renamed into place (atomic). A
    verified file is remembered by (path, size, mtime) in ``downloads/verified.json`` and not
    hashed again.

    Raises
    ------
    ChecksumMismatch
        The digest (or size) differs; names the file, both digests and the URL. The bad part is
        removed so the next run downloads it afresh.
    DumpSourceError
        Not found on the mirror.
    DownloadFailed
        The transfer failed (an ``httpx.HTTPError`` naming the URL, the ``.part`` file and the bytes
        it holds; the ``.part`` stays for the next run to resume).
    """
    downloads = Path(downloads)
    local = mirror.local_path(remote.relpath)
    if local is not None:
        if not local.is_file():
            raise DumpSourceError(f"{local}: not found on the mirror")
        _verify(local, remote, downloads, mirror.where(remote.relpath))
        return local
    target = downloads / remote.relpath
    if target.is_file():
        _verify(target, remote, downloads, mirror.where(remote.relpath))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    if remote.size is not None and have > remote.size:
        part.unlink()
        have = 0
    if have:
        log.info("resuming %s at byte %d of %s", remote.name, have, remote.size)
    with Progress(progress_desc or f"download {remote.name}", total=remote.size, unit="bytes") as bar:
        bar.update(have)
        try:
            for served, chunks in mirror.open_range(remote.relpath, have):
                mode = "ab" if served == have else "wb"
                if served == 0 and have:
                    log.info("%s: the server ignored the range request; downloading from the start", remote.name)
                with names_disk_full(part), open(part, mode) as out:
                    for block in chunks:
                        out.write(block)
                        bar.update(len(block))
        except httpx.HTTPError as exc:
            kept = part.stat().st_size if part.is_file() else 0
            raise DownloadFailed(f"download of {mirror.where(remote.relpath)} into {part} failed ({_http_error(exc)}); "
                                 f"{kept:,} of {remote.size if remote.size is not None else '?'} bytes kept there, "
                                 "the next run resumes it") from exc
    _verify(part, remote, downloads, mirror.where(remote.relpath), remove_bad=True)
    os.replace(part, target)
    _stamp(downloads, target, remote)
    return target


def _hash(path: Path, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK * 4):
            h.update(block)
    return h.hexdigest()


def _stamps(downloads: Path) -> dict[str, str]:
    try:
        return json.loads((downloads / "verified.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _stamp_key(path: Path) -> str:
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _stamp(downloads: Path, path: Path, remote: RemoteFile) -> None:
    stamps = _stamps(downloads)
    stamps[_stamp_key(path)] = f"{remote.algorithm}:{remote.digest}"
    downloads.mkdir(parents=True, exist_ok=True)
    atomic_write(downloads / "verified.json", lambda p: p.write_text(json.dumps(stamps, indent=1, sort_keys=True)))


def _verify(path: Path, remote: RemoteFile, downloads: Path, where: str, remove_bad: bool = False) -> None:
    if _stamps(downloads).get(_stamp_key(path)) == f"{remote.algorithm}:{remote.digest}":
        return
    size = path.stat().st_size
    problem = None
    if remote.size is not None and size != remote.size:
        problem = f"size {size:,} bytes, expected {remote.size:,} (truncated or changed on the mirror)"
    else:
        found = _hash(path, remote.algorithm)
        if found != remote.digest:
            problem = f"{remote.algorithm} {found}, expected {remote.digest}"
    if problem:
        if remove_bad:
            path.unlink(missing_ok=True)
        raise ChecksumMismatch(f"checksum mismatch for {remote.name} ({where}): {problem}; the file was "
                               f"{'removed, the next run downloads it again' if remove_bad else 'left as it is'}")
    _stamp(downloads, path, remote)


def prune_downloads(downloads: Path, wiki: str, keep_dumps: int, in_use: list[str]) -> list[Path]:
    """Retention: keep the newest ``keep_dumps`` full-dump directories of ``wiki`` under
    ``downloads/<wiki>/`` (and every date in ``in_use``), and the adds-changes days not older than
    the oldest full dump kept; remove the rest. Returns the removed directories."""
    removed: list[Path] = []
    base = Path(downloads) / wiki
    dates = sorted(p.name for p in base.iterdir() if p.is_dir() and re.fullmatch(r"\d{8}", p.name)) if base.is_dir() else []
    keep = set(dates[-keep_dumps:] if keep_dumps > 0 else []) | set(in_use)
    for date in dates:
        if date not in keep:
            shutil.rmtree(base / date, ignore_errors=True)
            removed.append(base / date)
    oldest = min(keep) if keep else None
    incr = Path(downloads) / "other" / "incr" / wiki
    if oldest and incr.is_dir():
        for p in sorted(incr.iterdir()):
            if p.is_dir() and p.name < oldest:
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    for p in removed:
        log.info("retention: removed %s", p)
    return removed


def describe(obj: FullDump | IncrDay) -> dict:
    """JSON-ready description (for the manifest and the run summary)."""
    return asdict(obj)
