"""The merged dump a full run would have written: a multistream dump with adds-changes revisions
applied, written out (tests only).

The nightly never writes it: its ingest applies the days' revisions as it reads the base dump
(:func:`tasks.sources.ingest.changes.merge_pages`). The tests ingest this file to check that the
artifacts are those of the dump holding the same page texts. The base dump's bz2 streams holding no
changed page are copied byte for byte, the streams with a changed page are decompressed, the
changed ``<page>`` elements replaced (a revision not newer than the base page's is skipped,
:func:`tasks.sources.ingest.changes.is_newer`) and compressed again; new page ids go into the
stream where their id falls, ids past the base's last one into new streams of
:data:`PAGES_PER_STREAM` pages at the end. A ``-index.txt.bz2`` is written beside it.
"""
from __future__ import annotations

import bisect
import bz2
import re
from dataclasses import dataclass
from pathlib import Path

from tasks.sources.adds_changes import AddsChangesError
from tasks.sources.ingest.changes import PageRevision, is_newer, page_xml
from tasks.sources.ingest.multistream import index_path, plan_layout

PAGES_PER_STREAM = 100
_PAGE = re.compile(rb"[ \t]*<page>.*?</page>[ \t]*\n?", re.S)
_PAGE_ID = re.compile(rb"<id>(\d+)</id>")
_REVISION_ID = re.compile(rb"<revision>\s*<id>(\d+)</id>")
_TIMESTAMP = re.compile(rb"<timestamp>([^<]*)</timestamp>")


@dataclass
class MergeReport:
    """What :func:`apply_changes` did."""

    replaced: int = 0            # base pages whose text/title/redirect came from a day
    stale_revisions: int = 0     # revisions not newer than the base page's: the base page kept
    added: int = 0               # page ids not in the base dump
    streams_copied: int = 0      # base streams copied byte for byte
    streams_rewritten: int = 0   # base streams re-compressed with changed or inserted pages
    streams_new: int = 0         # streams of pages past the base's last page id


def read_index(index: Path) -> dict[int, list[tuple[int, str]]]:
    """``{stream offset: [(page_id, title), …]}`` of a multistream index (``offset:id:title`` lines)."""
    streams: dict[int, list[tuple[int, str]]] = {}
    with bz2.open(index, "rt", encoding="utf-8") as fh:
        for line in fh:
            off, pid, title = line.rstrip("\n").split(":", 2)
            streams.setdefault(int(off), []).append((int(pid), title))
    return streams


def apply_changes(base: Path, changes: dict[int, PageRevision], out: Path) -> MergeReport:
    """Write ``out`` (+ its ``-index.txt.bz2``): the multistream dump ``base`` with ``changes``
    (``{page_id: PageRevision}``, the revisions :func:`tasks.sources.adds_changes.merge_days` writes) applied.

    Raises ``AddsChangesError`` when ``base`` is not a multistream dump with an index."""
    base, out = Path(base), Path(out)
    layout = plan_layout(base, 1)
    if layout is None or not index_path(base).is_file():
        raise AddsChangesError(f"{base}: not a multistream dump with its index")
    by_offset = read_index(index_path(base))
    streams = [(p.start, p.end) for p in layout.pieces]
    ids = [[pid for pid, _ in by_offset[start]] for start, _ in streams]
    base_ids = {pid for s in ids for pid in s}
    max_id, firsts = max(base_ids), [s[0] for s in ids]
    inserts: dict[int, list[int]] = {}
    tail = []
    for pid in sorted(set(changes) - base_ids):
        if pid > max_id:
            tail.append(pid)
        else:
            inserts.setdefault(max(bisect.bisect_right(firsts, pid) - 1, 0), []).append(pid)
    report = MergeReport(added=len(tail) + sum(map(len, inserts.values())))

    def newer(pid: int, body: bytes) -> bool:
        rev_ids, stamps = _REVISION_ID.findall(body), _TIMESTAMP.findall(body)   # the page's last revision
        return is_newer(changes[pid], int(rev_ids[-1]) if rev_ids else None,
                        stamps[-1].decode("utf-8").strip() or None if stamps else None)

    def rewrite(k: int, raw: bytes) -> tuple[bytes | None, list[tuple[int, str]]]:
        """The stream re-compressed with its changes (``None``: every change stale, copy it) and its index lines."""
        start = streams[k][0]
        pages = [(int(_PAGE_ID.search(m.group()).group(1)), m.group()) for m in _PAGE.finditer(bz2.decompress(raw))]
        titles = dict(by_offset[start])
        applied = {pid for pid, body in pages if pid in changes and newer(pid, body)}
        report.stale_revisions += sum(pid in changes for pid, _ in pages) - len(applied)
        if not applied and k not in inserts:
            return None, by_offset[start]
        report.replaced += len(applied)
        merged = [(pid, page_xml(changes[pid]) if pid in applied else body,
                   changes[pid].title if pid in applied else titles.get(pid, "")) for pid, body in pages]
        merged += [(pid, page_xml(changes[pid]), changes[pid].title) for pid in inserts.get(k, [])]
        merged.sort(key=lambda t: t[0])
        return bz2.compress(b"".join(body for _, body, _ in merged), 9), [(pid, t) for pid, _, t in merged]

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(base, "rb") as src, open(out, "wb") as dst, bz2.open(index_path(out), "wt", encoding="utf-8") as ixw:
        def raw(start: int, end: int) -> bytes:
            src.seek(start)
            return src.read(end - start)
        dst.write(raw(*layout.header))
        for k, (start, end) in enumerate(streams):
            data, listed = None, by_offset[start]
            if k in inserts or any(pid in changes for pid in ids[k]):
                data, listed = rewrite(k, raw(start, end))
            offset = dst.tell()
            dst.write(raw(start, end) if data is None else data)
            report.streams_copied += data is None
            report.streams_rewritten += data is not None
            ixw.writelines(f"{offset}:{pid}:{title}\n" for pid, title in listed)
        for i in range(0, len(tail), PAGES_PER_STREAM):
            chunk = tail[i:i + PAGES_PER_STREAM]
            offset = dst.tell()
            dst.write(bz2.compress(b"".join(page_xml(changes[p]) for p in chunk), 9))
            ixw.writelines(f"{offset}:{p}:{changes[p].title}\n" for p in chunk)
            report.streams_new += 1
        dst.write(raw(*layout.footer))
    return report
