"""Bench tools: the nightly bench's CPU accounting of a process tree (what ``--server`` charges a
night with), its --one-more night, the task-overhead bench against a standing server, and the
collector timing of ``benchmarks/gc_time``."""
import subprocess
import sys
import time

import pytest

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_tree_cpu_counts_a_processs_children_live_and_exited():
    """A process that burns 0.3 CPU s in a child it waited for, then starts a grandchild that burns
    and sleeps: the tree's CPU covers both children's burns; a process that is gone counts 0."""
    import os
    import signal

    from benchmarks.bench_nightly_mirror import _tree_cpu_s, _TreeCPU

    script = (f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BURN.format(s=0.3)!r}])\n"
              f"subprocess.Popen([sys.executable, '-c', {BURN.format(s=0.3) + 'time.sleep(60)'!r}]).wait()\n")
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while _tree_cpu_s(proc.pid) < 0.6 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _tree_cpu_s(proc.pid) >= 0.6   # 0.3 s exited (the parent's children time) + 0.3 s live
    finally:
        for pid in reversed(_TreeCPU.tree(proc.pid)):
            os.kill(pid, signal.SIGKILL)
        proc.wait()
    assert _tree_cpu_s(proc.pid) == 0.0


def test_stage_ends_and_workers_by_stage_from_a_nights_log():
    """The stages' end times come from the night's log lines; a pool worker counts with the first
    stage that ended after it was first seen, the coordinator with none."""
    from benchmarks.bench_nightly_mirror import _stage_ends, _TreeCPU

    log = ("10:00:05.000 | INFO    | Flow run 'x' - stage ingest   built in 5.00 s\n"
           "10:00:06.500 | INFO    | Task run 'tokens' - stage tokens: 3 shard(s) on 2 local worker process(es)\n"
           "10:00:07.250 | INFO    | Flow run 'x' - stage tokens   cache hit in 0.10 s\n"
           "10:00:09.000 | INFO    | Flow run 'x' - stage index    built in 1.75 s\n")
    ends = _stage_ends(log, 1000.0)
    assert ends == [("ingest", 1000.0 + 36005.0), ("tokens", 1000.0 + 36007.25), ("index", 1000.0 + 36009.0)]
    sampler = _TreeCPU.__new__(_TreeCPU)
    sampler.seen = {1: ("coordinator", 9.0, 1.0), 2: ("pool_workers", 2.0, 0.5), 3: ("pool_workers", 1.0, 0.0),
                    4: ("pool_workers", 0.25, 0.0), 5: ("pool_workers", 0.5, 0.0)}
    sampler.first_seen = {1: 0.0, 2: 37001.0, 3: 37007.0, 4: 37008.0, 5: 37010.0}
    assert sampler.workers_by_stage(ends) == {"ingest": 2.5, "tokens": 1.0, "index": 0.25, "after the stages": 0.5}


def test_copy_home_links_files_and_copies_databases(tmp_path):
    """--copy-before's copy: files hard-linked, SQLite databases copied, the bench's Prefect server left out."""
    from benchmarks.bench_nightly_mirror import _copy_home

    home = tmp_path / "home"
    (home / "nightly" / "cache").mkdir(parents=True)
    (home / "prefect-server").mkdir()
    (home / "nightly" / "cache" / "a.npy").write_bytes(b"a")
    (home / "nightly" / "mlflow.db").write_bytes(b"db")
    _copy_home(home, tmp_path / "copy")
    copy = tmp_path / "copy" / "nightly"
    assert (copy / "cache" / "a.npy").stat().st_ino == (home / "nightly" / "cache" / "a.npy").stat().st_ino
    assert (copy / "mlflow.db").read_bytes() == b"db"
    assert (copy / "mlflow.db").stat().st_ino != (home / "nightly" / "mlflow.db").stat().st_ino
    assert not (tmp_path / "copy" / "prefect-server").exists()


def test_gc_time_site_writes_each_processs_collections(tmp_path):
    """benchmarks/gc_time: a process started with it and FUNNELRAG_GC_TIME_DIR writes its full
    collections and their CPU time; without the variable it writes nothing."""
    import ast
    import os
    from pathlib import Path

    site = Path(__file__).resolve().parents[1] / "benchmarks" / "gc_time"
    code = "import gc\nfor _ in range(3): gc.collect()\n"
    env = {**os.environ, "PYTHONPATH": str(site), "FUNNELRAG_GC_TIME_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    lines = [p.read_text() for p in tmp_path.glob("*.txt")]
    assert len(lines) == 1
    collections = ast.literal_eval(lines[0].split("collections=")[1].split(" cpu_s=")[0])
    assert collections[2] >= 3
    env.pop("FUNNELRAG_GC_TIME_DIR")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert len(list(tmp_path.glob("*.txt"))) == 1


@pytest.mark.slow  # starts a Prefect server (~20 s)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_bench_server_is_the_deploying_script_and_stops(tmp_path):
    """--server's server comes from infra/server/prefect-server.sh: healthy, its CPU readable while
    it runs, gone after stop."""
    from pathlib import Path

    import httpx

    from benchmarks.bench_nightly_mirror import _PrefectServer

    server = _PrefectServer(tmp_path / "prefect")
    try:
        assert httpx.get(f"{server.url}/health", timeout=30).status_code == 200
        assert server.cpu_s() > 0
    finally:
        server.stop()
    assert not Path(f"/proc/{server.pid}").exists()
    assert server.cpu_s() == 0.0


@pytest.mark.slow  # three small nightly builds (~1-2 min)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_one_more_night_on_a_home_as_it_is(tmp_path, data_mirror):
    """--one-more runs one night on the home with the mirror as it is and prints it measured like
    the bench's nights: a full build on an empty home, then the done days, then nothing new; the
    pool workers (forked by the forkserver) count in the night's CPU by role. With
    ``--clustering-mode local`` (the shipped enwiki nightly's), the adds-changes night re-runs
    Algorithm 1 from the current version and its line says what it kept."""
    import json
    import os
    from pathlib import Path

    from benchmarks.synth_dump import SAMPLE, write_mirror

    write_mirror(tmp_path / "mirror", 400, 1, seed=5, wiki="synwiki", sample=data_mirror / SAMPLE, edit_share=0.02)
    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_nightly_mirror.py"
    env = {**os.environ, "FUNNELRAG_DATA_MIRROR": str(data_mirror)}
    env.pop("PREFECT_API_URL", None)   # each night starts its own ephemeral API, as the bench's nights do
    nights = []
    for _ in range(3):
        out = subprocess.run([sys.executable, str(bench), str(tmp_path / "mirror"), "--http", "--home",
                              str(tmp_path / "home"), "--workers", "2", "--no-gate", "--one-more", "--clustering-mode", "local"],
                             env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-3000:]
        nights.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert [n["action"] for n in nights] == ["full", "incremental", "nothing"]
    assert nights[1]["days"] == ["20260102"]
    assert nights[0]["clustering"]["base"] is None   # a full dump: the paper's Algorithm 1 over everything
    assert nights[1]["clustering"]["base"] == nights[0]["version"]   # re-clustered where the graph changed
    for night in nights[:2]:
        roles = night["cpu_by_role"]
        assert night["cpu_s"] > 0 and roles["coordinator"]["user_s"] > 0 and roles["pool_workers"]["user_s"] > 0
        by_stage = night["workers_cpu_by_stage"]   # each worker counted with a stage whose end the night's log gave
        assert by_stage and set(by_stage) <= {"ingest", "tokens", "segment", "index"}
        assert set(night["stage_wall_s"]) >= {"ingest", "tokens", "cluster", "segment", "index", "publish"}


@pytest.mark.slow  # starts a Prefect server (~20 s) and runs two small flows
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_task_overhead_bench_against_a_standing_server(tmp_path):
    """benchmarks/bench_task_overhead.py --server runs its flows against one standing server (gone
    at the end), prints each run with the server's CPU during it, then the fitted cost of a task."""
    import json
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_task_overhead.py"
    out = subprocess.run([sys.executable, str(bench), "--tasks", "0", "8", "--repeat", "1", "--server",
                          str(tmp_path / "prefect")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.strip().splitlines()]
    assert [row["tasks"] for row in lines[:-1]] == [0, 8]
    assert all(row["cpu_s"] > 0 and row["server_cpu_s"] > 0 for row in lines[:-1])
    assert set(lines[-1]) == {"cpu_s_per_task", "cpu_s_at_zero"}
    pid = (tmp_path / "prefect" / "funnelrag-server.pid").read_text().strip()
    assert not Path(f"/proc/{pid}").exists()
