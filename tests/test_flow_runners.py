"""The runner switch: corpus-build through local processes and through a Dask client of a
2-worker LocalCluster publishes byte-identical artifacts (real enwiki sample, re-packed as a
multistream dump so that ingest runs in pieces; segment by cluster ranges and a passage index in
token-budget shards, so every per-shard stage runs on the runner), and Prefect sees one task run
per stage, never one per shard."""
from __future__ import annotations

import bz2
import json
import logging
from pathlib import Path

import pytest

from benchmarks.synth_dump import repack
from flows.corpus_build import enwiki_sample_config
from flows.corpus_nightly import corpus_build_nightly
from flows.runners import DaskShardPool, LocalShardPool, RunnerConfig, ShardRunner
from funnelrag.datasets import resolve


def _manifest(summary) -> dict:
    return json.loads((Path(summary["path"]) / "manifest.json").read_text())


def test_runner_config_picks_the_pool():
    assert isinstance(ShardRunner(RunnerConfig(workers=2)).pool("tokens"), LocalShardPool)
    assert ShardRunner(RunnerConfig(workers=2)).pool("tokens").workers == 2
    remote = ShardRunner(RunnerConfig(kind="dask", address="tcp://scheduler:8786"))
    assert isinstance(remote.pool("tokens"), DaskShardPool)


def _stage_task_runs(flow_run_id: str) -> dict[str, list[str]]:
    """``{task run name: [its log lines]}`` of one flow run, read from Prefect's API."""
    from prefect.client.orchestration import get_client  # noqa: PLC0415
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterTaskRunId  # noqa: PLC0415
    from prefect.logging.handlers import APILogHandler  # noqa: PLC0415

    APILogHandler().flush()   # the run's last records, still queued in this process
    with get_client(sync_client=True) as client:
        runs = {r.id: r for r in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))}   # the API may list one twice
        return {r.name: [g.message for g in client.read_logs(
            log_filter=LogFilter(task_run_id=LogFilterTaskRunId(any_=[r.id])))] for r in runs.values()}


def test_local_and_dask_builds_are_byte_identical_and_show_one_task_run_per_stage(prefect_harness, tmp_path,
                                                                                 data_mirror):
    dump = tmp_path / "enwiki-sample-multistream.xml.bz2"
    repack(bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes()), dump, pages_per_stream=10)
    summaries = {}
    task_runs = logging.getLogger("prefect.task_runs")   # the tests' Prefect logs WARNING and up only
    level = task_runs.level
    task_runs.setLevel(logging.INFO)
    try:
        for kind in ("local", "dask"):
            home = tmp_path / kind
            home.mkdir()
            cfg = enwiki_sample_config(workspace={"home": home, "data_mirror": data_mirror},
                                       source={"datasets": [], "paths": [dump]},
                                       runner={"kind": kind, "workers": 2, "streams_per_piece": 3,
                                               "docs_per_shard": 30, "tokens_per_shard": 100_000},
                                       index={"passage_shard_tokens": 250_000})
            summaries[kind] = corpus_build_nightly(cfg)
    finally:
        task_runs.setLevel(level)
    local, dask = (_manifest(summaries[k]) for k in ("local", "dask"))
    assert local["content_digest"] == dask["content_digest"]
    assert local["files"] == dask["files"]
    assert "index/passages.bm25/shard-00002/data.csc.index.npy" in local["files"]
    assert summaries["dask"]["shards"]["segment_shards"]["built"] > 1
    assert summaries["dask"]["shards"]["cluster_token_shards"]["built"] > 1
    assert summaries["local"]["counts"] == summaries["dask"]["counts"]
    assert summaries["local"]["counts"]["documents"] > 50
    for kind, where in (("local", "on 2 local worker process(es)"), ("dask", "on Dask (a LocalCluster of 2 workers)")):
        runs = _stage_task_runs(summaries[kind]["prefect_flow_run_id"])
        stages = sorted(name.rsplit("-", 1)[0] for name in runs)
        assert stages == ["cluster", "gate", "index", "ingest", "publish", "segment", "tokens"], runs.keys()
        for stage in ("ingest", "tokens", "segment", "index"):
            lines = next(lines for name, lines in runs.items() if name.rsplit("-", 1)[0] == stage)
            shards = [line for line in lines if line.startswith(f"stage {stage}: ") and where in line]
            assert len(shards) == 1 and int(shards[0].split(": ")[1].split()[0]) > 1, (stage, lines)


def test_nightly_rebuild_reuses_unchanged_shards(prefect_harness, tmp_path, data_mirror):
    """Unchanged dump: every shard reused. Tonight's dump with one changed page: one ingest piece,
    one token shard, one segment shard, one cluster-index token shard and the statistics of one passage shard rebuilt (every
    passage shard re-indexed: the global statistics changed), and the same content digest as a
    from-scratch build."""
    xml = bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes())
    night1 = tmp_path / "n1" / "enwiki-20260101-pages-articles-multistream.xml.bz2"
    night2 = tmp_path / "n2" / "enwiki-20260102-pages-articles-multistream.xml.bz2"
    night1.parent.mkdir()
    night2.parent.mkdir()
    repack(xml, night1, pages_per_stream=10)
    at = xml.index(b"</text>", xml.index(b"<title>Alabama</title>"))
    repack(xml[:at] + b" One more sentence tonight." + xml[at:], night2, pages_per_stream=10)
    runner = {"kind": "local", "workers": 2, "streams_per_piece": 3, "docs_per_shard": 30, "tokens_per_shard": 100_000}

    def build(home, dump):
        home.mkdir(exist_ok=True)
        return corpus_build_nightly(enwiki_sample_config(workspace={"home": home, "data_mirror": data_mirror},
                                                         source={"datasets": [], "paths": [dump]}, runner=runner,
                                                         index={"passage_shard_tokens": 250_000}))

    first = build(tmp_path / "home", night1)
    assert first["shards"]["ingest_pieces"] == {"built": 7, "reused": 0}
    assert first["shards"]["token_shards"]["reused"] == first["shards"]["segment_shards"]["reused"] == 0
    again = build(tmp_path / "home", night1)
    assert again["shards"]["ingest_pieces"] == {"built": 0, "reused": 7}
    assert again["shards"]["token_shards"] == {"built": 0, "reused": first["shards"]["token_shards"]["built"]}
    p = first["shards"]["passage_token_shards"]["built"]
    assert p > 2 and again["shards"]["passage_token_shards"] == again["shards"]["passage_index_shards"] == {"built": 0, "reused": p}
    tonight = build(tmp_path / "home", night2)
    assert tonight["shards"]["ingest_pieces"] == {"built": 1, "reused": 6}
    assert tonight["shards"]["token_shards"]["built"] == 1
    assert tonight["shards"]["segment_shards"]["built"] == 1
    n = first["shards"]["cluster_token_shards"]["built"]
    assert n > 1 and tonight["shards"]["cluster_token_shards"] == {"built": 1, "reused": n - 1}
    assert tonight["shards"]["passage_token_shards"] == {"built": 1, "reused": p - 1}   # the shard of Alabama's cluster
    assert tonight["shards"]["passage_index_shards"] == {"built": p, "reused": 0}       # global df/N/avgdl changed
    scratch = build(tmp_path / "scratch", night2)
    assert _manifest(tonight)["content_digest"] == _manifest(scratch)["content_digest"] != _manifest(first)["content_digest"]


def test_local_workers_fork_from_one_preloaded_forkserver_and_run_plain_python(monkeypatch):
    """Each worker forks from a forkserver that imported the stages (not from this process, not
    spawned bare), gets this process's environment as it was when its stage's pool started and
    the build's young threshold, and runs its shards without Prefect; each stage's pool has
    workers of its own, forked from the same forkserver, which lives as long as this process."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from flows.runners import pool_processes  # noqa: PLC0415
    from tests.pool_probe import worker_facts  # noqa: PLC0415  (a module without Prefect: the workers import it)
    from funnelrag.memory import YOUNG_COLLECTION_OBJECTS  # noqa: PLC0415

    if not sys.platform.startswith("linux"):
        pytest.skip("the forkserver is read from Linux's process table")

    def stage(name: str) -> list[dict]:
        with ShardRunner(RunnerConfig(workers=2)) as runner, runner.pool("facts") as pool:
            facts = [f.result() for f in [pool.submit(worker_facts, name) for _ in range(4)]]
        assert pool.shards == 4 and not pool_processes()[1]   # the stage's workers ended with its pool
        return facts

    monkeypatch.setenv("FUNNELRAG_TEST_WORKER_ENV", "first pool")
    first = stage("FUNNELRAG_TEST_WORKER_ENV")
    monkeypatch.setenv("FUNNELRAG_TEST_WORKER_ENV", "second pool")
    second = stage("FUNNELRAG_TEST_WORKER_ENV")
    for run, want in ((first, "first pool"), (second, "second pool")):
        assert all(f["preloaded"] and f["env"] == want and f["young"] == YOUNG_COLLECTION_OBJECTS for f in run), run
        assert not any(f["prefect"] for f in run), run
        assert {f["ppid"] for f in run} != {os.getpid()} and len({f["ppid"] for f in run}) == 1, run
    assert first[0]["ppid"] == second[0]["ppid"] == pool_processes()[0].pid   # one forkserver
    assert not {f["pid"] for f in first} & {f["pid"] for f in second}


def test_a_workers_warning_is_logged_once_by_the_build_process(caplog, capfd):
    """A warning a shard logs in a local worker (a cache entry discarded) reaches the build
    process's log, where Prefect's run logger takes it, once; the worker's stderr keeps its lines
    below WARNING (a shard's progress)."""
    import logging  # noqa: PLC0415
    import os  # noqa: PLC0415

    from tests.pool_probe import warn_and_tell  # noqa: PLC0415  (a module without Prefect: the workers import it)

    logging.getLogger("funnelrag").setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.INFO, logger="funnelrag.verify"):
            with ShardRunner(RunnerConfig(workers=2)) as runner, runner.pool("warn") as pool:
                pids = [f.result() for f in [pool.submit(warn_and_tell, f"entry {i}") for i in range(3)]]
    finally:
        logging.getLogger("funnelrag").setLevel(logging.NOTSET)
    assert os.getpid() not in pids
    here = [r for r in caplog.records if r.name == "funnelrag.verify"]
    assert sorted(r.getMessage() for r in here if r.levelno == logging.WARNING) == [f"discarded: entry {i}" for i in range(3)]
    assert not [r for r in here if r.levelno < logging.WARNING]   # progress stays in the worker
    err = capfd.readouterr().err
    assert "discarded: entry" not in err


def slow_cache_entry(cache_dir: str, name: str) -> None:
    """A shard that takes 60 s to write its cache entry (it announces its start with a file)."""
    import time  # noqa: PLC0415

    from tasks.corpus.sharded.shards import put_cached  # noqa: PLC0415

    def write(tmp: Path) -> None:
        (Path(cache_dir) / f"started-{name}").touch()
        time.sleep(60)
        (tmp / "COMPLETE").write_text("done\n")

    put_cached(Path(cache_dir) / name, write)


def test_sigterm_stops_in_flight_shards_at_once_and_cancels_queued_ones(prefect_harness, tmp_path):
    """SIGTERM to a flow run whose two workers are each inside a shard, a third shard queued: the
    flow ends within seconds (a pool's own shutdown waits for every in-flight shard), the workers are
    gone, no cache entry is written (their temp directories carry their pids: swept), the queued
    shard never starts."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from prefect import flow  # noqa: PLC0415

    from data_contracts.base import parse_temp_name  # noqa: PLC0415
    from funnelrag.reaper import pid_alive, sweep_stale_temp_dirs  # noqa: PLC0415

    @flow
    def three_shards(cache_dir: str) -> None:
        with ShardRunner(RunnerConfig(workers=2)) as runner, runner.pool("slow") as pool:
            for f in [pool.submit(slow_cache_entry, cache_dir, f"k{i}") for i in range(3)]:
                f.result()

    sent: list[float] = []
    workers_gone: list[float] = []

    def interrupt() -> None:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = [parse_temp_name(p.name).pid for p in tmp_path.iterdir() if parse_temp_name(p.name)]
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGTERM)
        while any(pid_alive(pid) for pid in workers) and time.monotonic() < sent[0] + 60:
            time.sleep(0.05)
        workers_gone.append(time.monotonic() - sent[0])

    # a Python SIGTERM handler under Prefect's: after its crash handling Prefect re-sends the signal
    # to the handler it found (the default one would end the test session)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        watcher = threading.Thread(target=interrupt, daemon=True)
        watcher.start()
        with pytest.raises(BaseException) as stopped:
            three_shards(str(tmp_path))
        stop_s = time.monotonic() - sent[0]
        watcher.join(60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert type(stopped.value).__name__ == "TerminationSignal", stopped.value
    print(f"\nSIGTERM → both in-flight workers gone in {workers_gone[0]:.2f} s, flow call returned in {stop_s:.1f} s")
    assert workers_gone[0] < 5.0 and stop_s < 60   # then Prefect's crash report (API calls on a loaded box)
    temps = [p for p in tmp_path.iterdir() if parse_temp_name(p.name)]
    assert len(temps) == 2 and not any(pid_alive(parse_temp_name(p.name).pid) for p in temps), temps
    assert len([p for p in tmp_path.iterdir() if not parse_temp_name(p.name)]) == 2   # 2 started, no entry
    assert sorted(sweep_stale_temp_dirs(tmp_path)) == sorted(temps) and not any(tmp_path.glob(".tmp-*"))
