"""What one shard costs the workflow engine: CPU seconds of the whole process tree (the flow's
process, its stage pool's forkserver and workers, and the ephemeral Prefect API server) of a flow
whose one stage task opens the corpus build's shard pool (``flows.runners.ShardRunner``) and
submits N shard calls doing nothing, for each N of ``--tasks`` (default 0 and 40), each in a fresh
process, ``--repeat`` times alternated; the slope of CPU against N is the cost of a shard.

Why: an adds-changes night of the nightly runs ~25–40 shards whose work is a second or two, so a
shard's own cost decides whether batching small shards pays. A shard was a Prefect task run
(``corpus-shard``: a task run created and moved through its states in the API, its log records
and events sent, the worker's API client) until each stage drove its own executor; it is now one
call through a ``ProcessPoolExecutor`` (pickled call and result, the worker's memory release).

``--server DIR``: every run against one standing Prefect server (``infra/server/prefect-server.sh``,
its SQLite under ``DIR``, stopped at the end), as the nightly deployments run, instead of an
ephemeral API each: a run's ``cpu_s`` is then the flow's process tree (the flow, the pool's
forkserver and workers) and ``server_cpu_s`` what the server used from the run's start to 2 s
after its end (``/proc``); the line is fitted to their sum.

Run: ``python benchmarks/bench_task_overhead.py [--tasks 0 40] [--repeat 3] [--workers 2] [--server DIR]``
(prints one JSON line per run, then the per-shard CPU of the least-squares line).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def nothing(k: int) -> int:
    """A shard call that does no work (the task's own cost only)."""
    return k


def child(n_tasks: int, workers: int) -> None:
    """Run the flow in this process: one stage task, its pool started, then ``n_tasks`` shard calls."""
    sys.path.append(str(ROOT))   # after PYTHONPATH: another checkout first on it is the code measured
    from prefect import flow, task  # noqa: PLC0415

    from flows.runners import RunnerConfig, ShardRunner  # noqa: PLC0415

    @task(name="stage")
    def stage() -> int:
        with ShardRunner(RunnerConfig(workers=workers)) as runner, runner.pool("overhead") as pool:
            futures = [pool.submit(nothing, 0)]   # the pool's start, in every run
            futures += [pool.submit(nothing, k) for k in range(1, n_tasks + 1)]
            return sum(f.result() for f in futures)

    @flow(name="task-overhead")
    def run() -> int:
        return stage()

    run()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, nargs="+", default=[0, 40])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--server", type=Path, metavar="DIR", help="run against one standing Prefect server "
                    "(its home DIR) and count its CPU, instead of an ephemeral API each run")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        child(a.child, a.workers)
        return
    server = None
    env = {**os.environ}
    if a.server:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from bench_nightly_mirror import _PrefectServer  # noqa: PLC0415  (the bench's server, only with --server)

        server = _PrefectServer(a.server)
        env["PREFECT_API_URL"] = server.url
    points = []
    try:
        for _ in range(a.repeat):
            for n in a.tasks:
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                served = server.cpu_s() if server else 0.0
                t = time.perf_counter()
                subprocess.run([sys.executable, __file__, "--child", str(n), "--workers", str(a.workers)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
                wall = time.perf_counter() - t
                row = {"tasks": n}
                if server:
                    time.sleep(2)   # the server's handling of the run's last events
                    row["server_cpu_s"] = round(server.cpu_s() - served, 2)
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                points.append((n, cpu + row.get("server_cpu_s", 0.0)))
                print(json.dumps({**row, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
                                  "load": os.getloadavg()[0]}), flush=True)
    finally:
        if server:
            server.stop()
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / max(sum((x - mx) ** 2 for x in xs), 1e-9)
    print(json.dumps({"cpu_s_per_task": round(slope, 3), "cpu_s_at_zero": round(my - slope * mx, 2)}))


if __name__ == "__main__":
    main()
