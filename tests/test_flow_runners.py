"""The runner switch: corpus-build through local processes and through prefect-dask's
DaskTaskRunner on a 2-worker LocalCluster publishes byte-identical artifacts (real enwiki sample,
re-packed as a multistream dump so that ingest runs in pieces; segment by cluster ranges and a
passage index in token-budget shards, so every per-shard stage runs on the runner)."""
from __future__ import annotations

import bz2
import json
from pathlib import Path

import pytest
from prefect.context import get_settings_context
from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from benchmarks.synth_dump import repack
from flows.corpus_build import enwiki_sample_config
from flows.corpus_nightly import corpus_build_nightly
from flows.runners import RunnerConfig, _settings_with_api_url, build_task_runner
from funnelrag.datasets import resolve


def _manifest(summary) -> dict:
    return json.loads((Path(summary["path"]) / "manifest.json").read_text())


def test_runner_config_picks_the_task_runner():
    from prefect.task_runners import ProcessPoolTaskRunner  # noqa: PLC0415
    from prefect_dask import DaskTaskRunner  # noqa: PLC0415

    assert isinstance(build_task_runner(RunnerConfig(workers=2)), ProcessPoolTaskRunner)
    remote = build_task_runner(RunnerConfig(kind="dask", address="tcp://scheduler:8786"))
    assert isinstance(remote, DaskTaskRunner) and remote.address == "tcp://scheduler:8786"
    local = build_task_runner(RunnerConfig(kind="dask", workers=2))
    assert local.address is None and local.cluster_kwargs["n_workers"] == 2


def test_shard_calls_carry_the_parent_api_url_without_rebuilding_settings():
    """Each submission runs under settings whose API URL is the parent's; they are made once per
    URL and base settings, and made again when the base settings change."""
    url = "http://127.0.0.1:4299/api"
    with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 3}):
        with _settings_with_api_url(url):
            first = get_settings_context().settings
            assert PREFECT_API_URL.value() == url and PREFECT_CLIENT_MAX_RETRIES.value() == 3
        with _settings_with_api_url(url):
            assert get_settings_context().settings is first
        assert PREFECT_API_URL.value() != url
        with temporary_settings(updates={PREFECT_CLIENT_MAX_RETRIES: 4}), _settings_with_api_url(url):
            assert get_settings_context().settings is not first
            assert PREFECT_API_URL.value() == url and PREFECT_CLIENT_MAX_RETRIES.value() == 4


def test_dask_local_cluster_build_equals_local_processes(prefect_harness, tmp_path, data_mirror):
    dump = tmp_path / "enwiki-sample-multistream.xml.bz2"
    repack(bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes()), dump, pages_per_stream=10)
    summaries = {}
    for kind in ("local", "dask"):
        home = tmp_path / kind
        home.mkdir()
        cfg = enwiki_sample_config(workspace={"home": home, "data_mirror": data_mirror},
                                   source={"datasets": [], "paths": [dump]},
                                   runner={"kind": kind, "workers": 2, "streams_per_piece": 3, "docs_per_shard": 30,
                                           "tokens_per_shard": 100_000},
                                   index={"passage_shard_tokens": 250_000})
        summaries[kind] = corpus_build_nightly(cfg)
    local, dask = (_manifest(summaries[k]) for k in ("local", "dask"))
    assert local["content_digest"] == dask["content_digest"]
    assert local["files"] == dask["files"]
    assert "index/passages.bm25/shard-00002/data.csc.index.npy" in local["files"]
    assert summaries["dask"]["shards"]["segment_shards"]["built"] > 1
    assert summaries["dask"]["shards"]["cluster_token_shards"]["built"] > 1
    assert summaries["local"]["counts"] == summaries["dask"]["counts"]
    assert summaries["local"]["counts"]["documents"] > 50


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
    p = first["shards"]["passage_stats_shards"]["built"]
    assert p > 2 and again["shards"]["passage_stats_shards"] == again["shards"]["passage_index_shards"] == {"built": 0, "reused": p}
    tonight = build(tmp_path / "home", night2)
    assert tonight["shards"]["ingest_pieces"] == {"built": 1, "reused": 6}
    assert tonight["shards"]["token_shards"]["built"] == 1
    assert tonight["shards"]["segment_shards"]["built"] == 1
    n = first["shards"]["cluster_token_shards"]["built"]
    assert n > 1 and tonight["shards"]["cluster_token_shards"] == {"built": 1, "reused": n - 1}
    assert tonight["shards"]["passage_stats_shards"] == {"built": 1, "reused": p - 1}   # the shard of Alabama's cluster
    assert tonight["shards"]["passage_index_shards"] == {"built": p, "reused": 0}       # global df/N/avgdl changed
    scratch = build(tmp_path / "scratch", night2)
    assert _manifest(tonight)["content_digest"] == _manifest(scratch)["content_digest"] != _manifest(first)["content_digest"]


def worker_facts(name: str) -> dict:
    """What a pool worker sees: its parent, whether it forked from the preloaded forkserver, the
    parent's environment variable ``name``, and its young collection threshold."""
    import gc  # noqa: PLC0415
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from prefect.client.orchestration import get_client  # noqa: PLC0415
    from prefect.context import FlowRunContext  # noqa: PLC0415

    from flows.runners import _WORKER_CLIENT  # noqa: PLC0415

    kept = _WORKER_CLIENT[0].client if _WORKER_CLIENT else None
    return {"pid": os.getpid(), "ppid": os.getppid(), "preloaded": "flows.pool_worker" in sys.modules,
            "env": os.environ.get(name), "young": gc.get_threshold()[0],
            "kept_client": kept is not None and get_client(sync_client=True) is kept
            and FlowRunContext.get().client is kept, "api": str(kept.api_url) if kept is not None else None}


def test_local_workers_fork_from_a_preloaded_forkserver_that_stops_with_the_pool(prefect_harness, monkeypatch):
    """Each worker forks from a forkserver that imported the stages (not from this process, not
    spawned bare), gets this process's environment and the pool initializer's threshold, and runs
    every task with the one API client it kept from its start, on the flow run's API; the
    forkserver is gone once the flow's pool closed, and the next pool starts a new one."""
    import os  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from prefect import flow  # noqa: PLC0415

    from flows.runners import _forkserver_pid, submitter  # noqa: PLC0415
    from funnelrag.memory import YOUNG_COLLECTION_OBJECTS  # noqa: PLC0415

    if not sys.platform.startswith("linux"):
        pytest.skip("the forkserver's pid is read from the stdlib's Linux forkserver")

    @flow(task_runner=build_task_runner(RunnerConfig(workers=2)))
    def facts(name: str) -> list[dict]:
        submit = submitter()
        return [f.result() for f in [submit(worker_facts, name) for _ in range(4)]]

    api = str(PREFECT_API_URL.value()).rstrip("/")
    monkeypatch.setenv("FUNNELRAG_TEST_WORKER_ENV", "first pool")
    first = facts("FUNNELRAG_TEST_WORKER_ENV")
    assert _forkserver_pid() is None
    monkeypatch.setenv("FUNNELRAG_TEST_WORKER_ENV", "second pool")
    second = facts("FUNNELRAG_TEST_WORKER_ENV")
    for run, want in ((first, "first pool"), (second, "second pool")):
        assert all(f["preloaded"] and f["env"] == want and f["young"] == YOUNG_COLLECTION_OBJECTS for f in run), run
        assert all(f["kept_client"] and f["api"].rstrip("/") == api for f in run), run
        assert {f["ppid"] for f in run} != {os.getpid()} and len({f["ppid"] for f in run}) == 1, run
        assert not Path(f"/proc/{run[0]['ppid']}").exists()   # the forkserver ended and was waited for
    assert first[0]["ppid"] != second[0]["ppid"]


def slow_cache_entry(cache_dir: str, name: str) -> None:
    """A shard that takes 60 s to write its cache entry (it announces its start with a file)."""
    import time  # noqa: PLC0415

    from tasks.corpus.shards import put_cached  # noqa: PLC0415

    def write(tmp: Path) -> None:
        (Path(cache_dir) / f"started-{name}").touch()
        time.sleep(60)
        (tmp / "COMPLETE").write_text("done\n")

    put_cached(Path(cache_dir) / name, write)


def test_sigterm_stops_in_flight_shards_at_once_and_cancels_queued_ones(prefect_harness, tmp_path):
    """SIGTERM to a flow run whose two workers are each inside a shard, a third shard queued: the
    flow ends within seconds (Prefect's own exit waits for every in-flight task), the workers are
    gone, no cache entry is written (their temp directories carry their pids: swept), the queued
    shard never starts."""
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from prefect import flow  # noqa: PLC0415

    from data_contracts.base import parse_temp_name  # noqa: PLC0415
    from flows.runners import submitter  # noqa: PLC0415
    from funnelrag.reaper import pid_alive, sweep_stale_temp_dirs  # noqa: PLC0415

    @flow(task_runner=build_task_runner(RunnerConfig(workers=2)))
    def three_shards(cache_dir: str) -> None:
        submit = submitter()
        for f in [submit(slow_cache_entry, cache_dir, f"k{i}") for i in range(3)]:
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
