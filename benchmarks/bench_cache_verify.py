"""What checking the cache's digests costs a night: every entry of a home's corpus cache verified
against its digest manifest (:func:`funnelrag.verify.entry_problem`: sizes, then the sha256 of each
file), timed in CPU seconds, by kind of entry.

A build hashes an entry's files once when it writes the entry (:func:`funnelrag.verify.record_digests`)
and once more each time it reads it (:func:`funnelrag.verify.verified_entry`, once a build per
entry: a memo is checked by the coordinator, not by each shard). So a night's cost lies between
one and two checks of the entries it used (read or wrote: their marker's modification time is
after the night began, :func:`funnelrag.store.mark_used`); ``--since`` picks them (POSIX seconds,
e.g. the start time of the night's run), by default every entry counts. Run it on a home after a
night: ``python benchmarks/bench_cache_verify.py HOME [--since T] [--repeat 3]`` (the best of
``--repeat`` passes, the files then in the page cache as after the night that wrote them).
"""
from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from pathlib import Path


def kind_of(entry: Path, root: Path) -> str:
    """The kind of a cache entry: its group directory, or its memo name without the settings hash."""
    rel = entry.relative_to(root).parts
    name = rel[0] if len(rel) == 1 else rel[0] + "/" + re.sub(r"-[0-9a-f]{12,}$", "", rel[1])
    if len(rel) > 1 and re.fullmatch(r"[0-9a-f]{16,}", rel[1]):
        name = rel[0]
    return re.sub(r"-[0-9a-f]{12,}$", "", name)


def main(argv: list[str] | None = None) -> dict:
    from funnelrag.store import cache_entries, entry_marker  # noqa: PLC0415  (after argv: the checkout on PYTHONPATH)
    from funnelrag.verify import entry_files, entry_problem  # noqa: PLC0415  (after argv: the checkout on PYTHONPATH)

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("home", type=Path)
    parser.add_argument("--since", type=float, default=0.0, help="count entries used after this time (POSIX s)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    root = args.home / "cache" / "corpus"
    entries = [e for e in cache_entries(root) if entry_marker(e).stat().st_mtime >= args.since]
    by_kind: dict[str, dict[str, float]] = defaultdict(lambda: {"entries": 0, "bytes": 0, "cpu_s": 0.0})
    problems = []
    for entry in entries:
        best = float("inf")
        for _ in range(max(args.repeat, 1)):
            t0 = time.process_time()
            problem = entry_problem(entry)
            best = min(best, time.process_time() - t0)
        if problem is not None:
            problems.append(f"{entry}: {problem}")
        row = by_kind[kind_of(entry, root)]
        row["entries"] += 1
        row["bytes"] += sum(p.stat().st_size for p in entry_files(entry))
        row["cpu_s"] += best
    total = {"entries": sum(r["entries"] for r in by_kind.values()), "bytes": sum(r["bytes"] for r in by_kind.values()),
             "cpu_s": sum(r["cpu_s"] for r in by_kind.values())}
    result = {"home": str(args.home), "since": args.since, "by_kind": dict(sorted(by_kind.items())), "total": total,
              "mb_per_cpu_s": total["bytes"] / 1e6 / max(total["cpu_s"], 1e-9), "problems": problems}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
