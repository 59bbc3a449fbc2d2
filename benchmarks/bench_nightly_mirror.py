"""The nightly that follows a Wikimedia mirror, night by night, on a synthetic mirror
(``python benchmarks/synth_dump.py MIRROR --pages N --mirror-days D --merged MERGED``).

Night 1 sees only the full dump (every adds-changes day's ``status.txt`` is set to
"in-progress"), night k + 1 sees day k done as well (``--release 1 2``: one day before night 2,
two more before night 3), and a last night sees nothing new. Each night is
``corpus-build-nightly`` in a fresh process (``--http``: the mirror served by a local HTTP server,
so the dump is downloaded into the home), with its wall time and CPU seconds (the process and its
worker processes, ``RUSAGE_CHILDREN``; the Prefect API it starts included), its action, the
adds-changes apply step and its shard reuse. Then a build of MERGED (the full dump holding the
page texts after the last day) in the same home: it must report *unchanged*, i.e. its content
digest equals the last incremental night's (its ingest runs; every later stage is a cache hit).
The days' ``status.txt`` are restored at the end.

Each night's CPU seconds are also split into user and system time, and by role
(``cpu_by_role``: the coordinator, the pool workers, the Prefect API server), read from
``/proc/<pid>/stat`` of the night's process tree every 0.25 s (Linux; a process's last 0.25 s
before it exits is missed, so the roles add up to slightly less than ``cpu_s``), and the pool
workers' CPU by stage (``workers_cpu_by_stage``: each stage opens a pool of its own; a worker is
counted with the stage whose end, read from the night's log, first follows it), beside each
stage's wall seconds (``stage_wall_s``).

``--server``: the nights run against one Prefect server started for the whole bench
(``infra/server/prefect-server.sh`` on 127.0.0.1, SQLite under ``HOME/prefect-server``), as the nightly deployments run
(``prefect.yaml``: a flow run of a worker, talking to a standing API), not each against an
ephemeral API started and stopped with it. A night's ``cpu_s`` is then its own process tree's
(coordinator and pool workers), and ``server_cpu_s`` is the CPU the server's processes used from
the night's start to its end (``/proc``, the server's threads and children included; its
background services' idle loops during the night count too); ``cpu_with_server_s`` is their sum.

``--one-more``: one night on ``HOME`` as it is, with the mirror as it is (every day whose
``status.txt`` says done; no day held back, no cache aged), measured as the nights above and printed
as one line: for comparing two versions of the code on copies of one home (e.g. a hard-linked copy
of a home after night 3, each run with the other version first on ``PYTHONPATH``).
``--copy-before NIGHT DIR`` makes such a copy before night ``NIGHT``; ``--profile FILE`` runs the
``--one-more`` night's build process under ``cProfile`` (its statistics in ``FILE``, for ``pstats``;
the profiler slows that process, so its CPU seconds are not a night's).

After each night the home's size on disk is recorded (``home_bytes``); ``--cache-max-age-days``
and ``--keep-versions`` set the build's ``retention`` for every night.

Run: ``python benchmarks/bench_nightly_mirror.py MIRROR --merged MERGED --home DIR
[--wiki synwiki] [--workers 2] [--http] [--no-gate] [--release 1 1 1] [--cache-max-age-days D]
[--keep-versions N] [--days-between-nights 1] [--server] [--copy-before 4 COPY] [--clustering-mode full|local]
[--out results.json]``;
``python benchmarks/bench_nightly_mirror.py MIRROR --home DIR --one-more [--http] [--server] [--workers 2] [--no-gate]
[--profile FILE]``.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator


def _config(home: Path, workers: int, mirror: str | None, wiki: str, paths: list[str] | None, gate: bool = True,
            retention: dict | None = None, clustering_mode: str = "full"):
    """The nightly's config: S = 4,096 (the shipped enwiki config's), ``clustering_mode`` ``full`` (the
    paper's Algorithm 1 every night, so the last night equals a full build of the merged dump) or
    ``local`` (what ``configs/corpus_full_enwiki.yaml`` runs: Algorithm 1 only where the graph changed)."""
    from flows.corpus_build import CorpusBuildConfig

    source = {"datasets": [], "mirror": mirror, "wiki": wiki} if mirror else {"datasets": [], "paths": paths}
    return CorpusBuildConfig.model_validate({
        "name": wiki, "source": source, "ingest": {"format": "mediawiki"}, "clustering": {"max_tokens": 4096, "mode": clustering_mode},
        "workspace": {"home": str(home)}, "runner": {"kind": "local", "workers": workers},
        "gate": {"enabled": gate}, "retention": retention or {}})


def _shift_cache_clock(home: Path, days: float) -> None:
    """Make every corpus cache entry of ``home`` look ``days`` older (its marker's mtime): nights
    that ran minutes apart look a day apart to the build's cache retention."""
    from funnelrag.store import cache_entries, entry_marker

    for entry in cache_entries(Path(home) / "cache" / "corpus"):
        marker = entry_marker(entry)
        st = marker.stat()
        os.utime(marker, (st.st_atime - days * 86400, st.st_mtime - days * 86400))


def _home_bytes(home: Path) -> int:
    """Bytes the home holds on disk (each hard-linked file once), as ``du`` counts them."""
    seen, total = set(), 0
    for path in Path(home).rglob("*"):
        st = path.lstat()
        if path.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def _copy_home(home: Path, dest: Path) -> None:
    """``home`` copied to ``dest`` as hard links (every cache entry and version is written to a new
    name and renamed, never changed in place), but SQLite databases and their journals (MLflow's),
    which are written in place, copied; the bench's Prefect server is left out (``--one-more
    --server`` starts one of its own). Raises ``FileExistsError`` if ``dest`` exists."""
    import shutil

    def link_or_copy_db(src: str, dst: str) -> None:
        if ".db" in Path(src).name or Path(src).suffix in {".sqlite", ".sqlite3"}:
            shutil.copy2(src, dst)
        else:
            os.link(src, dst)

    shutil.copytree(home, dest, copy_function=link_or_copy_db, symlinks=True,
                    ignore=lambda d, _: ["prefect-server"] if Path(d) == Path(home) else [])


def one_night(args: argparse.Namespace) -> None:
    """In a child process: one nightly run; its summary as JSON on the last line of stdout. With
    ``args.profile``: the run under ``cProfile``, its statistics written there (``pstats``)."""
    from flows.corpus_nightly import corpus_build_nightly

    retention = {k: v for k, v in (("cache_max_age_days", args.cache_max_age_days),
                                   ("keep_versions", args.keep_versions)) if v is not None}
    cfg = _config(Path(args.home), args.workers, args.mirror_url, args.wiki, args.paths, gate=not args.no_gate,
                  retention=retention, clustering_mode=args.clustering_mode)
    if args.profile:
        import cProfile

        with cProfile.Profile() as profile:
            summary = corpus_build_nightly(cfg)
        profile.dump_stats(args.profile)
    else:
        summary = corpus_build_nightly(cfg)
    if summary.get("version"):   # read now: retention may remove this version on a later night
        from funnelrag.workspace import Workspace
        from tasks.corpus.published import corpus_store

        manifest = corpus_store(Workspace(cfg.workspace.home), args.wiki).read_manifest(summary["version"])
        summary["content_digest"] = manifest["content_digest"]
    keep = ("version", "unchanged", "shards", "reused_texts", "ingest", "nightly", "counts", "stages", "total_seconds",
            "retention", "content_digest", "clustering")
    print("SUMMARY " + json.dumps({k: summary.get(k) for k in keep}, default=str))


def _role(cmdline: str) -> str:
    if "uvicorn" in cmdline and "prefect.server" in cmdline:
        return "api_server"
    if "multiprocessing" in cmdline or "spawn_main" in cmdline:
        return "pool_workers"
    return "coordinator" if "--one-night" in cmdline else "other"


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 on: ``[0]`` the state,
    ``[1]`` the parent pid, ``[11]``/``[12]`` user/system ticks, ``[13]``/``[14]`` those of waited-for
    children). Raises ``OSError`` for a process that is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


class _TreeCPU:
    """User and system CPU seconds of a process tree by role, sampled from ``/proc`` (Linux)."""

    def __init__(self, root: int, every: float = 0.25):
        self.root, self.every, self.seen = root, every, {}
        self.first_seen: dict[int, float] = {}   # pid -> wall clock (time.time()) of its first sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _tree(self) -> list[int]:
        return self.tree(self.root)

    @staticmethod
    def tree(root: int) -> list[int]:
        """``root`` and its descendants' pids (``/proc``)."""
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    ppid = int(_stat_fields(entry)[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(ppid, []).append(int(entry))
        out, stack = [], [root]
        while stack:
            pid = stack.pop()
            out.append(pid)
            stack += children.get(pid, [])
        return out

    def _run(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        while not self._stop.is_set():
            for pid in self._tree():
                try:
                    fields = _stat_fields(pid)
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                role = _role(cmd) if cmd.strip() else self.seen.get(pid, ("other",))[0]   # an exiting process has none
                self.first_seen.setdefault(pid, time.time())
                self.seen[pid] = (role, int(fields[11]) / tick, int(fields[12]) / tick)
            self._stop.wait(self.every)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join()
        roles: dict[str, dict] = {}
        for role, user, system in self.seen.values():
            r = roles.setdefault(role, {"processes": 0, "user_s": 0.0, "sys_s": 0.0})
            r["processes"] += 1
            r["user_s"] = round(r["user_s"] + user, 2)
            r["sys_s"] = round(r["sys_s"] + system, 2)
        return roles

    def workers_by_stage(self, stage_ends: list[tuple[str, float]]) -> dict[str, float]:
        """CPU seconds (user + system) of the pool workers by stage: each stage opens a pool of its
        own, so a worker belongs to the first stage that ended after it was first seen
        (``stage_ends``: ``(stage, wall clock)`` in order, from :func:`_stage_ends`); the forkserver,
        started with the first pool, counts with that stage."""
        out: dict[str, float] = {}
        for pid, (role, user, system) in self.seen.items():
            if role != "pool_workers":
                continue
            seen = self.first_seen.get(pid, 0.0)
            stage = next((name for name, end in stage_ends if seen <= end), "after the stages")
            out[stage] = round(out.get(stage, 0.0) + user + system, 2)
        return out


STAGE_END = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d{3}) \|.*\bstage (\w+)\s+(?:built|cache hit) in ")


def _stage_ends(log: str, day_start: float) -> list[tuple[str, float]]:
    """``(stage, wall clock)`` of each ``stage <name> built|cache hit in`` line of a night's Prefect
    log (``HH:MM:SS.mmm`` local time; ``day_start``: the wall clock of that day's midnight)."""
    ends = []
    for line in log.splitlines():
        m = STAGE_END.match(line)
        if m:
            h, mi, sec, ms = (int(g) for g in m.groups()[:4])
            ends.append((m.group(5), day_start + h * 3600 + mi * 60 + sec + ms / 1000))
    return ends


def _tree_cpu_s(root: int) -> float:
    """User + system CPU seconds of ``root`` and its live descendants, with what their exited
    children used (``/proc/<pid>/stat`` fields 14-17); 0.0 for a process that is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in _TreeCPU.tree(root):
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / tick
    return total


class _PrefectServer:
    """The Prefect server of the README's *Deploying* section (``infra/server/prefect-server.sh``:
    ``prefect server start`` in the background, healthy or an error, and the process work pool) on
    a free 127.0.0.1 port with its own ``PREFECT_HOME``, up until :meth:`stop`; ``url`` is its API
    URL. Raises ``SystemExit`` with the script's message when it does not come up in 300 s."""

    SCRIPT = Path(__file__).resolve().parents[1] / "infra" / "server" / "prefect-server.sh"

    def __init__(self, home: Path):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_API_PORT": str(port),
               "PREFECT_SERVER_WAIT": "300"}
        env.pop("PREFECT_API_URL", None)
        self.url = f"http://127.0.0.1:{port}/api"
        done = subprocess.run(["bash", str(self.SCRIPT), "funnelrag-bench"], env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(done.stderr.strip() or f"{self.SCRIPT.name} failed")
        self.pid = int((home / "funnelrag-server.pid").read_text())

    def cpu_s(self) -> float:
        return _tree_cpu_s(self.pid)

    def stop(self) -> None:
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{self.pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if Path(f"/proc/{self.pid}").exists():
            os.kill(self.pid, signal.SIGKILL)


def _run_child(argv: list[str], server: _PrefectServer | None = None) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = server.cpu_s() if server else None
    t0 = time.perf_counter()
    env = {**os.environ, "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",   # a loaded box starts it slowly
           "PREFECT_LOGGING_LEVEL": "INFO"}   # Prefect's default: the stages' end lines give workers_cpu_by_stage
    if server:
        env["PREFECT_API_URL"] = server.url
    proc = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    sampler = _TreeCPU(proc.pid) if Path("/proc/self/stat").exists() else None
    stdout, stderr = proc.communicate()
    by_role = sampler.stop() if sampler is not None else None
    midnight = time.mktime(time.localtime()[:3] + (0, 0, 0, 0, 0, -1))
    by_stage = sampler.workers_by_stage(_stage_ends(stdout + "\n" + stderr, midnight)) if sampler is not None else None
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        sys.stderr.write(stdout[-5000:] + stderr[-5000:])
        raise SystemExit(f"night failed: {' '.join(argv)}")
    line = next(ln for ln in reversed(stdout.splitlines()) if ln.startswith("SUMMARY "))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    home = Path(argv[argv.index("--home") + 1])
    served = {}
    if server:
        served = {"server_cpu_s": round(server.cpu_s() - server_before, 2)}
        served["cpu_with_server_s"] = round(cpu + served["server_cpu_s"], 2)
    return {"wall_s": wall, "cpu_s": cpu, **served, "cpu_user_s": after.ru_utime - before.ru_utime,
            "cpu_sys_s": after.ru_stime - before.ru_stime, "cpu_by_role": by_role,
            "workers_cpu_by_stage": by_stage, "load": Path("/proc/loadavg").read_text().split()[:3],
            "home_bytes": _home_bytes(home), **json.loads(line[len("SUMMARY "):])}


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


def _serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Quiet, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def _night_line(r: dict) -> str:
    """One night's result as the JSON line the bench prints."""
    return json.dumps({k: r.get(k) for k in ("night", "wall_s", "cpu_s", "server_cpu_s", "cpu_user_s", "cpu_sys_s",
                                             "cpu_by_role", "workers_cpu_by_stage", "load", "version", "shards", "home_bytes", "retention",
                                             "clustering")}
                      | {"stage_wall_s": {k: round(v["wall_seconds"], 2) for k, v in (r.get("stages") or {}).items()},
                         "action": r["nightly"]["action"], "days": r["nightly"]["days"],
                         "apply": (r["nightly"].get("fetch") or {}).get("apply")})


@contextlib.contextmanager
def _servers(args: argparse.Namespace) -> Iterator[tuple[str, _PrefectServer | None]]:
    """``(mirror URL, Prefect server or None)`` for the nights: the mirror served over HTTP with
    ``--http`` (else its path), the standing Prefect server with ``--server``; both stopped on exit."""
    server, url = _serve(args.mirror) if args.http else (None, str(args.mirror))
    try:
        prefect_server = _PrefectServer(args.home / "prefect-server") if args.server else None
        try:
            yield url, prefect_server
        finally:
            if prefect_server:
                prefect_server.stop()
    finally:
        if server:
            server.shutdown()


def one_more(args: argparse.Namespace, common: list[str]) -> None:
    """``--one-more``: one night on ``args.home`` with the mirror as it is, measured by :func:`_run_child`."""
    if args.mirror is None:
        raise SystemExit("--one-more needs the MIRROR directory")
    profile = ["--profile", str(args.profile)] if args.profile else []
    with _servers(args) as (url, prefect_server):
        r = _run_child(["--one-night", "--mirror-url", url, *common, *profile], prefect_server)
    r["night"] = "one more"
    print(_night_line(r), flush=True)
    if args.out:
        args.out.write_text(json.dumps([r], indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mirror", type=Path, nargs="?")
    ap.add_argument("--merged", type=Path,
                    help="the merged full dump (.xml.bz2), or the directory synth_dump.py --merged wrote it to")
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--wiki", default="synwiki")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--http", action="store_true")
    ap.add_argument("--no-gate", action="store_true", help="gate.enabled=false (every version becomes current)")
    ap.add_argument("--release", type=int, nargs="*", help="days that become done before each incremental night "
                    "(default: 1 1 1 …, one a night)")
    ap.add_argument("--cache-max-age-days", type=float, help="retention.cache_max_age_days of every night")
    ap.add_argument("--keep-versions", type=int, help="retention.keep_versions of every night")
    ap.add_argument("--days-between-nights", type=float, help="age every cache entry by this many days before "
                    "each night after the first (what cache retention sees of nights a day apart)")
    ap.add_argument("--server", action="store_true", help="run every night against one Prefect server started "
                    "for the bench (as deployments run), not an ephemeral API each; the server's CPU during "
                    "each night is reported as server_cpu_s")
    ap.add_argument("--one-more", action="store_true", help="one night on HOME as it is, the mirror as it is "
                    "(every done day): for comparing code versions on copies of one home")
    ap.add_argument("--profile", type=Path, help="with --one-more: cProfile the night's build process, its "
                    "statistics written to this file (pstats)")
    ap.add_argument("--copy-before", nargs=2, metavar=("NIGHT", "DIR"), help="before night NIGHT (1 = the full "
                    "build), copy the home to DIR (hard links; databases copied): a home for --one-more comparisons")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--clustering-mode", choices=["full", "local"], default="full",
                    help="clustering.mode of every night: full (the paper's Algorithm 1; the last night then equals a full build "
                    "of the merged dump) or local (the shipped enwiki nightly config's: Algorithm 1 only where the graph changed)")
    ap.add_argument("--one-night", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mirror-url", help=argparse.SUPPRESS)
    ap.add_argument("--paths", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.merged is not None and args.merged.is_dir():   # synth_dump.py --merged DIR writes one dump there
        dumps = sorted(args.merged.glob("*.xml.bz2"))
        if len(dumps) != 1:
            ap.error(f"--merged {args.merged}: expected one .xml.bz2 in the directory, found {len(dumps)}")
        args.merged = dumps[0]
    if args.one_night:
        return one_night(args)
    common = ["--home", str(args.home / "nightly"), "--wiki", args.wiki, "--workers", str(args.workers)]
    common += ["--no-gate"] if args.no_gate else []
    common += ["--cache-max-age-days", str(args.cache_max_age_days)] if args.cache_max_age_days else []
    common += ["--keep-versions", str(args.keep_versions)] if args.keep_versions else []
    common += ["--clustering-mode", args.clustering_mode]
    if args.one_more:
        return one_more(args, common)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a kill still restores the days' status.txt
    days = sorted((args.mirror / "other" / "incr" / args.wiki).iterdir())
    saved = {d: (d / "status.txt").read_text() for d in days}
    results = []
    try:
        with _servers(args) as (url, prefect_server):
            for d in days:
                (d / "status.txt").write_text("in-progress\n")
            release = args.release or [1] * len(days)
            done = 0
            for night in range(len(release) + 2):
                if 1 <= night <= len(release):
                    for d in days[done:done + release[night - 1]]:
                        (d / "status.txt").write_text(saved[d])
                    done += release[night - 1]
                if night and args.days_between_nights:
                    _shift_cache_clock(args.home / "nightly", args.days_between_nights)
                if args.copy_before and int(args.copy_before[0]) == night + 1:
                    _copy_home(args.home, Path(args.copy_before[1]))
                r = _run_child(["--one-night", "--mirror-url", url, *common], prefect_server)
                r["night"] = night + 1
                results.append(r)
                print(_night_line(r), flush=True)
            if args.merged:   # the full dump of the same texts, built in the same home: unchanged = same digest
                r = _run_child(["--one-night", "--paths", str(args.merged), *common], prefect_server)
                r["night"] = "merged full build"
                results.append(r)
                print(json.dumps({k: r.get(k) for k in ("night", "wall_s", "cpu_s", "load", "version", "unchanged",
                                                        "shards")}), flush=True)
    finally:
        for d, text in saved.items():
            (d / "status.txt").write_text(text)

    if args.merged:
        inc = [r for r in results if (r.get("nightly") or {}).get("action") == "incremental"]
        print("content digest after the last incremental night:", inc[-1]["content_digest"] if inc else None)
        print("full build of the merged dump: unchanged =", results[-1].get("unchanged"),
              "digest", results[-1]["content_digest"])
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
