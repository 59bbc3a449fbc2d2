"""The content-keyed passage vector store: reuse across corpus versions, verification on read,
and embedding only what changed (real MiniLM over real oracle passages)."""
from __future__ import annotations

import hashlib
import logging

import numpy as np
import pyarrow as pa
import pytest

from data_contracts.base import temp_name
from funnelrag.content_store import text_keys
from funnelrag.verify import record_digests
from tasks.funnel import embeddings, lazy_embeddings, vector_store
from tasks.funnel.vector_store import VectorStore

DIM = 8


def _unit_rows(n: int, seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def test_vectors_are_found_by_text_content_whatever_the_order(tmp_path):
    texts = [f"passage {i}" for i in range(50)]
    vectors = _unit_rows(50, 0)
    store = VectorStore(tmp_path / "s", DIM)
    store.add(text_keys(texts[:30]), vectors[:30])
    store.add(text_keys(texts[30:]), vectors[30:])
    again = VectorStore(tmp_path / "s", DIM)                      # a later process reads both segments
    order = np.random.default_rng(1).permutation(60)
    asked = [texts[i] if i < 50 else f"new text {i}" for i in order]
    got = again.lookup(text_keys(asked))
    assert got.found.tolist() == [i < 50 for i in order]
    np.testing.assert_array_equal(got.vectors[got.found], vectors[order[order < 50]])
    assert not got.vectors[~got.found].any() and len(again) == 50


def _damage(path, damage: str) -> None:
    """A same-size flip of one byte, a truncation to half, or a deletion of ``path``."""
    raw = bytearray(path.read_bytes())
    if damage == "flip":
        raw[-3] ^= 0x01
        path.write_bytes(bytes(raw))
    elif damage == "truncate":
        path.write_bytes(bytes(raw[:len(raw) // 2]))
    else:
        path.unlink()


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("part", ["vectors.npy", "keys.npy", "digests.json"])
def test_a_damaged_segment_is_discarded_and_named(tmp_path, caplog, damage, part):
    texts = [f"t{i}" for i in range(20)]
    store = VectorStore(tmp_path / "s", DIM)
    store.add(text_keys(texts[:10]), _unit_rows(10, 0))
    bad = store.add(text_keys(texts[10:]), _unit_rows(10, 1))
    _damage(bad / part, damage)
    again = VectorStore(tmp_path / "s", DIM)
    with caplog.at_level(logging.WARNING):
        got = again.lookup(text_keys(texts))
    assert got.found.tolist() == [True] * 10 + [False] * 10         # the damaged rows are embedded again
    assert str(bad) in caplog.text and not bad.exists() and again.discarded == [str(bad)]
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.startswith(".tmp-")]   # moved aside, then deleted


def test_a_segment_is_written_whole_or_not_at_all(tmp_path):
    store = VectorStore(tmp_path / "s", DIM)
    seg = store.add(text_keys(["a", "b"]), _unit_rows(2, 0))
    assert sorted(p.name for p in seg.iterdir()) == ["digests.json", "keys.npy", "vectors.npy"]
    half = tmp_path / "s" / temp_name("seg-killed")                # a writer killed before its rename
    half.mkdir()
    np.save(half / "keys.npy", text_keys(["c"]))
    assert VectorStore(tmp_path / "s", DIM).segments() == [seg]
    assert not VectorStore(tmp_path / "s", DIM).lookup(text_keys(["c"])).found.any()


def test_a_segment_keeps_each_keys_digest_bytes_so_older_stores_are_read(tmp_path):
    """The keys file of a segment holds the BLAKE2b-128 digests, 16 bytes a row, as since the store's
    first format: a store written before text keys became (high, low) words is read as it is."""
    texts = ["a", "Zürich"]
    seg = VectorStore(tmp_path / "s", DIM).add(text_keys(texts), _unit_rows(2, 0))
    digests = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in texts)
    on_disk = np.load(seg / "keys.npy")
    assert on_disk.dtype == np.uint8 and on_disk.shape == (2, 16) and on_disk.tobytes() == digests
    older = tmp_path / "older" / "seg-written-before"                   # the bytes older code wrote, by hand
    older.mkdir(parents=True)
    np.save(older / "keys.npy", np.frombuffer(digests, np.uint8).reshape(2, 16))
    np.save(older / "vectors.npy", _unit_rows(2, 0))
    record_digests(older)
    got = VectorStore(tmp_path / "older", DIM).lookup(text_keys(texts[::-1]))
    np.testing.assert_array_equal(got.vectors, _unit_rows(2, 0)[::-1])
    expected = hashlib.sha256(b"format=1\0model=m\0precision=fp32").hexdigest()[:32]   # the store's name as before
    assert vector_store.vector_store_root(tmp_path, "m") == tmp_path / "embed-vectors" / expected


def test_non_finite_vectors_and_bad_shapes_are_refused(tmp_path):
    store = VectorStore(tmp_path / "s", DIM)
    nan = _unit_rows(2, 0)
    nan[1, 3] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        store.add(text_keys(["a", "b"]), nan)
    with pytest.raises(ValueError, match="dim"):
        store.add(text_keys(["a"]), np.zeros((1, DIM + 1), np.float32))


def test_compaction_keeps_every_vector_once(tmp_path):
    store = VectorStore(tmp_path / "s", DIM)
    vectors = _unit_rows(12, 0)
    for i in range(12):
        store.add(text_keys([f"t{i}"]), vectors[i:i + 1])
    store.add(text_keys(["t0"]), vectors[:1])                       # a duplicate
    assert not store.compact(max_segments=20).rewritten
    done = store.compact(max_segments=4)
    assert done.rewritten and (done.rows, done.dead, done.kept) == (13, 1, 12)
    assert len(store.segments()) == 1
    again = VectorStore(tmp_path / "s", DIM)
    assert len(again) == 12
    np.testing.assert_array_equal(again.lookup(text_keys([f"t{i}" for i in range(12)])).vectors, vectors)


def _segment_files(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_pruning_drops_dead_vectors_and_keeps_live_ones_bit_identical(tmp_path):
    store = VectorStore(tmp_path / "s", DIM)
    texts, vectors = [f"t{i}" for i in range(40)], _unit_rows(40, 3)
    for lo in range(0, 40, 10):
        store.add(text_keys(texts[lo:lo + 10]), vectors[lo:lo + 10])
    live = text_keys(texts[5:35])                                    # 10 of 40 dead: 25%
    assert not store.compact(live, max_dead_share=0.3).rewritten     # under the share: left alone
    done = store.compact(live, max_dead_share=0.2)
    assert done.rewritten and (done.dead, done.kept, done.segments_before, done.segments_after) == (10, 30, 4, 1)
    again = VectorStore(tmp_path / "s", DIM)
    got = again.lookup(text_keys(texts))
    assert got.found.tolist() == [5 <= i < 35 for i in range(40)] and len(again) == 30
    assert got.vectors[5:35].tobytes() == vectors[5:35].tobytes()    # bit-identical
    first = _segment_files(tmp_path / "s")
    other = VectorStore(tmp_path / "t", DIM)                         # the same rows another way: the same bytes
    other.add(text_keys(texts[20:35]), vectors[20:35])
    other.add(text_keys(texts[5:20]), vectors[5:20])
    other.compact(live, max_segments=1)
    strip = {k.split("/", 1)[1]: v for k, v in first.items() if "/" in k}
    assert strip == {k.split("/", 1)[1]: v for k, v in _segment_files(tmp_path / "t").items() if "/" in k}


def test_a_compaction_killed_before_it_removed_the_old_segments_loses_nothing(tmp_path, monkeypatch):
    store = VectorStore(tmp_path / "s", DIM)
    texts, vectors = [f"t{i}" for i in range(20)], _unit_rows(20, 4)
    store.add(text_keys(texts[:10]), vectors[:10])
    store.add(text_keys(texts[10:]), vectors[10:])

    def killed(*_):
        raise KeyboardInterrupt("killed while removing the old segments")

    monkeypatch.setattr(vector_store, "temp_name", killed)           # killed as it moves the first old segment aside
    with pytest.raises(KeyboardInterrupt):
        store.compact(text_keys(texts[:15]), max_dead_share=0.1)
    monkeypatch.undo()
    assert len(store.segments()) == 3                                # the two old ones and the new one
    again = VectorStore(tmp_path / "s", DIM)
    got = again.lookup(text_keys(texts))
    assert got.found.all() and got.vectors.tobytes() == vectors.tobytes()
    done = again.compact(text_keys(texts[:15]), max_dead_share=0.1)    # the next one finishes the job
    assert done.rewritten and len(again.segments()) == 1 and len(VectorStore(tmp_path / "s", DIM)) == 15


def test_files_of_the_older_flat_layout_are_removed_by_a_compaction(tmp_path):
    root = tmp_path / "s"
    root.mkdir()
    for name in ("seg-0a-1.json", "seg-0a-1.keys.npy", "seg-0a-1.vectors.npy"):
        (root / name).write_bytes(b"old layout")
    store = VectorStore(root, DIM)
    store.add(text_keys(["a"]), _unit_rows(1, 0))
    assert len(store) == 1
    done = store.compact()
    assert done.rewritten and done.legacy_files == 3
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [s.name for s in store.segments()]


def test_a_kept_corpus_version_keeps_its_vectors_until_retention_removes_it(tmp_path):
    from funnelrag.store import ArtifactStore  # noqa: PLC0415
    from tasks.funnel.embeddings import passage_texts, prune_vector_store, retained_text_keys  # noqa: PLC0415

    corpus = ArtifactStore(tmp_path / "stores" / "corpus" / "mini")
    tables = [_passages([f"text {i}" for i in range(lo, lo + 20)]) for lo in (0, 10)]   # v2 keeps 10 of v1's 20
    for i, table in enumerate(tables):
        _publish(corpus, f"v{i}", table)
    store = VectorStore(tmp_path / "s", DIM)
    all_texts = passage_texts(tables[0]) + passage_texts(tables[1])[10:]
    vectors = _unit_rows(30, 5)
    store.add(text_keys(all_texts), vectors)
    assert len(np.unique(retained_text_keys(tmp_path / "stores", tmp_path / "cache"), axis=0)) == 30
    assert not prune_vector_store(store, tmp_path / "stores", tmp_path / "cache", 0.2).rewritten   # both kept: all live
    assert corpus.prune(keep=1) == ["v0"]                                               # retention retires v1
    done = prune_vector_store(store, tmp_path / "stores", tmp_path / "cache", 0.2)
    assert done.rewritten and (done.dead, done.kept) == (10, 20)
    got = VectorStore(tmp_path / "s", DIM).lookup(text_keys(all_texts))
    assert got.found.tolist() == [False] * 10 + [True] * 20
    assert got.vectors[10:].tobytes() == vectors[10:].tobytes()


def test_a_home_that_keeps_no_corpus_version_prunes_nothing_and_the_passages_just_embedded_are_live(tmp_path):
    from funnelrag.store import ArtifactStore  # noqa: PLC0415
    from tasks.funnel.embeddings import prune_vector_store  # noqa: PLC0415

    store = VectorStore(tmp_path / "s", DIM)
    store.add(text_keys(["a", "b", "c"]), _unit_rows(3, 0))
    cache = tmp_path / "cache"
    assert prune_vector_store(store, tmp_path / "stores", cache, 0.0, text_keys(["a"])).dead == 0   # nothing tells what is live
    _publish(ArtifactStore(tmp_path / "stores" / "corpus" / "mini"), "v0", _passages(["b"]))   # "Title. b" only
    done = prune_vector_store(store, tmp_path / "stores", cache, 0.0, text_keys(["a"]))
    assert done.rewritten and done.dead == 2                          # "b" and "c": "a" is in use
    assert VectorStore(tmp_path / "s", DIM).lookup(text_keys(["a", "b", "c"])).found.tolist() == [True, False, False]


def test_an_unreadable_kept_version_prunes_nothing(tmp_path, caplog):
    from funnelrag.store import ArtifactStore  # noqa: PLC0415
    from tasks.funnel.embeddings import prune_vector_store  # noqa: PLC0415

    corpus = ArtifactStore(tmp_path / "stores" / "corpus" / "mini")
    version = _publish(corpus, "v0", _passages(["kept"]))
    (version / "passages.parquet").write_bytes(b"not parquet")
    store = VectorStore(tmp_path / "s", DIM)
    store.add(text_keys(["kept. dead"]), _unit_rows(1, 0))
    with caplog.at_level(logging.WARNING):
        done = prune_vector_store(store, tmp_path / "stores", tmp_path / "cache", 0.0)
    assert done.dead == 0 and len(VectorStore(tmp_path / "s", DIM)) == 1
    assert str(version) in caplog.text and "not pruned" in caplog.text


@pytest.fixture
def hashed(monkeypatch):
    """Counts the texts hashed into text keys by the embedding steps (each calls ``text_keys``)."""
    count = [0]

    def counting(texts):
        count[0] += len(texts)
        return text_keys(texts)

    for module in (embeddings, lazy_embeddings):
        monkeypatch.setattr(module, "text_keys", counting)
    return count


def test_each_kept_version_is_hashed_once_and_later_prunes_decide_the_same(tmp_path, hashed):
    from funnelrag.store import ArtifactStore  # noqa: PLC0415
    from tasks.funnel.embeddings import passage_texts, prune_vector_store, retained_text_keys  # noqa: PLC0415

    stores, cache = tmp_path / "stores", tmp_path / "cache"
    corpus = ArtifactStore(stores / "corpus" / "mini")
    tables = [_passages([f"text {i}" for i in range(lo, lo + 20)]) for lo in (0, 10, 15)]   # 20, 10 and 5 new texts
    texts = [passage_texts(t) for t in tables]
    store = VectorStore(tmp_path / "s", DIM)
    every = sorted(set(sum(texts, [])))                                  # 35 texts
    store.add(text_keys(texts[0] + texts[1][10:]), _unit_rows(30, 3))
    for i in range(2):
        _publish(corpus, f"v{i}", tables[i])
    hashed[0] = 0
    assert not prune_vector_store(store, stores, cache, 0.0).dead       # both versions kept: nothing dead
    assert hashed[0] == 40                                              # both kept versions, each hashed once
    assert len(list((cache / embeddings.CORPUS_KEYS).iterdir())) == 2
    hashed[0] = 0
    warm = retained_text_keys(stores, cache)
    assert hashed[0] == 0                                               # a later night hashes no kept passage again
    np.testing.assert_array_equal(warm, text_keys(texts[0] + texts[1]))
    np.testing.assert_array_equal(warm, retained_text_keys(stores, tmp_path / "cold"))   # as from scratch
    _publish(corpus, "v2", tables[2])
    store.add(text_keys(texts[2][15:]), _unit_rows(5, 4))              # the new version's new texts, embedded
    assert corpus.prune(keep=2) == ["v0"]                               # retention retires v0: texts 0..9 dead
    hashed[0] = 0
    done = prune_vector_store(store, stores, cache, 0.0)
    assert hashed[0] == 20                                              # only the new version
    assert done.rewritten and (done.rows, done.dead, done.kept) == (35, 10, 25)
    got = VectorStore(tmp_path / "s", DIM).lookup(text_keys(every))
    assert got.found.tolist() == [t not in texts[0][:10] for t in every]
    assert len(list((cache / embeddings.CORPUS_KEYS).iterdir())) == 2     # the retired version's entry removed


def test_a_keys_entry_of_the_older_layout_is_never_read_and_is_removed(tmp_path, hashed):
    """Kept text keys were digest bytes (version 1); they are (high, low) words now, under new
    entry names: an entry of the older layout is not read (its version's passages are hashed
    again) and the next pruning removes it with the retired versions' entries."""
    from funnelrag.store import ArtifactStore  # noqa: PLC0415
    from tasks.funnel.embeddings import passage_texts, retained_text_keys  # noqa: PLC0415

    stores, cache = tmp_path / "stores", tmp_path / "cache"
    table = _passages([f"text {i}" for i in range(20)])
    _publish(ArtifactStore(stores / "corpus" / "mini"), "v0", table)
    old = cache / embeddings.CORPUS_KEYS / ("0" * 32)                       # a version-1 entry: digest bytes
    old.mkdir(parents=True)
    digests = b"".join(hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest() for t in passage_texts(table))
    np.save(old / "keys.npy", np.frombuffer(digests, np.uint8).reshape(20, 16))
    record_digests(old)
    hashed[0] = 0
    np.testing.assert_array_equal(retained_text_keys(stores, cache), text_keys(passage_texts(table)))
    assert hashed[0] == 20 and not old.exists()
    [entry] = (cache / embeddings.CORPUS_KEYS).iterdir()                    # the new entry, of words
    assert np.load(entry / "keys.npy").dtype == np.uint64


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
@pytest.mark.parametrize("part", ["keys.npy", "digests.json"])
def test_a_damaged_keys_entry_is_hashed_again_and_named(tmp_path, caplog, hashed, damage, part):
    from funnelrag.store import ArtifactStore  # noqa: PLC0415
    from tasks.funnel.embeddings import corpus_text_keys, passage_texts, retained_text_keys  # noqa: PLC0415

    stores, cache = tmp_path / "stores", tmp_path / "cache"
    corpus = ArtifactStore(stores / "corpus" / "mini")
    tables = [_passages([f"text {i}" for i in range(lo, lo + 20)]) for lo in (0, 10)]
    for i, table in enumerate(tables):
        _publish(corpus, f"v{i}", table)
    clean = retained_text_keys(stores, cache)
    entries = sorted((cache / embeddings.CORPUS_KEYS).iterdir())
    victim = entries[0]
    _damage(victim / part, damage)
    hashed[0] = 0
    with caplog.at_level(logging.WARNING):
        again = retained_text_keys(stores, cache)
    assert hashed[0] == 20 and str(victim) in caplog.text               # one version hashed again, its entry named
    np.testing.assert_array_equal(again, clean)
    hashed[0] = 0
    assert retained_text_keys(stores, cache).shape == clean.shape and hashed[0] == 0   # rebuilt, then read
    keys = corpus_text_keys(cache, "some digest", tables[1])            # any caller: passage order, one per passage
    np.testing.assert_array_equal(keys, text_keys(passage_texts(tables[1])))
    short = corpus_text_keys(cache, "some digest", tables[1].slice(0, 3))   # an entry of another length is not used
    np.testing.assert_array_equal(short, keys[:3])


def test_the_lazy_index_reads_a_versions_kept_keys_instead_of_hashing(tmp_path, hashed):
    from tasks.funnel.embeddings import corpus_text_keys, passage_texts  # noqa: PLC0415
    from tasks.funnel.lazy_embeddings import LazyEmbeddingIndex  # noqa: PLC0415

    passages = _passages([f"text {i}" for i in range(12)])
    store = VectorStore(tmp_path / "s", DIM)
    store.add(text_keys(passage_texts(passages)[:5]), _unit_rows(5, 0))
    keys = corpus_text_keys(tmp_path / "cache", "digest-1", passages)      # e.g. embed-corpus hashed them
    hashed[0] = 0
    kept = LazyEmbeddingIndex.open(tmp_path / "s", passages, "digest-1", "m", DIM, 32,
                                   keys=corpus_text_keys(tmp_path / "cache", "digest-1", passages))
    assert hashed[0] == 0 and kept.n_filled == 5
    plain = LazyEmbeddingIndex.open(tmp_path / "s", passages, "digest-1", "m", DIM, 32)
    assert hashed[0] == 12
    np.testing.assert_array_equal(kept._keys, plain._keys)
    np.testing.assert_array_equal(kept.filled, plain.filled)
    with pytest.raises(ValueError, match="keys"):
        LazyEmbeddingIndex.open(tmp_path / "s", passages, "digest-1", "m", DIM, 32, keys=keys[:3])


def _passages(texts: list[str], titles: list[str] | None = None) -> pa.Table:
    from data_contracts.corpus import PASSAGES  # noqa: PLC0415

    n = len(texts)
    return PASSAGES.validate(pa.table({
        "passage_id": [f"{i:016x}.p000" for i in range(n)], "unit_id": [f"{i:016x}.u000" for i in range(n)],
        "cluster_id": pa.array(range(n), pa.int32()), "doc_id": pa.array(range(n), pa.int32()),
        "title": titles or ["Title"] * n, "text": texts, "n_words": pa.array([2] * n, pa.int32()),
        "n_tokens": pa.array([3] * n, pa.int32())}, schema=PASSAGES.schema))


def _publish(corpus, version: str, passages: pa.Table):
    from data_contracts.corpus import PASSAGES  # noqa: PLC0415

    staging = corpus.root / f"staging-{version}"
    path = PASSAGES.write(passages, staging)
    return corpus.publish(version, {PASSAGES.filename: path}, {}, lambda _: None)


# ---------------------------------------------------------------------------- real MiniLM
@pytest.fixture(scope="module")
def oracle_passages(data_mirror):
    """60 real 100-word Wikipedia passages (NQ-open oracle) as a ``passages`` table."""
    import gzip  # noqa: PLC0415
    import json  # noqa: PLC0415

    with gzip.open(data_mirror / "nq-open" / "nq-open-oracle.jsonl.gz", "rt", encoding="utf-8") as fh:
        ctxs = [json.loads(line)["ctxs"][0] for _, line in zip(range(60), fh)]
    n = len(ctxs)
    return pa.table({"passage_id": [f"p{i:04d}" for i in range(n)], "unit_id": [f"u{i // 3:04d}" for i in range(n)],
                     "cluster_id": pa.array([i // 6 for i in range(n)], pa.int32()),
                     "title": [c["title"] for c in ctxs], "text": [c["text"] for c in ctxs]})


@pytest.fixture(scope="module")
def minilm():
    from models.preranker import PreRankerConfig, build_preranker  # noqa: PLC0415

    return build_preranker(PreRankerConfig(kind="bi", max_length=128))


def _next_version(passages: pa.Table) -> pa.Table:
    """A small change: every id renamed (content ids are not relied on), two texts edited, one
    passage removed, one new passage added."""
    rows = passages.to_pylist()
    rows[5]["text"] += " Edited tonight."
    rows[17]["text"] = rows[17]["text"].replace(" the ", " a ", 1) + " (revised)"
    del rows[40]
    rows.append({"passage_id": "new", "unit_id": "u9999", "cluster_id": 99, "title": "Tonight",
                 "text": "A page created on the day of the adds-changes dump, about embeddings."})
    for i, r in enumerate(rows):
        r["passage_id"] = f"v2-{i:04d}"
    return pa.Table.from_pylist(rows, schema=passages.schema)


@pytest.mark.slow  # the real MiniLM over 60 + 60 passages (~20 s beside other jobs)
def test_a_new_corpus_version_embeds_only_new_and_changed_passages(tmp_path, oracle_passages, minilm,
                                                                   one_torch_thread):
    from tasks.funnel.embeddings import EmbeddingConfig, build_embedding_index, passage_vector_store  # noqa: PLC0415

    model, tok = minilm
    cfg = EmbeddingConfig(batch_size=16, shard_rows=25)
    first, info1 = build_embedding_index(oracle_passages, model, tok, "digest-1", cfg, passage_vector_store(tmp_path, model))
    assert (info1["embedded"], info1["reused"]) == (60, 0)
    changed = _next_version(oracle_passages)
    store = passage_vector_store(tmp_path, model)
    second, info2 = build_embedding_index(changed, model, tok, "digest-2", cfg, store)
    assert (info2["embedded"], info2["reused"], info2["discarded_segments"]) == (3, 57, 0)   # 2 edited + 1 new
    fresh, info3 = build_embedding_index(changed, model, tok, "digest-2", cfg, None)          # a full re-embedding
    assert info3["embedded"] == 60
    assert float(np.abs(second.vectors - fresh.vectors).max()) <= 1e-6
    assert second.passage_ids == changed["passage_id"].to_pylist()


@pytest.mark.slow  # the real MiniLM over 60 + 3 + 2 passages, then 60 again from scratch (~40 s beside other jobs)
def test_embed_corpus_nights_hash_each_kept_version_once_and_prune_as_from_scratch(tmp_path, oracle_passages, minilm,
                                                                                  hashed, one_torch_thread):
    from data_contracts.base import sha256_file  # noqa: PLC0415
    from funnelrag.store import ArtifactStore  # noqa: PLC0415
    from tasks.funnel import embeddings as E  # noqa: PLC0415

    model, tok = minilm
    stores, cache = tmp_path / "stores", tmp_path / "cache"
    corpus = ArtifactStore(stores / "corpus" / "mini")
    cfg = E.EmbeddingConfig(batch_size=16, max_dead_share=0.0)
    second = _next_version(oracle_passages)                               # 2 texts edited, 1 removed, 1 new
    third = second.to_pylist()
    for r in third[:2]:
        r["text"] += " Edited the night after."
    tables = [_passages(t["text"].to_pylist(), t["title"].to_pylist())
              for t in (oracle_passages, second, pa.Table.from_pylist(third, schema=second.schema))]

    def night(name: str, table: pa.Table, keep: int = 3):
        version = _publish(corpus, name, table)
        corpus.prune(keep=keep)                                           # the build's retention, before embed-corpus
        hashed[0] = 0
        index, info = E.ensure_embedding_index(stores, cache, "mini", sha256_file(version / "manifest.json"), table,
                                               model, tok, cfg)
        return index, info, hashed[0]

    _, info1, count1 = night("v1", tables[0])
    assert (info1["embedded"], count1) == (60, 60)                        # hashed once: embedding, in use, kept
    _, info2, count2 = night("v2", tables[1])
    assert (info2["embedded"], count2, info2["compaction"]["dead"]) == (3, 60, 0)   # v1 not hashed again
    index3, info3, count3 = night("v3", tables[2], keep=2)               # retention retires v1
    assert (info3["embedded"], count3) == (2, 60)
    only_v1 = set(E.passage_texts(tables[0])) - set(E.passage_texts(tables[1])) - set(E.passage_texts(tables[2]))
    assert info3["compaction"]["dead"] == len(only_v1) == 3               # as the texts of the kept versions say
    store = E.passage_vector_store(cache, model)
    live = set(E.passage_texts(tables[1])) | set(E.passage_texts(tables[2]))
    assert len(store) == len(live)
    assert store.lookup(text_keys(sorted(live))).found.all()
    fresh, _ = E.build_embedding_index(tables[2], model, tok, "scratch", cfg, None)   # a full re-embedding
    assert float(np.abs(index3.vectors - fresh.vectors).max()) <= 1e-6


@pytest.fixture(scope="module")
def clean_store(tmp_path_factory, oracle_passages, minilm):
    """A vector store of the 60 oracle passages in segments of 25, 25 and 10 texts, and the clean
    run's index."""
    from tasks.funnel.embeddings import EmbeddingConfig, build_embedding_index, passage_vector_store  # noqa: PLC0415
    import torch  # noqa: PLC0415

    model, tok = minilm
    cache = tmp_path_factory.mktemp("clean")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        clean, _ = build_embedding_index(oracle_passages, model, tok, "d", EmbeddingConfig(batch_size=16, shard_rows=25),
                                         passage_vector_store(cache, model))
    finally:
        torch.set_num_threads(threads)
    return cache, clean


@pytest.mark.slow  # the real MiniLM over 60 passages, then 10 again per case
@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_store_segment_is_embedded_again(tmp_path, caplog, clean_store, oracle_passages, minilm, damage,
                                                   one_torch_thread):
    import shutil  # noqa: PLC0415

    from tasks.funnel.embeddings import EmbeddingConfig, build_embedding_index, passage_vector_store  # noqa: PLC0415

    model, tok = minilm
    shutil.copytree(clean_store[0], tmp_path / "cache")
    store = passage_vector_store(tmp_path / "cache", model)
    victim = sorted(store.segments(), key=lambda p: (p / "vectors.npy").stat().st_size)[0]   # the 10-text segment
    _damage(victim / "vectors.npy", damage)
    with caplog.at_level(logging.WARNING):
        again, info = build_embedding_index(oracle_passages, model, tok, "d", EmbeddingConfig(batch_size=16), store)
    assert (info["discarded_segments"], info["embedded"], info["reused"]) == (1, 10, 50)
    assert str(victim) in caplog.text and not victim.exists()
    assert float(np.abs(again.vectors - clean_store[1].vectors).max()) <= 1e-6


@pytest.mark.slow  # the real MiniLM over 60 passages
def test_the_lazy_index_reuses_vectors_of_an_earlier_corpus_version(tmp_path, oracle_passages, minilm,
                                                                    one_torch_thread):
    from tasks.funnel.embeddings import EmbeddingConfig, build_embedding_index, model_version  # noqa: PLC0415
    from tasks.funnel.lazy_embeddings import LazyEmbeddingIndex, lazy_root  # noqa: PLC0415

    model, tok = minilm
    version = model_version(model)
    lazy = LazyEmbeddingIndex.open(lazy_root(tmp_path, version), oracle_passages, "digest-1", version, 384, 128)
    assert lazy.ensure(np.arange(30), model, tok) == 30 and lazy.ensure(np.arange(30), model, tok) == 0
    changed = _next_version(oracle_passages)                              # rows 0..29 keep their texts but 5, 17
    lazy2 = LazyEmbeddingIndex.open(lazy_root(tmp_path, version), changed, "digest-2", version, 384, 128)
    assert lazy2.n_filled == 28 and not lazy2.filled[[5, 17]].any()
    assert lazy2.ensure(np.arange(30), model, tok) == 2
    full, _ = build_embedding_index(changed, model, tok, "digest-2", EmbeddingConfig(batch_size=16), None)
    assert float(np.abs(lazy2.vectors[:30] - full.vectors[:30]).max()) <= 1e-6


def test_a_rank_that_starts_after_another_finished_still_embeds_its_whole_share(tmp_path, oracle_passages, minilm,
                                                                                 one_torch_thread):
    """Ranks look the store up at different times: the second must not re-cut the missing texts
    around what the first already wrote (that left a quarter of them unembedded)."""
    from tasks.funnel.embeddings import EmbeddingConfig, embed_passages, passage_texts  # noqa: PLC0415

    model, tok = minilm
    cfg = EmbeddingConfig(batch_size=16, shard_rows=20)
    texts = passage_texts(oracle_passages.slice(0, 20))
    store = VectorStore(tmp_path / "store", 384)
    _, first = embed_passages(texts, model, tok, cfg, store, rank=0, world=2)   # done before rank 1 starts
    _, second = embed_passages(texts, model, tok, cfg, store, rank=1, world=2)
    assert (first["embedded"], second["embedded"]) == (10, 10)
    _, joined = embed_passages(texts, model, tok, cfg, store)
    assert (joined["embedded"], joined["reused"]) == (0, 20)


@pytest.mark.slow  # two ranks under accelerate launch, each loading MiniLM (~1 min beside other jobs)
def test_two_worker_processes_embed_shards_that_join_to_the_single_process_index(tmp_path, oracle_passages, minilm,
                                                                                  one_torch_thread):
    from flows.launched.embed import embed_with_workers  # noqa: PLC0415
    from funnelrag.launch import LaunchConfig  # noqa: PLC0415
    from tasks.funnel.embeddings import (  # noqa: PLC0415
        EmbeddingConfig,
        build_embedding_index,
        passage_texts,
        passage_vector_store,
    )

    model, tok = minilm
    cfg = EmbeddingConfig(batch_size=16, shard_rows=20)
    store = passage_vector_store(tmp_path / "cache", model)
    launch_cfg = LaunchConfig(kind="accelerate", config="infra/accelerate/cpu_2proc.yaml", num_processes=2, cpu=True,
                              timeout_s=600)
    texts = passage_texts(oracle_passages)
    build_embedding_index(oracle_passages.slice(10, 20), model, tok, "d", cfg, store)   # an earlier night held 20
    res = embed_with_workers(texts, model, tok, store, cfg, tmp_path / "launch", launch_cfg, keys=text_keys(texts))
    assert res["world_size"] == 2 and res["embedded_total"] == 40 and res["embedded"] == 20   # rank 0's half
    with pa.memory_map(str(tmp_path / "launch" / "texts.arrow")) as source:                  # only what was missing
        assert pa.ipc.open_file(source).read_all()["text"].to_pylist() == texts[:10] + texts[30:]
    assert len(store.segments()) == 3                                     # the earlier 20, one chunk of 20 a rank
    joined, info = build_embedding_index(oracle_passages, model, tok, "d", cfg, store)
    assert (info["embedded"], info["reused"]) == (0, 60)
    single, _ = build_embedding_index(oracle_passages, model, tok, "d", cfg, None)
    assert float(np.abs(joined.vectors - single.vectors).max()) <= 1e-6
    assert embed_with_workers(texts, model, tok, store, cfg, tmp_path / "launch", launch_cfg) == {
        "embedded_total": 0, "world_size": 0}                             # nothing missing: no launch


@pytest.mark.slow  # two nightly builds of a 40-page mirror, MiniLM over ~1,000 passages (4–11 min beside other jobs)
def test_after_a_real_night_only_new_texts_are_embedded_and_retention_prunes_the_retired_ones(
        prefect_harness, tmp_path, data_mirror, minilm, one_torch_thread):
    from benchmarks.bench_id_survival import WIKI, mirror_nights  # noqa: PLC0415
    from benchmarks.bench_incremental_embedding import new_texts  # noqa: PLC0415
    from tasks.corpus.published import corpus_store, open_corpus  # noqa: PLC0415
    from tasks.funnel import embeddings as E  # noqa: PLC0415

    model, tok = minilm
    passage_texts, prune_vector_store = E.passage_texts, E.prune_vector_store
    cfg = E.EmbeddingConfig(batch_size=16, shard_rows=128)
    (ws, first), (_, second) = mirror_nights(tmp_path, 40, seed=0, workers=1, edit_share=0.05)
    stores = ws.home / "stores"
    v1, v2 = (open_corpus(ws, WIKI, s["version"]) for s in (first, second))
    _, info1 = E.ensure_embedding_index(stores, ws.cache_dir, WIKI, "night-1", v1.passages, model, tok, cfg)
    night, info2 = E.ensure_embedding_index(stores, ws.cache_dir, WIKI, "night-2", v2.passages, model, tok, cfg)
    counts = new_texts(v1.path, v2.path)
    assert second["nightly"]["action"] == "incremental" and 0 < counts["new_texts"] < counts["passages"] // 10
    assert info1["embedded"] == len(set(passage_texts(v1.passages)))
    assert info2["embedded"] == counts["new_texts"]                     # only the night's new and edited texts
    assert info2["reused"] + info2["embedded"] >= counts["passages"] - counts["new_texts"]
    fresh, _ = E.build_embedding_index(v2.passages, model, tok, "night-2", cfg, None)   # a full re-embedding
    assert float(np.abs(night.vectors - fresh.vectors).max()) <= 1e-6

    store = E.passage_vector_store(ws.cache_dir, model)
    keys2 = text_keys(passage_texts(v2.passages))
    before = store.lookup(keys2).vectors
    only_v1 = len(set(passage_texts(v1.passages)) - set(passage_texts(v2.passages)))
    assert not prune_vector_store(store, stores, ws.cache_dir, 0.0).dead   # both versions kept: nothing dead
    assert corpus_store(ws, WIKI).prune(keep=1) == [first["version"]]   # retention retires night 1
    done = prune_vector_store(store, stores, ws.cache_dir, 0.0)
    assert done.rewritten and done.dead == only_v1 > 0
    after = VectorStore(store.root, store.dim)
    got = after.lookup(keys2)
    assert got.found.all() and got.vectors.tobytes() == before.tobytes() and len(after) == len(np.unique(keys2, axis=0))
