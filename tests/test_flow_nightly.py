"""corpus-build-nightly following a synthetic Wikimedia mirror served over HTTP (127.0.0.1): night 1
builds the full dump, night 2 applies the first adds-changes day, a day whose checksum does not
match fails the run with the file named and leaves ``current`` alone, the next night applies both
days (same content digest as a full build of the full dump holding the same page texts) after
four days without a build (retention removes the cache entries and the versions it no longer needs,
and keeps the base dump's pieces it patches), and a night with nothing new does no work."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from benchmarks.synth_dump import SAMPLE, write_mirror
from flows.corpus_build import CorpusBuildConfig
from flows.corpus_nightly import corpus_build_nightly
from funnelrag.store import cache_entries, entry_marker
from funnelrag.workspace import Workspace
from tasks.sources.dump_source import ChecksumMismatch
from tasks.corpus.published import corpus_store
from tests.mirror_server import serve

WIKI, DAY1, DAY2 = "synwiki", "20260102", "20260103"
RUNNER = {"kind": "local", "workers": 2, "streams_per_piece": 2, "docs_per_shard": 50, "tokens_per_shard": 200_000}


def _config(home: Path, data_mirror: Path, retention: dict | None = None, **source) -> CorpusBuildConfig:
    return CorpusBuildConfig.model_validate({
        "name": WIKI, "source": {"datasets": [], "wiki": WIKI, **source}, "ingest": {"format": "mediawiki"},
        "clustering": {"max_tokens": 4096}, "gate": {"enabled": False}, "runner": RUNNER,
        "workspace": {"home": home, "data_mirror": data_mirror}, "retention": retention or {}})


def _age_cache(root: Path, days: float) -> int:
    """Make every cache entry look unused for ``days`` (its marker's mtime): as if the nightly had
    not run for that long."""
    when = time.time() - days * 86400
    entries = cache_entries(root)
    for entry in entries:
        os.utime(entry_marker(entry), (when, when))
    return len(entries)


def _night_run(config: CorpusBuildConfig) -> tuple[dict, str, str]:
    """One night: its summary, and the flow run's state message and name as the API holds them."""
    from prefect.client.orchestration import get_client  # noqa: PLC0415  (heavy: prefect's client)

    state = corpus_build_nightly(config, return_state=True)
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert run.state.message == state.message
    return state.result(), state.message, run.name


def _digest(home: Path, version: str) -> str:
    return corpus_store(Workspace(home), WIKI).read_manifest(version)["content_digest"]


def _passages_of_unchanged_articles(home: Path, before: str, after: str) -> tuple[set, set, int]:
    """The ``(passage_id, title, text)`` rows of the articles whose title and text are the same in
    both versions, in each version, and how many such articles there are."""
    from data_contracts.corpus import DOCUMENTS, PASSAGES  # noqa: PLC0415  (this helper only)

    versions = corpus_store(Workspace(home), WIKI).versions_dir
    docs = [dict(zip(*DOCUMENTS.read(versions / v, columns=["title", "text"]).to_pydict().values())) for v in (before, after)]
    same = {t for t, x in docs[0].items() if docs[1].get(t) == x}
    rows = []
    for v in (before, after):
        table = PASSAGES.read(versions / v, columns=["passage_id", "title", "text"]).to_pydict()
        rows.append({r for r in zip(table["passage_id"], table["title"], table["text"]) if r[1] in same})
    return rows[0], rows[1], len(same)


def test_nightly_follows_the_mirror(prefect_harness, tmp_path, data_mirror):
    info = write_mirror(tmp_path / "mirror", 600, 2, seed=3, wiki=WIKI, merged=tmp_path / "merged",
                        sample=data_mirror / SAMPLE, edit_share=0.02)
    day1, day2 = (tmp_path / "mirror" / "other" / "incr" / WIKI / d for d in (DAY1, DAY2))
    (day2 / "status.txt").write_text("in-progress\n")
    home = tmp_path / "home"
    store = corpus_store(Workspace(home), WIKI)
    with serve(tmp_path / "mirror") as server:
        night = lambda: corpus_build_nightly(_config(home, data_mirror, mirror=server.url))  # noqa: E731
        first, message, name = _night_run(_config(home, data_mirror, mirror=server.url))
        assert first["nightly"]["action"] == "full" and first["dump"]["days"] == []
        assert message.startswith(f"full: published {first['version']}: ") and "documents" in message, message
        assert name == f"nightly-{WIKI}-full-{time.strftime('%Y%m%d', time.gmtime())}", name
        assert store.current_version() == first["version"]
        assert (home / "downloads" / "dumps" / WIKI / "20260101").is_dir()   # downloaded into the home

        second, message, name = _night_run(_config(home, data_mirror, mirror=server.url))
        assert second["nightly"]["action"] == "incremental" and second["nightly"]["days"] == [DAY1]
        tokenised = second["reused_texts"]["window_token_documents"]
        assert message.startswith(f"incremental: 1 day, {tokenised['built']:,} documents re-tokenised, "
                                  f"{tokenised['reused']:,} reused; published {second['version']}"), message
        assert name.startswith(f"nightly-{WIKI}-incremental-"), name
        assert second["nightly"]["waiting_days"] == [DAY2]
        assert store.read_manifest(second["version"])["dump"]["days"] == [DAY1]
        assert set(second["shards"]) >= {"ingest_pieces", "token_shards", "segment_shards", "cluster_token_shards"}
        pieces = second["shards"]["ingest_pieces"]   # the base dump's pieces with the day's revisions: none parsed
        assert pieces["built"] == 0 and pieces["patched"] > 0 and pieces["patched"] + pieces["reused"] > 1
        texts = dict(second["reused_texts"])
        clusters = texts.pop("segment_clusters")   # a cluster is segmented again when Algorithm 1 regroups it
        assert clusters["built"] > 0 and clusters["reused"] > 0, clusters
        for kind, counts in texts.items():   # only the day's edited and new pages are tokenized
            assert 0 < counts["built"] < counts["reused"], (kind, counts)
        assert store.current_version() == second["version"] != first["version"]
        # content ids: every passage of an article the day left alone keeps its id (the day edited and
        # added pages elsewhere, and Algorithm 1 regrouped clusters); the report says how much survived
        kept_before, kept_after, n_same = _passages_of_unchanged_articles(home, first["version"], second["version"])
        assert n_same > 100 and kept_before and kept_before == kept_after
        assert "survival" not in first
        survival = second["survival"]
        assert survival["passages_kept_ids"] >= 0.95 and survival["units_kept_ids"] > 0.5
        assert 0 < survival["clusters_unchanged"] <= 1 and 0 < survival["units_unchanged"] <= survival["units_kept_ids"]
        assert survival["passages_before"] == first["counts"]["passages"]

        (day2 / "status.txt").write_text("done\n")
        good = (day2 / "md5sums.txt").read_text()
        (day2 / "md5sums.txt").write_text("0" * 32 + good[32:])
        with pytest.raises(ChecksumMismatch, match=f"{WIKI}-{DAY2}-pages-meta-hist-incr.xml.bz2"):
            night()
        assert store.current_version() == second["version"]

        (day2 / "md5sums.txt").write_text(good)
        aged = _age_cache(home / "cache" / "corpus", 4)   # retention: what night 3 does not use goes
        third = corpus_build_nightly(_config(home, data_mirror, mirror=server.url,
                                             retention={"cache_max_age_days": 3, "keep_versions": 2}))
        assert third["shards"]["ingest_pieces"]["patched"] > 0   # the base dump's pieces were kept: used tonight
        assert third["retention"]["versions_removed"] == [first["version"]]
        assert store.versions() == sorted([second["version"], third["version"]])
        assert 0 < third["retention"]["cache"]["entries"] < aged
        assert third["nightly"]["days"] == [DAY1, DAY2] and store.current_version() == third["version"]
        fetch = third["nightly"]["fetch"]
        assert fetch["apply"]["replaced"] > 0 and [d["date"] for d in fetch["days"]] == [DAY1, DAY2]
        assert [d["from_memo"] for d in fetch["days"]] == [True, False]   # day 1 was parsed by night 2
        assert sum(d["skipped"].get("other_namespace", 0) for d in fetch["days"]) > 0   # other namespaces: counted skips

        requests = len(server.requests)
        idle, message, name = _night_run(_config(home, data_mirror, mirror=server.url))
        assert idle["nightly"]["action"] == "nothing" and "shards" not in idle
        assert message == idle["nightly"]["reason"] and message.startswith("nothing new")
        assert name.startswith(f"nightly-{WIKI}-nothing-")
        assert idle["version"] == third["version"] == store.current_version()
        assert all("pages-" not in path for path, _ in server.requests[requests:])   # no download

    scratch = corpus_build_nightly(_config(tmp_path / "scratch", data_mirror, paths=[info["merged"]["dump"]]))
    assert _digest(home, third["version"]) == _digest(tmp_path / "scratch", scratch["version"])
    assert _digest(home, third["version"]) != _digest(home, second["version"])
    summary = json.loads((Path(third["path"]) / "manifest.json").read_text())
    assert summary["dump"]["base"] == "20260101" and summary["dump"]["base_file"].startswith(f"{WIKI}-20260101-")
