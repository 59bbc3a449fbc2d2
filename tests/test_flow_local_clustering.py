"""``clustering.mode: local`` end to end on a synthetic mirror's dump: the first build (no current
version) runs the full algorithm; after a day of edits and new pages the local build keeps more of
yesterday's clusters than the full algorithm does, passes the same quality gate, names its base in
the manifest, and ``--verify`` rebuilds it without the cache from that base."""
from __future__ import annotations

from pathlib import Path

from benchmarks.synth_dump import SAMPLE, write_mirror
from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
from funnelrag.workspace import Workspace
from tasks.corpus.published import corpus_store

WIKI = "synwiki"
RUNNER = {"kind": "local", "workers": 2, "streams_per_piece": 2, "docs_per_shard": 100, "tokens_per_shard": 400_000}


def _config(home: Path, data_mirror: Path, dump: str, mode: str, **extra) -> CorpusBuildConfig:
    return CorpusBuildConfig.model_validate({
        "name": WIKI, "source": {"datasets": [], "paths": [dump]}, "ingest": {"format": "mediawiki"},
        "clustering": {"max_tokens": 4096, "mode": mode}, "gate": {"limit": 50}, "runner": RUNNER,
        "workspace": {"home": home, "data_mirror": data_mirror}, **extra})


def test_local_night_keeps_more_clusters_and_passes_the_gate(prefect_harness, tmp_path, data_mirror):
    info = write_mirror(tmp_path / "mirror", 400, 1, seed=11, wiki=WIKI, merged=tmp_path / "merged",
                        sample=data_mirror / SAMPLE, edit_share=0.02)
    home = tmp_path / "home"
    store = corpus_store(Workspace(home), WIKI)
    first = corpus_build_flow(_config(home, data_mirror, info["base"], "local"))
    assert first["clustering"] == {"clustering_local": 0, "base": None}      # nothing to follow: the full algorithm
    full = corpus_build_flow(_config(home, data_mirror, info["merged"]["dump"], "full"))
    assert "clustering" not in full and full["gate"]["passed"]
    store.set_current(first["version"])                                     # the same night again, local
    local = corpus_build_flow(_config(home, data_mirror, info["merged"]["dump"], "local"))
    assert local["gate"]["passed"] and store.current_version() == local["version"]
    assert local["clustering"]["clustering_local"] == 1 and local["clustering"]["base"] == first["version"]
    assert 0 < local["clustering"]["local_kept_clusters"] < first["counts"]["clusters"]
    assert local["survival"]["clusters_unchanged"] > full["survival"]["clusters_unchanged"]
    assert local["survival"]["clusters_unchanged"] >= local["clustering"]["local_kept_clusters"] / first["counts"]["clusters"]
    assert store.read_manifest(local["version"])["clustering_base"] == first["version"]
    assert "clustering_base" not in store.read_manifest(full["version"])

    verify = corpus_build_flow(_config(home, data_mirror, info["merged"]["dump"], "local", cache={"verify": True}))
    assert verify["verify"]["same"], verify["verify"]
