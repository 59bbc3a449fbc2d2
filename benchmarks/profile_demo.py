"""Where ``funnelrag demo`` spends its CPU seconds, step by step: for each step, wall seconds, this
process's CPU seconds (``os.times``) and those of every process it started (reaped children, plus
the live ones: the ephemeral Prefect API, the corpus build's forkserver and pool workers, read
through ``psutil``), and optionally a cProfile of the step (this process only; workers are not
profiled) to ``--profile-dir``.

The demo runs exactly as ``funnelrag demo`` runs it (``funnelrag.cli.main``), in one fresh home; the
script only wraps each step's command. Figures taken on a shared box are noisy in wall seconds:
compare CPU seconds, and say what else ran.

Run: ``python benchmarks/profile_demo.py --home demo-home [--profile-dir DIR] [--json FILE]
[--set 'steps=[distillation, evaluate]'] ...`` (``--set`` as for ``funnelrag demo``; a home that
already holds the published corpora runs the later steps alone).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import os
import sys
import time
import types
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flows.demo as demo  # noqa: E402
from funnelrag import cli  # noqa: E402


def cpu_seconds() -> tuple[float, float]:
    """(this process's CPU s, CPU s of all its descendants: reaped ones and live ones)."""
    own = os.times()
    live = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            t = child.cpu_times()
            live += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:       # ended between the listing and the read: counted when reaped
            pass
    return own.user + own.system, own.children_user + own.children_system + live


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home", required=True, help="the demo's funnelrag home (fresh for a first-run figure)")
    parser.add_argument("--profile-dir", type=Path, help="write <step>.prof (cProfile of this process) here")
    parser.add_argument("--json", type=Path, help="also write the per-step figures here")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    steps: dict[str, dict[str, float]] = {}
    original = demo.step_command

    def step_command(cfg, step):
        cmd, step_cfg = original(cfg, step)

        def run(c):
            prof = cProfile.Profile() if args.profile_dir else None
            own0, kids0 = cpu_seconds()
            w0 = time.perf_counter()
            if prof:
                prof.enable()
            try:
                return cmd.run(c)
            finally:
                if prof:
                    prof.disable()
                    args.profile_dir.mkdir(parents=True, exist_ok=True)
                    prof.dump_stats(str(args.profile_dir / f"{step}.prof"))
                own1, kids1 = cpu_seconds()
                steps[step] = {"wall_s": round(time.perf_counter() - w0, 1), "cpu_s": round(own1 - own0, 1),
                               "descendants_cpu_s": round(kids1 - kids0, 1)}
                print(json.dumps({"step": step, **steps[step]}), flush=True)
        return types.SimpleNamespace(name=cmd.name, run=run, config_model=cmd.config_model), step_cfg

    demo.step_command = step_command
    own0, kids0 = cpu_seconds()
    w0 = time.perf_counter()
    rc = cli.main(["demo", "--home", args.home, *[a for o in args.overrides for a in ("--set", o)]])
    own1, kids1 = cpu_seconds()
    steps["total"] = {"wall_s": round(time.perf_counter() - w0, 1), "cpu_s": round(own1 - own0, 1),
                      "descendants_cpu_s": round(kids1 - kids0, 1),
                      "load_avg_1m_end": os.getloadavg()[0]}
    print(json.dumps({"step": "total", **steps["total"]}), flush=True)
    if args.json:
        args.json.write_text(json.dumps(steps, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
