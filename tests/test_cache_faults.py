"""Nothing read from the cache is trusted blindly: the fault cases of an incremental night.

Night 1 builds a 300-page synthetic mirror's full dump; then, in a copy of that home, one file of
every kind of cache entry the next night reads (kept ingest pieces, the page memo, the window
token memo, the segment shards the segmentation memo names, cluster and passage token shards, both BM25
memos, passage index shards, the multistream index summary) gets a same-size byte flip, is cut to
half or is deleted; or every entry loses its digest manifest (entries of a release before them).
Each faulty night 2 publishes the content digest of a clean night 2, logs the path of every
kind's bad entry it read at WARNING, and leaves only entries with a digest manifest (an old one is
rebuilt when read, swept by retention when not). A rebuild in the same home after a flip in each
stage output reports *unchanged* against the clean version; each fault of a stage output is also
tested on its own in tests/test_verify.py.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from benchmarks.synth_dump import SAMPLE, write_mirror
from flows.corpus_build import CorpusBuildConfig
from flows.corpus_nightly import corpus_build_nightly
from funnelrag.store import cache_entries, entry_marker
from funnelrag.verify import DIGESTS_FILE, entry_files
from funnelrag.workspace import Workspace
from tasks.corpus.sharded import segment_memo as SM
from tasks.corpus.published import corpus_store

WIKI = "synwiki"
RUNNER = {"kind": "local", "workers": 2, "streams_per_piece": 1, "docs_per_shard": 40, "tokens_per_shard": 40_000}
# kind of entry → its directories (glob under the corpus cache). READ: what an adds-changes night
# reads; the shards' entries are keyed by tonight's ids (positional), so a night reads none of
# them, but it must not be misled by them either; a rebuild reads stage outputs (test below).
READ = {
    "ingest piece": "ingest-pieces/[0-9a-f]*",
    "page memo": "ingest-pieces/page-memo-*",
    "multistream index summary": "ingest-pieces/multistream-index-*",
    "window token memo": "tokens-memo-*",
    # what the segmentation memo reads: night 1's segment shard entries, which its manifest
    # (segment-shards/segment-memo-*, left intact so that it names them) lists; a fault in the
    # manifest itself makes a night cut every cluster (tests/test_segment_memo.py)
    "segmentation memo": "segment-shards/[0-9a-f]*",
    "BM25 cluster memo": "bm25-memo-clusters-*",
    "BM25 passage memo": "bm25-memo-passages-*",
}
NOT_READ = {
    "cluster token shard": "cluster-tokens/*",
    "passage token shard": "passage-tokens/*",
    "passage index shard": "passage-shards/*",
}


def _config(home: Path, data_mirror: Path, mirror: Path, **extra) -> CorpusBuildConfig:
    return CorpusBuildConfig.model_validate({
        "name": WIKI, "source": {"datasets": [], "wiki": WIKI, "mirror": str(mirror)}, "ingest": {"format": "mediawiki"},
        "clustering": {"max_tokens": 4096}, "gate": {"enabled": False}, "runner": RUNNER,
        "index": {"passage_shard_tokens": 60_000}, "workspace": {"home": home, "data_mirror": data_mirror}, **extra})


def _digest(home: Path) -> str:
    return corpus_store(Workspace(home), WIKI).read_manifest()["content_digest"]


def _largest(entry: Path) -> Path:
    """The entry's largest file (its data: a memo's values, a piece's pages) but the manifest."""
    return max(entry_files(entry), key=lambda p: (p.stat().st_size, p.name))


def _fault(path: Path, fault: str) -> None:
    if fault == "flip":   # one byte of the same size: what a bad disk or a stray write does
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
    elif fault == "truncate":
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
    else:
        path.unlink()


@pytest.fixture(scope="module")
def night_one(tmp_path_factory, data_mirror, prefect_harness):
    """A mirror with one adds-changes day, a home after night 1, and a clean night 2's digest."""
    root = tmp_path_factory.mktemp("faults")
    info = write_mirror(root / "mirror", 300, 1, seed=5, wiki=WIKI, sample=data_mirror / SAMPLE, edit_share=0.03,
                        merged=root / "merged")
    home = root / "night1"
    assert corpus_build_nightly(_config(home, data_mirror, root / "mirror"))["nightly"]["action"] == "full"
    clean = root / "clean"
    shutil.copytree(home, clean)
    second = corpus_build_nightly(_config(clean, data_mirror, root / "mirror"))
    assert second["nightly"]["action"] == "incremental"
    return root, home, _digest(clean), Path(info["merged"]["dump"])


def _warnings(caplog, capfd) -> str:
    """WARNING lines of this process (caplog) and of the pool's workers (their stderr)."""
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING) + capfd.readouterr().err


@pytest.mark.parametrize("fault", ["flip", "truncate", "delete"])
def test_a_bad_cache_entry_is_rebuilt_never_published(night_one, data_mirror, fault, caplog, capfd):
    root, night1, clean, _ = night_one
    home = root / f"night2-{fault}"
    shutil.copytree(night1, home)
    cache = home / "cache" / "corpus"
    faulty: dict[str, list[Path]] = {}
    (memo,) = cache.glob("segment-shards/segment-memo-*")   # it names every segment shard of night 1
    assert sorted(p for p, *_ in SM.listed_parts(memo)) == sorted(cache.glob(READ["segmentation memo"]))
    for kind, pattern in {**READ, **NOT_READ}.items():
        entries = [e for e in sorted(cache.glob(pattern)) if e.is_dir()]
        assert entries, f"night 1 left no {kind} ({pattern})"
        for entry in entries:
            _fault(_largest(entry), fault)
        faulty[kind] = entries
    with caplog.at_level(logging.WARNING, logger="funnelrag.verify"):
        night = corpus_build_nightly(_config(home, data_mirror, root / "mirror"))
    assert night["nightly"]["action"] == "incremental"
    assert _digest(home) == clean   # never a different current
    logged = _warnings(caplog, capfd)
    for kind in READ:
        assert any(f"cache entry {e} discarded" in logged for e in faulty[kind]), (kind, logged)
    for entry in cache_entries(cache):   # what is left verifies: rebuilt, or not read tonight and left alone
        assert (entry / DIGESTS_FILE).is_file(), entry


def test_entries_of_an_older_release_are_rebuilt_or_swept(night_one, data_mirror, caplog, capfd):
    """Entries without a digest manifest (written before entries recorded one) are treated as
    missing: the first night after the upgrade builds what it reads of them again and retention
    sweeps the rest, so the cache then holds only entries with a manifest."""
    root, night1, clean, _ = night_one
    home = root / "night2-upgrade"
    shutil.copytree(night1, home)
    cache = home / "cache" / "corpus"
    week_ago = time.time() - 7 * 86400
    for entry in cache_entries(cache):
        (entry / DIGESTS_FILE).unlink()
        os.utime(entry_marker(entry), (week_ago, week_ago))   # unused since: retention's age is 3 days
    with caplog.at_level(logging.WARNING, logger="funnelrag.verify"):
        night = corpus_build_nightly(_config(home, data_mirror, root / "mirror",
                                             retention={"cache_max_age_days": 3}))
    assert _digest(home) == clean
    assert "no digest manifest" in _warnings(caplog, capfd)
    assert night["retention"]["cache"]["entries"] > 0
    left = cache_entries(cache)
    assert left and all((entry / DIGESTS_FILE).is_file() for entry in left)


def test_a_rebuild_in_the_same_home_does_not_keep_a_bad_stage_output(night_one, data_mirror, caplog, capfd):
    """The fault run's last step: after a flip in each stage output, a build of the merged dump in
    the same home (its ingest runs; every later stage was a cache hit) rebuilds the flipped stages
    and reports *unchanged* against the clean night's version."""
    root, night1, clean, merged = night_one
    home = root / "rebuild"
    shutil.copytree(night1, home)
    assert corpus_build_nightly(_config(home, data_mirror, root / "mirror"))["nightly"]["action"] == "incremental"
    stages = [e for name in ("tokens", "cluster", "segment", "index") for e in (home / "cache" / "corpus" / name).iterdir()
              if e.is_dir() and not e.name.startswith(".")]
    for entry in stages:   # a new file (the published version keeps its link to the good bytes)
        path = _largest(entry)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01
        path.unlink()
        path.write_bytes(bytes(data))
    config = _config(home, data_mirror, root / "mirror").model_dump()
    config["source"] = {"datasets": [], "paths": [merged], "wiki": WIKI}
    summary = corpus_build_nightly(CorpusBuildConfig.model_validate(config))   # no mirror: source.paths
    assert summary["unchanged"] is True and _digest(home) == clean
    logged = _warnings(caplog, capfd)
    for name in ("tokens", "cluster", "segment", "index"):
        assert f"/cache/corpus/{name}/" in logged, (name, logged)
