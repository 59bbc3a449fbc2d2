"""A nightly build (2 local workers, a synthetic mirror) interrupted for real: SIGTERM during token
counting stops it within seconds, with its pool workers, forkserver, resource tracker and ephemeral
Prefect API, and the interrupted shard writes no cache entry; ``kill -9`` of a run from Python or of
the CLI leaves no process alive after 10 s (the reaper); the next run leaves no scratch byte.

Each test prints its measured figures (seconds from the signal to the exit, processes left)."""
from __future__ import annotations

import signal
import time

import pytest

from benchmarks.synth_dump import SAMPLE, write_mirror
from tests.interrupted_run import (WIKI, build_config, entries_written_after, interrupt, scratch_bytes,
                                   start_from_cli, start_from_python)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, data_mirror):
    root = tmp_path_factory.mktemp("mirror")
    write_mirror(root, 1500, 1, seed=3, wiki=WIKI, sample=data_mirror / SAMPLE)
    return root


def _rerun_publishes_and_leaves_no_scratch(start, config: dict, tmp_path, home) -> None:
    """The next run of the same config completes and publishes; no temp or scratch byte is left."""
    rerun = start(config, tmp_path / "prefect", tmp_path / "rerun.log")
    try:
        assert rerun.proc.wait(timeout=1800) == 0, rerun.tail()
    finally:
        rerun.kill_left()
    assert (home / "stores" / "corpus" / WIKI / "current").is_file()
    bytes_left, names_left = scratch_bytes(home)
    print(f"after the next run: {bytes_left} scratch bytes, {len(names_left)} temp names left")
    assert (bytes_left, names_left) == (0, [])


@pytest.mark.parametrize("start", [start_from_python, start_from_cli], ids=["python", "cli"])
def test_sigterm_during_token_counting_stops_the_run_and_everything_it_started(start, tmp_path, mirror, data_mirror):
    home = tmp_path / "home"
    config = build_config(home, data_mirror, mirror=str(mirror)) if start is start_from_python else \
        build_config(home, data_mirror, paths=[str(mirror / WIKI / "20260101" /
                                                   f"{WIKI}-20260101-pages-articles-multistream.xml.bz2")])
    run = start(config, tmp_path / "prefect", tmp_path / "run.log")
    try:
        sent, pool_s, stop_s = interrupt(run, signal.SIGTERM)
        time.sleep(5)
        left = run.left_alive()
        print(f"\n[{start.__name__}] SIGTERM → pool processes gone in {pool_s:.1f} s, exit in {stop_s:.1f} s "
              f"(rc {run.proc.returncode}); {len(run.seen)} descendants seen, {len(left)} alive 5 s after the exit")
        assert pool_s < 5.0, run.tail()
        assert stop_s < 60, run.tail()   # after the pool: Prefect's crash report through its API (slow on a busy box)
        assert left == [], left
        assert any("forkserver" in cmd for _, cmd in run.seen.values()), run.seen   # the pool had started
        assert entries_written_after(home / "cache" / "corpus", sent + 1.0) == []
    finally:
        run.kill_left()
    _rerun_publishes_and_leaves_no_scratch(start, config, tmp_path, home)


def test_kill_9_of_a_nightly_run_from_python_leaves_no_process_and_no_scratch(tmp_path, mirror, data_mirror):
    home = tmp_path / "home"
    config = build_config(home, data_mirror, mirror=str(mirror))
    run = start_from_python(config, tmp_path / "prefect", tmp_path / "run.log")
    try:
        # killed while the run holds scratch (a split or temp directory), however fast the box reaches it
        interrupt(run, signal.SIGKILL, ready=lambda: bool(scratch_bytes(home)[1]))
        time.sleep(10)
        left = run.left_alive()
        print(f"\n[python] kill -9: {len(run.seen)} descendants seen, {len(left)} alive 10 s later: {left}")
        assert left == [], left
        assert any("forkserver" in cmd for _, cmd in run.seen.values()) and any(
            "uvicorn" in cmd for _, cmd in run.seen.values()), run.seen
        assert scratch_bytes(home)[1]   # the killed run's split and temp directories are there
    finally:
        run.kill_left()
    _rerun_publishes_and_leaves_no_scratch(start_from_python, config, tmp_path, home)
