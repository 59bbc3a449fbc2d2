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


def _versions(home: Path, manifests: dict[str, dict], current: str) -> None:
    """Manifests of published versions (nothing else) and the ``current`` pointer of corpus ``WIKI``."""
    import json  # noqa: PLC0415

    store = corpus_store(Workspace(home), WIKI)
    for version, manifest in manifests.items():
        (store.versions_dir / version).mkdir(parents=True)
        (store.versions_dir / version / "manifest.json").write_text(json.dumps(manifest))
    (store.root / "current").write_text(current + "\n")


def test_which_version_a_local_build_follows(tmp_path, data_mirror):
    from flows.corpus_build import clustering_base  # noqa: PLC0415

    home = tmp_path / "home"
    ws = Workspace(home)
    versions = corpus_store(ws, WIKI).versions_dir

    def base(mode="local", **extra):
        return clustering_base(_config(home, data_mirror, "x.xml.bz2", mode, **extra), ws)

    assert base() is None                                              # no version yet: the full algorithm
    _versions(home, {"v1": {"dump": {"base": "20260101", "days": []}},
                     "v2": {"dump": {"base": "20260101", "days": ["20260102"]}, "clustering_base": "v1"}}, "v2")
    assert base() == versions / "v2" and base("full") is None
    assert base(cache={"read": False}) is None                          # --no-cache: full
    assert base(cache={"verify": True}) == versions / "v1"              # --verify: current's own base
    night = {"datasets": [], "paths": ["x.xml.bz2"], "dump": {"base": "20260101", "days": ["20260102", "20260103"]}}
    assert base(source=night) == versions / "v2"                        # an adds-changes night: local
    assert base(source={**night, "dump": {"base": "20260201", "days": []}}) is None   # a new full dump: full
    (versions / "v1" / "manifest.json").unlink()                        # the base is gone: verify runs full
    assert base(cache={"verify": True}) is None
