"""Versioned store and content-keyed stage cache: atomic publish, `current` only after
validation, cache keyed by content (not path), killed runs rebuilt."""
import json
import os
import subprocess
import sys
import time

import pytest

from funnelrag.store import ArtifactStore, StageCache, cache_entries, entry_marker, mark_used, prune_cache
from funnelrag.verify import DIGESTS_FILE


def _build_writing(text, calls):
    def build(out):
        calls.append(text)
        (out / "a.txt").write_text(text)
        return {"n": len(text)}
    return build


def test_cache_hits_on_same_content_and_misses_on_changed_content(tmp_path):
    cache = StageCache(tmp_path / "cache")
    src = tmp_path / "input.txt"
    calls = []
    for content in ("v1", "v1", "v2"):
        src.write_text(content)  # same path, content may change: the key must follow content
        from data_contracts.base import sha256_file
        key = StageCache.key("s", "1", {"k": 1}, {"input": sha256_file(src)})
        res = cache.run("s", key, _build_writing(src.read_text(), calls))
        assert (res.path / "a.txt").read_text() == content
    assert calls == ["v1", "v2"]


def test_key_depends_on_config_version_and_inputs():
    base = StageCache.key("s", "1", {"k": 1}, {"x": "a"})
    assert base == StageCache.key("s", "1", {"k": 1}, {"x": "a"})
    assert base != StageCache.key("s", "2", {"k": 1}, {"x": "a"})
    assert base != StageCache.key("s", "1", {"k": 2}, {"x": "a"})
    assert base != StageCache.key("s", "1", {"k": 1}, {"x": "b"})


def test_killed_stage_is_rebuilt_and_failure_leaves_nothing(tmp_path):
    cache = StageCache(tmp_path)
    partial = tmp_path / "s" / "key1"
    partial.mkdir(parents=True)
    (partial / "a.txt").write_text("half")  # no COMPLETE marker: a killed run
    calls = []
    res = cache.run("s", "key1", _build_writing("full", calls))
    assert calls == ["full"] and (res.path / "a.txt").read_text() == "full" and not res.cache_hit

    def boom(out):
        (out / "a.txt").write_text("x")
        raise RuntimeError("stage failed")
    with pytest.raises(RuntimeError):
        cache.run("s", "key2", boom)
    assert not (tmp_path / "s" / "key2").exists()
    assert [p.name for p in (tmp_path / "s").iterdir()] == ["key1"]


def test_publish_moves_current_only_after_validation(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    f = tmp_path / "f.txt"
    f.write_text("one")
    v1 = store.publish("v1", {"f.txt": f}, {"config": {"a": 1}}, validate=lambda p: None)
    assert store.current_version() == "v1" and (v1 / "f.txt").read_text() == "one"
    manifest = json.loads((v1 / "manifest.json").read_text())
    assert manifest["files"]["f.txt"]["bytes"] == 3 and manifest["config"] == {"a": 1}

    g = tmp_path / "g.txt"
    g.write_text("two")

    def reject(path):
        raise ValueError("validation failed")
    with pytest.raises(ValueError):
        store.publish("v2", {"f.txt": g}, {}, validate=reject)
    assert store.current_version() == "v1" and store.versions() == ["v1"]
    assert not any(p.name.startswith(".staging") for p in store.versions_dir.iterdir())

    store.publish("v3", {"f.txt": g}, {}, validate=lambda p: None)
    assert store.current_version() == "v3" and store.versions() == ["v1", "v3"]  # previous kept
    with pytest.raises(FileExistsError):
        store.publish("v3", {"f.txt": g}, {}, validate=lambda p: None)
    store.verify()
    (store.current_dir() / "f.txt").unlink()
    with pytest.raises(ValueError, match="missing"):
        store.verify()


def test_publish_takes_known_digests_and_verify_still_reads_the_files(tmp_path):
    from data_contracts.base import sha256_file
    cache = StageCache(tmp_path / "cache")
    res = cache.run("s", "k", _build_writing("cached", []))
    store = ArtifactStore(tmp_path / "store")
    other = tmp_path / "other.txt"
    other.write_text("not in the cache")
    v1 = store.publish("v1", {"a.txt": res.path / "a.txt", "other.txt": other}, {}, validate=lambda p: None,
                       digests=res.files)
    files = json.loads((v1 / "manifest.json").read_text())["files"]
    assert files["a.txt"]["sha256"] == res.files["a.txt"] == sha256_file(v1 / "a.txt")
    assert files["other.txt"]["sha256"] == sha256_file(other)   # not given: read
    store.verify()
    store.publish("v2", {"a.txt": res.path / "a.txt"}, {}, validate=lambda p: None, digests={"a.txt": "0" * 64})
    with pytest.raises(ValueError, match="a.txt does not match"):
        store.verify()   # a wrong digest given is caught by the reader's check


def test_no_version_published_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="build-corpus"):
        ArtifactStore(tmp_path).current_dir()


def test_version_ids_sort_in_time_and_never_collide(tmp_path):
    """Two publishes of identical content in the same clock tick (a fully cached re-run) get distinct names."""
    store = ArtifactStore(tmp_path / "store")
    f = tmp_path / "f.txt"
    f.write_text("same")
    t = 1_795_000_000.25
    first = store.new_version_id("ab12cd34ef", now=t)
    assert first == "20261118T110640.250000Z-ab12cd34"
    store.publish(first, {"f.txt": f}, {}, validate=lambda p: None)
    second = store.new_version_id("ab12cd34ef", now=t)  # same microsecond, same digest
    assert second == first + "-2"
    store.publish(second, {"f.txt": f}, {}, validate=lambda p: None)
    later = store.new_version_id("00000000", now=t + 1e-6)
    assert store.versions() == [first, second] and sorted([first, second, later])[-1] == later



def _age(path, days, now):
    os.utime(path, (now - days * 86400, now - days * 86400))


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_cache_retention_removes_what_no_build_used_for_the_age(tmp_path):
    """Entries of every kind (stage, ingest piece, memo at the top, passage index shard) go when
    unused past the age; a hit refreshes an old entry; bytes a version still links are not
    counted as freed; a killed removal's directory is swept."""
    now = time.time()
    root = tmp_path / "cache"
    cache = StageCache(root)
    old = cache.run("index", "k-old", _build_writing("old index", []))
    hit = cache.run("index", "k-hit", _build_writing("hit", []))
    fresh = cache.run("index", "k-fresh", _build_writing("fresh", []))
    piece = root / "ingest-pieces" / "p1"
    piece.mkdir(parents=True)
    (piece / "piece.json").write_text("{}")
    (piece / "rows.parquet").write_bytes(b"x" * 100)
    memo = root / "bm25-memo-passages-abc"
    memo.mkdir()
    (memo / "COMPLETE").write_text("1\n")
    (memo / "keys.npy").write_bytes(b"y" * 50)
    shard = root / "passage-shards" / "s1"
    shard.mkdir(parents=True)
    (shard / "params.index.json").write_text("{}")
    killed = root / "index" / f".tmp-{_dead_pid()}-removed.k-gone"
    killed.mkdir()
    dead = _dead_pid()
    killed_memo = [root / f".tmp-{dead}-bm25-memo-passages-abc", root / f".tmp-{dead}-removed.bm25-memo-x"]   # in the root
    for d in killed_memo:
        d.mkdir()
    for entry in (old.path, hit.path, piece, memo, shard):
        _age(entry_marker(entry), 4, now)
    assert len(cache_entries(root)) == 6 and memo in cache_entries(root)
    version = tmp_path / "version"
    version.mkdir()
    os.link(old.path / "a.txt", version / "a.txt")   # a published version links the old stage output
    unlinked = (old.path / "COMPLETE").stat().st_size + (old.path / DIGESTS_FILE).stat().st_size + 2 + 100 + 2 + 50

    assert cache.run("index", "k-hit", _build_writing("never built", [])).cache_hit   # a hit: used now
    mark_used(shard)
    report = prune_cache(root, 3 * 86400)
    assert sorted(report.removed) == ["bm25-memo-passages-abc", "index/k-old", "ingest-pieces/p1"]
    assert report.entries == 3 and report.bytes_freed == unlinked
    assert not old.path.exists() and hit.path.exists() and fresh.path.exists() and shard.exists()
    assert (version / "a.txt").read_text() == "old index"   # the version keeps its file
    assert not killed.exists() and not any(d.exists() for d in killed_memo)
    assert prune_cache(root, 3 * 86400).entries == 0
    with pytest.raises(ValueError):
        prune_cache(root, 0)


def test_version_retention_keeps_the_newest_and_current(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    f = tmp_path / "f.txt"
    f.write_text("one")
    for v in ("v1", "v2", "v3", "v4", "v5"):
        store.publish(v, {"f.txt": f}, {}, validate=lambda p: None, make_current=v == "v2")
    assert store.current_version() == "v2"
    assert store.prune(2) == ["v1", "v3"]
    assert store.versions() == ["v2", "v4", "v5"] and store.current_version() == "v2"
    assert store.prune(5) == [] and f.read_text() == "one"
    with pytest.raises(ValueError, match="at least 1"):
        store.prune(0)
