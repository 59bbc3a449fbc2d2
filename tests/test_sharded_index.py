"""Sharded BM25 passage index with corpus-wide statistics == one index over all passages.

Real data: ~100-word passages of the enwiki sample's articles, NQ-open dev questions as queries.
"""
from __future__ import annotations

import hashlib
import json
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pyarrow as pa
import pytest
from corpus_stages import enwiki_sample_stages
from same_search import assert_same_search

from data_contracts.base import sha256_file
from data_contracts.corpus import CLUSTERS, DOCUMENTS, PASSAGES
from funnelrag.datasets import resolve
from tasks.corpus.index import BM25Config, BM25Index
from tasks.sources.ingest import IngestConfig, ingest
from tasks.corpus.segment import article_windows
from tasks.corpus.sharded.cluster_index import DF_FILE
from tasks.corpus.sharded.passage_tokens import TOKENS_DIR
from tasks.corpus.sharded.sharded_index import (
    SHARDS_FILE,
    ShardedBM25,
    build_passage_shards,
    build_shard,
    load_passage_index,
    merge_stats,
    save_stats,
    shard_stats,
)
from tasks.corpus.sharded.shards import passage_row_ranges, read_cluster_ranges, read_rows, run_here


@pytest.fixture(scope="module")
def passages(data_mirror, tmp_path_factory) -> tuple[list[str], list[str]]:
    out = tmp_path_factory.mktemp("enwiki")
    ingest([resolve("enwiki-sample", data_mirror)], out, IngestConfig(format="mediawiki"))
    docs = DOCUMENTS.read(out, columns=["title", "text"])
    texts, ids = [], []
    for title, text in zip(docs["title"].to_pylist(), docs["text"].to_pylist()):
        for j, w in enumerate(article_windows(text, 100)):
            texts.append(f"{title}\n{w}")
            ids.append(f"{title}#{j}")
    return texts, ids


@pytest.fixture(scope="module")
def questions(data_mirror) -> list[str]:
    lines = (data_mirror / "nq-open" / "nq-open-dev.tsv").read_text().splitlines()
    return [line.split("\t")[0] for line in lines[:60]]


def _sharded(texts, ids, cuts, cfg, directory=None) -> ShardedBM25:
    parts = [(texts[a:b], ids[a:b]) for a, b in zip([0, *cuts], [*cuts, len(texts)])]
    stats = merge_stats([shard_stats(t, cfg) for t, _ in reversed(parts)])   # order does not matter
    shards = [build_shard(t, i, cfg, stats) for t, i in parts]
    if directory is None:
        return ShardedBM25(shards)
    names = [f"shard-{k:05d}" for k in range(len(shards))]
    for s, n in zip(shards, names):
        s.save(directory / n)
    (directory / SHARDS_FILE).write_text(json.dumps(names))
    save_stats(stats, directory)
    return ShardedBM25.load(directory)


@pytest.mark.slow  # sharded and single BM25 over every enwiki-sample passage, 60 real questions
@pytest.mark.parametrize("cfg", [BM25Config(), BM25Config(stemmer=None, stopwords=None, k1=1.2, b=0.75)],
                         ids=["default", "unstemmed"])
def test_sharded_search_equals_single_index(passages, questions, cfg, tmp_path):
    texts, ids = passages
    assert len(texts) > 2_000
    single = BM25Index.build(texts, ids, cfg)
    sharded = _sharded(texts, ids, [len(texts) // 5, len(texts) // 5 + 7, len(texts) * 3 // 4], cfg, tmp_path)
    assert sharded.doc_ids == single.doc_ids
    assert (single.search(questions, 100)[1][:, -1] > 0).mean() > 0.9
    assert_same_search(single, sharded, questions)
    rows, scores = sharded.search_rows(questions[:3], 5)
    ids, same = sharded.search(questions[:3], 5)
    assert [[sharded.doc_ids[r] for r in row] for row in rows] == ids and np.array_equal(scores, same)


def test_ties_across_shards_rank_as_one_index_by_row():
    """Each text repeated ~15 times over shards of 7 to 330 rows (several smaller than k): scores tie
    at every place, across shards. The running top-k over the shards gives exactly the rows and
    scores of one index, and of a full sort of the dense scores by (score desc, row asc); queries
    scanning every row, queries touching two rows, a query with no known token."""
    rng = np.random.default_rng(3)
    words = ["apple", "pie", "river", "stone", "cloud", "green", "music", "table"]
    base = [" ".join(rng.choice(words, size=int(rng.integers(1, 6)))) for _ in range(40)]
    texts = [base[i] for i in rng.integers(0, 40, size=600)]
    texts[3] += " zebra"
    texts[400] += " zebra"
    ids = [f"p{i}" for i in range(600)]
    cfg = BM25Config(stemmer=None, stopwords=None)
    single = BM25Index.build(texts, ids, cfg)
    sharded = _sharded(texts, ids, [7, 250, 260, 590], cfg)
    assert [len(s) for s in sharded.shards] == [7, 243, 10, 330, 10]
    queries = ["apple", "apple pie", "river stone cloud green", "zebra", "zebra music", "nothing", "music music table"]
    vocab = single.retriever.vocab_dict
    tokens = single.tokenize(queries)
    dense = [single.retriever.get_scores_from_ids([vocab[t] for t in toks if t in vocab]) if any(t in vocab for t in toks)
             else np.zeros(len(texts), np.float32) for toks in tokens]
    for k in (1, 5, 8, 20, 100, 600):
        rows, scores = sharded.search_rows(queries, k)
        one_rows, one_scores = single.search_rows(queries, k)
        np.testing.assert_array_equal(rows, one_rows)
        np.testing.assert_array_equal(scores, one_scores)
        for i, full in enumerate(dense):
            order = np.lexsort((np.arange(len(texts)), -full))[:k]
            np.testing.assert_array_equal(rows[i], order)
            np.testing.assert_allclose(scores[i], full[order], rtol=1e-6)
            assert k < 20 or (scores[i, 1:] == scores[i, :-1]).any()      # ties inside the top k
    assert sharded.search_rows([], 5)[0].shape == (0, 0)


def test_shard_scores_are_not_local_scores(passages, questions):
    """Without global statistics shard scores differ (the test above is not vacuous)."""
    texts, ids = passages
    cfg = BM25Config()
    half = len(texts) // 2
    local = BM25Index.build(texts[:half], ids[:half], cfg)
    shard = _sharded(texts, ids, [half], cfg).shards[0]
    _, a = local.search(questions, 5)
    _, b = shard.search(questions, 5)
    assert not np.allclose(a, b, rtol=1e-3)


def test_shard_terms_missing_from_stats_are_an_error(passages):
    texts, ids = passages
    cfg = BM25Config()
    stats = shard_stats(texts[:50], cfg)
    with pytest.raises(ValueError, match="not in the corpus statistics"):
        build_shard(texts[50:100], ids[50:100], cfg, stats)


@pytest.fixture(scope="module")
def segmented(data_mirror, tmp_path_factory):
    """The enwiki sample ingested, clustered and segmented (whitespace token counts: fast)."""
    return enwiki_sample_stages(tmp_path_factory.mktemp("segmented"), data_mirror, segment=True)


def _texts(p) -> tuple[list[str], list[str]]:
    """``(texts, passage ids)`` of passages rows: a text is ``title\\ntext``, as the index indexes it."""
    return [f"{t}\n{x}" for t, x in zip(p["title"].to_pylist(), p["text"].to_pylist())], p["passage_id"].to_pylist()


def _single(segment_dir, cfg) -> BM25Index:
    return BM25Index.build(*_texts(PASSAGES.read(segment_dir, columns=["passage_id", "title", "text"])), cfg)


def _files(directory):
    return {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()}


def _files_digest(directory) -> str:
    return hashlib.sha256(json.dumps(_files(directory), sort_keys=True).encode()).hexdigest()


def _edit_document(root, doc_id: int, out):
    """``root``'s stages with document ``doc_id``'s text edited (a word appended), its window
    token counts and segmentation made again under ``out`` (the same clusters)."""
    import shutil  # noqa: PLC0415

    from tasks.corpus import stages as S  # noqa: PLC0415
    from tasks.corpus.segment import SegmentConfig  # noqa: PLC0415

    docs = DOCUMENTS.read(root / "ingest")
    text = docs["text"].to_pylist()
    row = docs["doc_id"].to_pylist().index(doc_id)
    text[row] += " tonight"
    shutil.copytree(root / "ingest", out / "ingest")
    DOCUMENTS.write(docs.set_column(docs.schema.get_field_index("text"), "text", pa.array(text)), out / "ingest")
    seg = SegmentConfig(tokenizer="whitespace")
    S.run_tokens(out / "ingest", out / "tokens", seg, None)
    S.run_segment(out / "ingest", out / "tokens", root / "cluster", out / "segment", seg, None)
    return out


def _budget(cluster_dir, n=3) -> int:
    """A shard budget giving several passage shards: ``1/n`` of all cluster tokens."""
    return int(CLUSTERS.read(cluster_dir, columns=["n_tokens"]).column("n_tokens").to_numpy().sum()) // n


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster + segment (module fixture)
@pytest.mark.parametrize("name,cfg", [("default", BM25Config()),
                                      ("unstemmed", BM25Config(stemmer=None, stopwords=None, k1=1.2, b=0.75))])
def test_passage_shards_tokenize_once_same_bytes(segmented, tmp_path, monkeypatch, name, cfg):
    """The passage token shards keep each shard's token ids, step 2 indexes them: one tokenization per shard, and
    every published shard has the bytes of :func:`build_shard` over the shard's texts with the
    corpus-wide statistics (the path that tokenizes twice)."""
    import tasks.corpus.sharded.token_memo as TM  # noqa: PLC0415  (the module whose tokenizer calls are counted)

    budget = _budget(segmented / "cluster")
    ranges = read_cluster_ranges(segmented / "cluster", budget)
    calls = []
    real = TM.tokenize_ids
    monkeypatch.setattr(TM, "tokenize_ids", lambda texts, *a: calls.append(len(texts)) or real(texts, *a))
    summary = build_passage_shards(segmented / "segment", segmented / "cluster", tmp_path / "out", cfg, budget, run_here,
                                   tmp_path / "work", ingest_dir=segmented / "ingest")
    assert len(calls) == summary["passage_shards"] == len(ranges) > 2 and sum(calls) == summary["passage_index_docs"]
    monkeypatch.setattr(TM, "tokenize_ids", real)
    rows = passage_row_ranges(segmented / "segment", segmented / "cluster", budget)   # the ranges' passage rows
    parts = [_texts(read_rows(segmented / "segment" / PASSAGES.filename, lo, hi, ["passage_id", "title", "text"]))
             for lo, hi in rows]
    stats = merge_stats([shard_stats(texts, cfg) for texts, _ in parts])
    for k, (texts, ids) in enumerate(parts):
        twice = build_shard(texts, ids, cfg, stats).save(tmp_path / f"twice-{k}")
        assert _files(tmp_path / "out" / f"shard-{k:05d}") == _files(twice), k
    assert json.loads((tmp_path / "out" / SHARDS_FILE).read_text()) == [f"shard-{k:05d}" for k in range(len(ranges))]


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster + segment (module fixture)
def test_built_passage_shards_equal_one_index_and_are_reused(segmented, questions, tmp_path):
    """The corpus build's shards (cluster ranges, token ids then index per shard through ``submit``)
    search like one index; a rebuild reuses token shards and indexes; a changed passage re-tokenizes
    in its shard only, that passage alone (the others from the token memo), and re-indexes every
    shard (the global statistics changed)."""
    cfg, seg, work, clusters = BM25Config(), segmented / "segment", tmp_path / "work", segmented / "cluster"
    budget, docs = _budget(clusters), {"ingest_dir": segmented / "ingest"}
    with ProcessPoolExecutor(2) as pool:
        first = build_passage_shards(seg, clusters, tmp_path / "a", cfg, budget, pool.submit, work, **docs)
        again = build_passage_shards(seg, clusters, tmp_path / "b", cfg, budget, pool.submit, work, **docs)
    sharded = load_passage_index(tmp_path / "a")
    single = _single(seg, cfg)
    n = first["passage_shards"]
    assert isinstance(sharded, ShardedBM25) and len(sharded.shards) == n > 2
    assert sharded.doc_ids == single.doc_ids
    assert_same_search(single, sharded, questions[:20], ks=(10, 100))
    assert (first["passage_token_shards_built"], first["passage_index_shards_built"]) == (n, n)
    assert (again["passage_token_shards_reused"], again["passage_index_shards_reused"]) == (n, n)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")

    # tonight the document of the last passage is edited and segmented again (a passage's memo key is
    # derived from its document's text: passages change only with their documents)
    passages = PASSAGES.read(seg, columns=["doc_id"]).column("doc_id").to_numpy()
    changed = _edit_document(segmented, int(passages[-1]), tmp_path / "changed")
    tonight = build_passage_shards(changed / "segment", clusters, tmp_path / "c", cfg, budget, run_here, work,
                                   ingest_dir=changed / "ingest")
    assert (tonight["passage_token_shards_built"], tonight["passage_token_shards_reused"]) == (1, n - 1)
    # only the edited document's passages tokenized, the others' terms from the memo
    assert tonight["passages_reused"] == int((passages != passages[-1]).sum())
    assert (tonight["passage_index_shards_built"], tonight["passage_index_shards_reused"]) == (n, 0)
    assert_same_search(_single(changed / "segment", cfg), load_passage_index(tmp_path / "c"), questions[:20], ks=(10,))


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster + segment (module fixture)
def test_passages_outside_every_cluster_range_are_an_error(segmented, tmp_path):
    """A ``clusters.parquet`` that lacks a cluster of ``passages.parquet`` would drop its passages
    from the index: the build names both files instead."""
    table = CLUSTERS.read(segmented / "cluster")   # Algorithm 1's order: the last cluster is dropped
    CLUSTERS.write(table.slice(0, table.num_rows - 1), tmp_path / "cluster")
    with pytest.raises(ValueError, match="passages.parquet: .* passages, but the cluster ranges of .* hold"):
        build_passage_shards(segmented / "segment", tmp_path / "cluster", tmp_path / "out", BM25Config(),
                             _budget(segmented / "cluster"), run_here, tmp_path / "work", ingest_dir=segmented / "ingest")


@pytest.mark.slow  # enwiki-sample ingest + tokens + cluster + segment (module fixture)
def test_a_flipped_kept_df_is_caught_and_its_token_shard_rebuilt(segmented, tmp_path, caplog):
    """The corpus-wide statistics are summed from the ``df`` each token shard's entry keeps: a
    same-size change of one count in one entry's ``df`` file is caught by the entry's digests on
    the next build, the entry discarded and built again, and the index is a clean build's."""
    cfg, seg, clusters, docs = BM25Config(), segmented / "segment", segmented / "cluster", {"ingest_dir": segmented / "ingest"}
    budget, work = _budget(clusters), tmp_path / "work"
    first = build_passage_shards(seg, clusters, tmp_path / "a", cfg, budget, run_here, work, **docs)
    n = first["passage_token_shards"]
    entry = sorted(d for d in (work / TOKENS_DIR).iterdir() if (d / DF_FILE).is_file())[0]
    kept = (entry / DF_FILE).read_bytes()
    flipped = bytearray(kept)
    flipped[-8] ^= 1   # the low byte of the last term's count (little-endian int64): one document more or less
    (entry / DF_FILE).write_bytes(bytes(flipped))
    with caplog.at_level("WARNING", logger="funnelrag.verify"):
        again = build_passage_shards(seg, clusters, tmp_path / "b", cfg, budget, run_here, work, **docs)
    assert any(str(entry) in r.getMessage() and DF_FILE in r.getMessage() for r in caplog.records)
    assert (again["passage_token_shards_built"], again["passage_token_shards_reused"]) == (1, n - 1)
    assert (entry / DF_FILE).read_bytes() == kept
    clean = build_passage_shards(seg, clusters, tmp_path / "clean", cfg, budget, run_here, tmp_path / "clean-work", **docs)
    assert clean["passage_token_shards_built"] == n
    assert _files(tmp_path / "b") == _files(tmp_path / "clean") == _files(tmp_path / "a")


def _token_shard(directory, terms: list[str], df: list[int], n_docs: int, n_tokens: int):
    """A passage token shard's files :func:`merge_token_shard_stats` reads (vocabulary, df, offsets)."""
    from tasks.corpus.index import TokenIds

    directory.mkdir(parents=True)
    pa.parquet.write_table(pa.table({"term": pa.array(terms, pa.string())}), directory / TokenIds.TERMS_FILE)
    np.save(directory / DF_FILE, np.asarray(df, np.int64))
    np.save(directory / TokenIds.OFFSETS_FILE, np.linspace(0, n_tokens, n_docs + 1).astype(np.int64))
    return directory


@pytest.mark.parametrize("n_shards", [1, 2, 7, 40])
def test_merged_token_shard_stats_sum_every_shard_by_term(tmp_path, n_shards):
    """The global ``df`` equals a per-term sum over all shards (shards of very different vocabulary
    sizes, so the merge runs at several points), term-sorted; ``N`` and the total length add up; the
    same shards in another order give the same file and key."""
    import collections

    import pyarrow.parquet as pq

    from tasks.corpus.sharded.sharded_index import merge_token_shard_stats

    rng = np.random.default_rng(n_shards)
    expect: collections.Counter = collections.Counter()
    dirs, docs, tokens = [], [], 0
    for s in range(n_shards):
        size = int(rng.choice([1, 30, 2_000]))   # small shards wait, large ones trigger a merge
        ids = np.unique(rng.integers(0, 5_000, size))
        terms = [f"t{i}é" for i in rng.permutation(ids)]   # a shard's vocabulary is in its own order
        df = rng.integers(1, 9, len(terms)).tolist()
        expect.update(dict(zip(terms, df)))
        n_docs, n_tok = int(rng.integers(1, 50)), int(rng.integers(50, 900))
        dirs.append(_token_shard(tmp_path / f"shard-{s}", terms, df, n_docs, n_tok))
        docs.append(n_docs)
        tokens += n_tok
    n, total, path, key = merge_token_shard_stats(dirs, tmp_path / "a")
    got = pq.read_table(path)
    assert got.column("term").to_pylist() == sorted(expect)
    assert dict(zip(got.column("term").to_pylist(), got.column("df").to_pylist())) == dict(expect)
    assert (n, total) == (docs, tokens)
    n2, total2, path2, key2 = merge_token_shard_stats(dirs[::-1], tmp_path / "b")
    assert (sorted(n2), total2, key2, path2.read_bytes()) == (sorted(n), total, key, path.read_bytes())
