"""BM25 token ids from the per-document memo (tasks/corpus/token_memo.py) == tokenizing every text,
and an index stage over an edited corpus that tokenizes only the edited texts yet writes the bytes
of a build without a memo (real enwiki sample)."""
from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pytest
from corpus_stages import enwiki_sample_stages

from data_contracts.base import sha256_file
from data_contracts.corpus import CLUSTER_MEMBERS, CLUSTERS, DOCUMENTS, PASSAGES
from tasks.corpus import stages as S
from tasks.corpus.clustering import ClusteringConfig
from tasks.corpus.index import BM25Config, TokenIds, _stemmer, tokenize_ids
from tasks.corpus.memo import JoinedTexts
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.token_memo import memo_token_ids, open_token_memo, write_token_memo

CONFIGS = [BM25Config(), BM25Config(stemmer=None, stopwords=None)]


@pytest.fixture(scope="module")
def nights(data_mirror, tmp_path_factory):
    """The enwiki sample through segmentation (``base``) and the same with every 7th article
    edited (``edited``: words appended, some of them in no other article)."""
    root = tmp_path_factory.mktemp("nights")
    base = enwiki_sample_stages(root / "base", data_mirror, segment=True)
    docs = DOCUMENTS.read(base / "ingest")
    texts = docs.column("text").to_pylist()
    edited_ids = list(range(0, len(texts), 7))
    for d in edited_ids:
        texts[d] += f" Quuxification zebrafied {d} times, the editors noted."
    edited = root / "edited"
    shutil.copytree(base / "ingest", edited / "ingest")
    DOCUMENTS.write(docs.set_column(docs.schema.get_field_index("text"), "text", pa.array(texts, pa.string())),
                    edited / "ingest")
    seg = SegmentConfig(tokenizer="whitespace")
    S.run_tokens(edited / "ingest", edited / "tokens", seg, None)
    S.run_cluster(edited / "ingest", edited / "tokens", edited / "cluster", ClusteringConfig(tokenizer="whitespace"))
    S.run_segment(edited / "ingest", edited / "tokens", edited / "cluster", edited / "segment", seg, None)
    return base, edited, edited_ids


def _pieces(stages):
    docs = DOCUMENTS.read(stages / "ingest", columns=["title", "text"])
    return [f"{t}\n{x}" for t, x in zip(docs.column("title").to_pylist(), docs.column("text").to_pylist())]


def _same(a: TokenIds, b: TokenIds) -> bool:
    return np.array_equal(a.ids, b.ids) and np.array_equal(a.offsets, b.offsets) and a.terms == b.terms


@pytest.mark.parametrize("cfg", CONFIGS, ids=["stemmed", "raw"])
def test_memo_token_ids_equal_tokenize_ids_with_and_without_a_memo(nights, tmp_path, cfg):
    base, edited, edited_ids = nights
    old, new = _pieces(base), _pieces(edited)
    fresh = memo_token_ids(new, cfg, None, [])
    assert fresh.reused == 0 and _same(fresh.tokens, TokenIds.from_tokenized(tokenize_ids(new, cfg, _stemmer(cfg.stemmer))))
    (tmp_path / "part").mkdir()
    memo_token_ids(old, cfg, None, []).save(tmp_path / "part")
    assert write_token_memo(tmp_path / "memo", [tmp_path / "part"]) == len(set(old))
    memo, terms = open_token_memo(tmp_path / "memo")
    groups = np.array([0, 3, 3, 10, len(new)])            # texts of several pieces (one empty), as clusters are
    joined = ["\n\n".join(new[a:b]) for a, b in zip(groups[:-1], groups[1:])]
    got = memo_token_ids(new, cfg, memo, terms, groups)
    assert got.reused == len(new) - len(edited_ids)
    assert _same(got.tokens, TokenIds.from_tokenized(tokenize_ids(joined, cfg, _stemmer(cfg.stemmer))))
    assert "quuxif" in got.tokens.terms or "quuxification" in got.tokens.terms   # a term the memo never saw
    chunked = pa.chunked_array([pa.array(new[:9]), pa.array(new[9:40]), pa.array(new[40:])])   # Arrow pieces
    from_arrow = memo_token_ids(chunked, cfg, memo, terms, groups)
    assert from_arrow.reused == got.reused and _same(from_arrow.tokens, got.tokens)
    assert np.array_equal(from_arrow.keys, got.keys)
    title_text = [piece.split("\n", 1) for piece in new]                 # the columns, joined only where tokenized
    from_columns = memo_token_ids(JoinedTexts(pa.array([t for t, _ in title_text]), pa.array([x for _, x in title_text])),
                                  cfg, memo, terms, groups)
    assert from_columns.reused == got.reused and _same(from_columns.tokens, got.tokens)
    assert np.array_equal(from_columns.keys, got.keys)
    shuffled = [new[i] for i in np.random.default_rng(0).permutation(len(new))] + ["", old[0]]   # memo order broken
    got = memo_token_ids(shuffled, cfg, memo, terms)
    assert got.reused == len(new) - len(edited_ids) + 1
    assert _same(got.tokens, TokenIds.from_tokenized(tokenize_ids(shuffled, cfg, _stemmer(cfg.stemmer))))
    with pytest.raises(ValueError, match="do not cover"):
        memo_token_ids(new, cfg, memo, terms, np.array([0, 5]))


@pytest.mark.parametrize("cfg", CONFIGS, ids=["stemmed", "raw"])
def test_an_extended_token_memo_gives_the_ids_of_a_rewritten_one(nights, tmp_path, cfg):
    """Night 1 writes the memo; night 2 (every 7th text edited) extends it with the edited texts
    (the old ids linked, new terms at the end of its vocabulary); a memo written whole from
    night 2's texts, and no memo at all, give the same ids on night 3 (more edits)."""
    base, edited, edited_ids = nights
    old, new = _pieces(base), _pieces(edited)
    third = [t + " Zebrafication resumed." if i % 5 == 0 else t for i, t in enumerate(new)]
    write_token_memo(tmp_path / "ext", [memo_token_ids(old, cfg, None, [])])
    first_terms = open_token_memo(tmp_path / "ext")[1]
    tonight = memo_token_ids(new, cfg, *open_token_memo(tmp_path / "ext"))
    assert write_token_memo(tmp_path / "ext", [tonight]) == len(set(old) | set(new))      # extended: old rows kept
    other = memo_token_ids(new, cfg, None, [])              # rows of no memo: the write looks them up itself
    assert other.memo_rows is None and tonight.memo_rows is not None
    assert (tmp_path / "ext" / "terms.data.1.npy").exists()
    terms = open_token_memo(tmp_path / "ext")[1]
    assert terms[:len(first_terms)] == first_terms and len(terms) > len(first_terms)   # new terms at the end
    write_token_memo(tmp_path / "whole", [memo_token_ids(new, cfg, None, [])])
    reference = TokenIds.from_tokenized(tokenize_ids(third, cfg, _stemmer(cfg.stemmer)))
    for memo_dir in ("ext", "whole"):
        got = memo_token_ids(third, cfg, *open_token_memo(tmp_path / memo_dir))
        assert got.reused == sum(1 for i in range(len(third)) if i % 5) and _same(got.tokens, reference), memo_dir
    # night 3 in shards saved to parts, with a bound on dead rows that forces a rewrite
    parts = []
    for k, (a, b) in enumerate([(0, 40), (40, len(third))]):
        (tmp_path / f"part{k}").mkdir()
        memo_token_ids(third[a:b], cfg, *open_token_memo(tmp_path / "ext")).save(tmp_path / f"part{k}")
        parts.append(tmp_path / f"part{k}")
    assert write_token_memo(tmp_path / "ext", parts, max_dead=0.0) == len(set(third))   # rewritten: only tonight's
    assert not (tmp_path / "ext" / "terms.data.1.npy").exists()
    assert open_token_memo(tmp_path / "ext")[1] == sorted(open_token_memo(tmp_path / "ext")[1])
    got = memo_token_ids(third, cfg, *open_token_memo(tmp_path / "ext"))
    assert got.reused == len(third) and _same(got.tokens, reference)


def test_memo_rows_of_another_memo_are_looked_up_again(nights, tmp_path):
    """Pieces looked up in memo ``a`` and written into memo ``b``: their rows in ``a`` are not
    taken for rows of ``b``; ``b`` ends up holding every piece, with the ids of a fresh tokenization."""
    base, edited, _ = nights
    old, new, cfg = _pieces(base), _pieces(edited), BM25Config()
    write_token_memo(tmp_path / "a", [memo_token_ids(old[:50], cfg, None, [])])
    write_token_memo(tmp_path / "b", [memo_token_ids(old[50:], cfg, None, [])])
    found = memo_token_ids(new, cfg, *open_token_memo(tmp_path / "a"))
    assert found.reused > 0
    write_token_memo(tmp_path / "b", [found], max_dead=1.0)   # extended whatever goes stale
    memo_b, terms_b = open_token_memo(tmp_path / "b")
    assert (memo_b.lookup(found.keys) >= 0).all() and memo_b.data_files == 2
    again = memo_token_ids(new, cfg, memo_b, terms_b)
    assert again.reused == len(new) and _same(again.tokens, TokenIds.from_tokenized(tokenize_ids(new, cfg, _stemmer(cfg.stemmer))))


def _index_files(directory):
    return {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*"))
            if p.is_file() and ".work" not in p.parts}


@pytest.mark.slow  # two index builds and a reference build, twice
@pytest.mark.parametrize("sharded", [False, True], ids=["one-passage-index", "passage-shards"])
def test_an_edited_corpus_tokenizes_only_its_edits_and_indexes_the_same_bytes(nights, tmp_path, sharded):
    base, edited, edited_ids = nights
    cfg = BM25Config()
    total = int(CLUSTERS.read(edited / "cluster", columns=["n_tokens"]).column("n_tokens").to_numpy().sum())
    layout = {"passage_shard_tokens": total // 3 if sharded else 0, "tokens_per_shard": total // 3}

    def index(stages, out, work):
        return S.run_index(stages / "ingest", stages / "cluster", stages / "segment", out, cfg, work_dir=work, **layout)
    first = index(base, tmp_path / "first", tmp_path / "work")
    assert first["passages_reused"] == first["cluster_members_reused"] == 0
    tonight = index(edited, tmp_path / "tonight", tmp_path / "work")
    reference = index(edited, tmp_path / "reference", None)          # no memo: every text tokenized
    assert reference["passages_reused"] == reference["cluster_members_reused"] == 0
    assert _index_files(tmp_path / "tonight") == _index_files(tmp_path / "reference")
    passages = PASSAGES.read(edited / "segment", columns=["doc_id"]).column("doc_id").to_numpy()
    members = CLUSTER_MEMBERS.read(edited / "cluster", columns=["doc_id"]).column("doc_id").to_numpy()
    assert tonight["passages_reused"] >= int((~np.isin(passages, edited_ids)).sum()) > 0
    assert tonight["passages_reused"] <= passages.size - len(edited_ids)   # each edit ends in a new last window
    assert tonight["cluster_members_reused"] == members.size - len(edited_ids)


def test_the_pieces_join_is_checked_against_the_token_pattern_in_use():
    """A cluster's members are tokenized one by one and joined; that equals tokenizing the joined
    text only while no token can span the join. The pattern every index uses passes; one whose
    tokens cross whitespace is refused with a message naming it (never a silently wrong memo)."""
    import bm25s  # noqa: PLC0415

    from tasks.corpus.index import TOKEN_PATTERN  # noqa: PLC0415
    from tasks.corpus.token_memo import PIECES_JOIN, check_pieces_join  # noqa: PLC0415

    check_pieces_join()
    pieces = ["Zürich\nThe city's lake", "Lake Geneva\n(French: Lac Léman) is", "x\n\ny"]
    one = bm25s.tokenize([PIECES_JOIN.join(pieces)], token_pattern=TOKEN_PATTERN, stopwords=None,
                         return_ids=False, show_progress=False)[0]
    each = sum(bm25s.tokenize(pieces, token_pattern=TOKEN_PATTERN, stopwords=None, return_ids=False,
                              show_progress=False), [])
    assert one == each
    with pytest.raises(ValueError, match="can match across the pieces' join"):
        check_pieces_join(r"(?s)\w[\w\s]*\w")
    with pytest.raises(ValueError, match="can match across"):
        check_pieces_join(TOKEN_PATTERN, "_")
