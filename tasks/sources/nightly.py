"""What tonight's corpus build is, and its input file: the decision of the nightly that follows a
Wikimedia mirror (:mod:`tasks.sources.dump_source`), with no Prefect.

The decision (:func:`plan_night`) compares the mirror with what the corpus was last built from:
the ``dump`` entry of the current version's manifest (``{"wiki", "base", "days"}``), or the
nightly state file of the corpus store when tonight's inputs equalled the current version's
content (an unchanged build publishes nothing, so the manifest cannot say it):

- a finished full dump newer than the base → ``full``: a build of that dump;
- otherwise finished adds-changes days after the base that the last build did not hold →
  ``incremental``: a build of the base with every finished day since it applied, in date order
  (:mod:`tasks.sources.adds_changes`);
- otherwise ``nothing``.

A full dump said done whose files are missing on the mirror or fail their checksum does not stall
the nightly: :func:`plan_and_fetch` passes it over (``NightPlan.unusable``, with the reason) and
plans the night again without it: the days since the last good base are applied as if the bad
dump were not there; a later night tries it again (the mirror may have been repaired).

:func:`prepare_input` downloads and verifies the files (resumed, checksummed) and, for an
incremental night, hands the days' revisions to the ingest, which applies them as it reads the
base dump. Every failure raises before a build starts, so a
failed download or check never moves ``current``.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from data_contracts.base import atomic_write
from tasks.sources.adds_changes import STALE_REVISION, merge_days, plan_changes
from tasks.sources.dump_source import (DayScan, DumpSourceError, FullDump, Mirror, fetch, full_dump_name, index_name,
                                      latest_full_dump, parse_dumpstatus, scan_days)

log = logging.getLogger(__name__)

FULL, INCREMENTAL, NOTHING = "full", "incremental", "nothing"
STATE_FILE = "nightly-state.json"
MOVES_NOTE = ("page deletions and moves out of the main namespace are not in adds-changes dumps: they take effect "
              "when the next full dump becomes the base")


@dataclass
class NightPlan:
    """Tonight's action and what it is built from."""

    action: str                          # full | incremental | nothing
    wiki: str
    mirror: str
    base: FullDump | None                # the full dump built on (None: nothing to do and no dump known)
    scan: DayScan = field(default_factory=DayScan)
    previous: dict[str, Any] | None = None   # the last build's dump entry
    passed_over: dict[str, str] = field(default_factory=dict)   # full-dump dates not done, with the reason
    unusable: dict[str, str] = field(default_factory=dict)   # full dumps said done whose files failed tonight
    reason: str = ""

    @property
    def days(self) -> list[str]:
        return [d.date for d in self.scan.days] if self.action == INCREMENTAL else []

    def dump_entry(self) -> dict[str, Any]:
        """The manifest's ``dump`` entry of a build of this plan."""
        return {"wiki": self.wiki, "mirror": self.mirror, "base": self.base.date if self.base else None,
                "base_file": self.base.dump.name if self.base else None, "days": self.days,
                "missing_days": self.scan.missing if self.action == INCREMENTAL else [],
                "waiting_days": self.scan.waiting}

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "reason": self.reason, **self.dump_entry(),
                "day_reasons": self.scan.reasons, "passed_over_full_dumps": self.passed_over,
                "unusable_full_dumps": self.unusable, "previous": self.previous}


def last_build(manifest: dict[str, Any] | None, state: dict[str, Any] | None, current: str | None) -> dict | None:
    """The dump entry of the last build that ``current`` holds: the state file's when it names the
    current version (an unchanged build), else the current manifest's ``dump`` entry."""
    if state and current and state.get("version") == current and state.get("dump"):
        return state["dump"]
    return (manifest or {}).get("dump")


def plan_night(mirror: Mirror, wiki: str, previous: dict[str, Any] | None,
               unusable: dict[str, str] | None = None) -> NightPlan:
    """Decide tonight's build (module docstring). ``unusable``: ``{date: reason}`` of full dumps
    said done whose files were missing or failed their checksum tonight: passed over.

    Raises
    ------
    DumpSourceError
        No finished full dump of ``wiki`` on the mirror and none built before (names the mirror
        and why each dump date was passed over).
    """
    base_date = (previous or {}).get("base") if (previous or {}).get("wiki") == wiki else None
    unusable = dict(unusable or {})
    newest, passed = latest_full_dump(mirror, wiki, after=base_date, unusable=unusable)
    if newest is not None:
        why = f"full dump {newest.date} is newer than the base {base_date}" if base_date else f"first build: full dump {newest.date}"
        return NightPlan(FULL, wiki, mirror.root, newest, previous=previous, passed_over=passed, unusable=unusable,
                         reason=why)
    if base_date is None:
        raise DumpSourceError(f"{mirror.where(wiki + '/')}: no finished full dump of {wiki} "
                              f"({'; '.join(passed.values()) or 'no dump dates listed'})")
    base, _ = _base_dump(mirror, wiki, base_date)
    scan = scan_days(mirror, wiki, base_date)
    done = [d.date for d in scan.days]
    bad = f"; unusable full dump(s) passed over: {', '.join(sorted(unusable))}" if unusable else ""
    if done and done != list(previous.get("days") or []):
        new = [d for d in done if d not in (previous.get("days") or [])]
        return NightPlan(INCREMENTAL, wiki, mirror.root, base, scan, previous, passed, unusable,
                         f"adds-changes days {', '.join(new) or '(a different set)'} after full dump {base_date}{bad}")
    return NightPlan(NOTHING, wiki, mirror.root, base, scan, previous, passed, unusable,
                     f"nothing new: full dump {base_date} and {len(done)} adds-changes day(s) already built"
                     + (f"; waiting: {', '.join(scan.waiting)}" if scan.waiting else "") + bad)


def plan_and_fetch(plan: Callable[[dict[str, str]], NightPlan],
                   fetch: Callable[[NightPlan], tuple[Path, dict[str, Any]]]) -> tuple[NightPlan, Path | None, dict]:
    """Tonight's plan and its verified input: ``plan(unusable)`` (:func:`plan_night` with the full
    dumps to pass over) then ``fetch(plan)`` (:func:`prepare_input`). A full dump whose fetch
    raises ``DumpSourceError`` (a file missing on the mirror, ``ChecksumMismatch``) is passed over,
    logged and counted in ``NightPlan.unusable``, and the night planned again without it, until a
    plan fetches or has nothing to do (each round passes over one more date, so it ends).

    Returns ``(plan, input file or None for nothing, what the fetch did)``.

    Raises
    ------
    DumpSourceError
        The fetch of an incremental night failed (a day's or the base dump's file; names it), or
        no usable full dump is left for a first build.
    """
    unusable: dict[str, str] = {}
    while True:
        night = plan(dict(unusable))
        if night.action == NOTHING:
            return night, None, {}
        try:
            path, info = fetch(night)
        except DumpSourceError as exc:
            if night.action != FULL or night.base is None or night.base.date in unusable:
                raise
            unusable[night.base.date] = f"said done, but {exc}"
            log.warning("full dump %s of %s passed over: %s", night.base.date, night.wiki, exc)
            continue
        return night, path, info


def _base_dump(mirror: Mirror, wiki: str, date: str) -> tuple[FullDump, None]:
    where = mirror.where(f"{wiki}/{date}/dumpstatus.json")
    text = mirror.read_text(f"{wiki}/{date}/dumpstatus.json")
    if text is None:
        raise DumpSourceError(f"{where}: the base full dump {date} is gone from the mirror; "
                              "the next finished full dump becomes the base")
    return parse_dumpstatus(text, wiki, date, where), None


def prepare_input(mirror: Mirror, plan: NightPlan, downloads: Path, read_cache: bool = True,
                  index_cache: Path | None = None) -> tuple[Path, dict[str, Any]]:
    """The dump file to build tonight (downloaded and verified) and what was done to get it.

    ``full``: the dump and its index (``downloads/<wiki>/<date>/``). ``incremental``: the base as
    well and each day's file (``downloads/other/incr/<wiki>/<date>/``), and the days' revisions in
    ``downloads/merged/<wiki>/<wiki>-<last day>-pages-articles-multistream.xml.bz2.changes.parquet``
    (``info["changes_file"]``); the returned path is the base dump: the ingest applies the
    revisions as it reads it, with the artifacts of the merged dump and no dump written
    (:func:`tasks.sources.adds_changes.plan_changes`). Each day's revisions are kept beside its
    download (:func:`tasks.sources.adds_changes.read_day_memo`): a day is parsed by the first
    night that applies it only, and no process holds the days' texts (:func:`merge_days`).
    ``read_cache`` False (``cache.read: false``): every day is parsed again, no day memo read.
    ``index_cache``: where the base's multistream index summary is kept (the ingest's piece cache;
    :func:`tasks.sources.adds_changes.plan_changes`), or None: the index read tonight.

    Raises
    ------
    ChecksumMismatch, DumpSourceError
        A file is missing, or its size or digest differs (names the file).
    tasks.sources.adds_changes.AddsChangesError
        A day's file or the base dump cannot be read, or the base is not in page id order.
    """
    if plan.base is None:
        raise ValueError("prepare_input: the plan has no dump (action nothing)")
    downloads = Path(downloads)
    dump = fetch(mirror, plan.base.dump, downloads)
    if plan.base.index is not None:
        ix = fetch(mirror, plan.base.index, downloads)
        if ix.parent != dump.parent or ix.name != index_name(dump.name):   # a directory mirror read in place
            raise DumpSourceError(f"{ix}: the index must lie beside {dump}")
    info: dict[str, Any] = {"base_dump": str(dump)}
    if plan.action == FULL:
        return dump, info
    day_files = [(d.date, fetch(mirror, d.file, downloads)) for d in plan.scan.days]
    merged_name = full_dump_name(plan.wiki, plan.scan.days[-1].date)
    changes_file = downloads / "merged" / plan.wiki / f"{merged_name}.changes.parquet"
    # each day parsed once per base: later nights read its revisions from the memo beside the download
    changes, counts = merge_days(day_files, changes_file, merged_name, memo_dir=downloads / "other" / "incr" / plan.wiki,
                                 read_memos=read_cache)
    report = plan_changes(dump, changes, index_cache)
    for old in changes_file.parent.glob(f"{plan.wiki}-*-pages-articles-multistream*"):   # tonight's file only
        if old.name != changes_file.name:
            old.unlink(missing_ok=True)
    info.update({"days": [c.as_dict() for c in counts], "apply": report.as_dict(),
                 "changes_file": str(changes_file),
                 # skipped before the ingest as not newer than an earlier day's; the ingest counts the base's
                 "stale_revisions": sum(c.skipped.get(STALE_REVISION, 0) for c in counts)})
    return dump, info


def read_state(store_root: Path) -> dict[str, Any] | None:
    """The nightly state file of a corpus store (None when absent or unreadable)."""
    try:
        return json.loads((Path(store_root) / STATE_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_state(store_root: Path, version: str, dump: dict[str, Any]) -> None:
    """Record that ``version`` (current) holds the inputs ``dump`` (atomic)."""
    Path(store_root).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(store_root) / STATE_FILE,
                 lambda p: p.write_text(json.dumps({"version": version, "dump": dump}, indent=1, sort_keys=True)))
