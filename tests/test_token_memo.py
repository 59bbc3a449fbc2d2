"""BM25 token ids from the per-document memo (tasks/corpus/sharded/token_memo.py) == tokenizing every text,
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
from funnelrag.content_store import JoinedTexts
from tasks.corpus.segment import SegmentConfig
from tasks.corpus.sharded.token_memo import (memo_token_ids, open_token_memo, positions_in, sorted_positions, union_terms,
                                             write_token_memo)

CONFIGS = [BM25Config(), BM25Config(stemmer=None, stopwords=None)]


@pytest.fixture(scope="module")
def nights(data_mirror, tmp_path_factory):
    """The enwiki sample through segmentation (``base``) and the same with every 7th article
    edited (``edited``: words appended, some of them in no other article); the edited articles' rows."""
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
def test_a_token_memo_holds_each_nights_texts_and_gives_the_ids_of_no_memo(nights, tmp_path, cfg):
    """Night 1 writes the memo; night 2 (every 7th text edited), in two shards saved as parts,
    replaces it with exactly its texts (the edited texts' old versions are gone, the vocabulary
    is the sorted union of the parts'); on night 3 (more edits) it gives the ids of no memo."""
    base, edited, edited_ids = nights
    old, new = _pieces(base), _pieces(edited)
    third = [t + " Zebrafication resumed." if i % 5 == 0 else t for i, t in enumerate(new)]
    write_token_memo(tmp_path / "memo", [memo_token_ids(old, cfg, None, [])])
    parts = []
    for k, (a, b) in enumerate([(0, 40), (40, len(new))]):
        (tmp_path / f"part{k}").mkdir()
        found = memo_token_ids(new[a:b], cfg, *open_token_memo(tmp_path / "memo"))
        assert found.reused == sum(1 for i in range(a, b) if i not in edited_ids)
        found.save(tmp_path / f"part{k}")
        parts.append(tmp_path / f"part{k}")
    assert write_token_memo(tmp_path / "memo", parts) == len(set(new))
    memo, terms = open_token_memo(tmp_path / "memo")
    assert terms.to_pylist() == sorted(terms.to_pylist()) and (memo.lookup(memo_token_ids([old[0]], cfg, None, []).keys) < 0).all()   # old[0] was edited
    got = memo_token_ids(third, cfg, memo, terms)
    assert got.reused == sum(1 for i in range(len(third)) if i % 5)
    assert _same(got.tokens, TokenIds.from_tokenized(tokenize_ids(third, cfg, _stemmer(cfg.stemmer))))


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
    edited_doc_ids = DOCUMENTS.read(edited / "ingest", columns=["doc_id"]).column("doc_id").to_numpy()[edited_ids]
    # a passage's key derives from its document's text: an edited document's passages are all tokenized again
    assert tonight["passages_reused"] == int((~np.isin(passages, edited_doc_ids)).sum()) > 0
    assert tonight["cluster_members_reused"] == members.size - len(edited_ids)


def test_the_pieces_join_is_checked_against_the_token_pattern_in_use():
    """A cluster's members are tokenized one by one and joined; that equals tokenizing the joined
    text only while no token can span the join. The pattern every index uses passes; one whose
    tokens cross whitespace is refused with a message naming it (never a silently wrong memo)."""
    import bm25s  # noqa: PLC0415

    from tasks.corpus.index import TOKEN_PATTERN  # noqa: PLC0415
    from tasks.corpus.sharded.token_memo import PIECES_JOIN, check_pieces_join  # noqa: PLC0415

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


def test_sorted_positions_find_each_term_of_a_sorted_vocabulary_and_nothing_else():
    """The binary search over the vocabulary's UTF-8 bytes agrees with a dict on terms of one to
    four UTF-8 bytes a character (so byte order must be code-point order), on a sliced array, on
    terms it lacks and on an empty vocabulary; a ``large_string`` vocabulary is refused."""
    rng = np.random.default_rng(0)
    alphabet = list("abzé中😀ßÿ0_")
    words = {"".join(rng.choice(alphabet, int(rng.integers(1, 6)))) for _ in range(3_000)}
    vocab = sorted(words)
    absent = ["", "aaaaaaa", "😀😀😀😀😀😀", "zzzzzzzz", "é中é中é中é"]
    queries = [w for w in rng.permutation(vocab)[:500]] + [w for w in absent if w not in words]
    where = {t: i for i, t in enumerate(vocab)}
    expect = [where.get(q, -1) for q in queries]
    assert sorted_positions(pa.array(vocab, pa.string()), queries).tolist() == expect
    padded = pa.array(["!", *vocab, "~~~~"], pa.string()).slice(1, len(vocab))   # an array with an offset
    assert sorted_positions(padded, queries).tolist() == expect
    assert sorted_positions(pa.array([], pa.string()), ["a", ""]).tolist() == [-1, -1]
    with pytest.raises(ValueError, match="large_string"):
        sorted_positions(pa.array(vocab, pa.large_string()), queries)


def test_union_terms_keeps_first_occurrence_order_and_positions_find_every_term():
    """The union of many vocabularies of very different sizes (so the waiting arrays are merged at
    several points) equals a Python first-occurrence union; every term is found at its index, in
    batches or not; a term outside the vocabulary is a KeyError naming it."""
    rng = np.random.default_rng(1)
    parts = [pa.array([f"w{i}ß" for i in rng.permutation(rng.integers(0, 3_000, int(size)))], pa.string()).unique()
             for size in rng.choice([0, 1, 40, 2_500], 60)]
    expect: dict[str, int] = {}
    for part in parts:
        for t in part.to_pylist():
            expect.setdefault(t, len(expect))
    vocab = union_terms(iter(parts))
    assert vocab.to_pylist() == list(expect)
    found = list(positions_in(vocab, iter(parts)))
    assert len(found) == len(parts)
    for part, at in zip(parts, found):
        assert at.dtype == np.int32 and [expect[t] for t in part.to_pylist()] == at.tolist()
    assert union_terms([]).to_pylist() == [] and list(positions_in(vocab, [])) == []
    with pytest.raises(KeyError, match="'nowhere'"):
        list(positions_in(vocab, [parts[3], pa.array(["w1ß", "nowhere"])]))
