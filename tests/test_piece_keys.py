"""The BM25 token memos' piece keys derived from the documents' text keys
(tasks/corpus/sharded/piece_keys.py): they change with what the piece's text depends on (title,
text, window, ``passage_words``), are the same from the text keys the sharded tokens stage kept
and from the texts hashed where it kept none, and stand for the real passages of the enwiki sample."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from corpus_stages import enwiki_sample_stages

from data_contracts.corpus import CLUSTER_MEMBERS, DOCUMENTS, PASSAGES, member_order, rows_of
from funnelrag.content_store import arrow_text_keys, distinct_keys, text_keys
from tasks.corpus.index import BM25Config
from tasks.corpus.segment import SegmentConfig, article_windows
from tasks.corpus.sharded.cluster_index import plan_cluster_tokens
from tasks.corpus.sharded.passage_tokens import PassageTokenShards
from tasks.corpus.sharded.piece_keys import member_keys, passage_windows, window_keys
from tasks.corpus.sharded.shards import document_text_keys
from tasks.corpus.sharded.shards import run_here, run_tokens_sharded
from tasks.corpus.sharded.token_memo import PART_KEYS


@pytest.fixture(scope="module")
def stages(data_mirror, tmp_path_factory):
    """The enwiki sample through segmentation, and its window tokens counted by the sharded stage
    (``tokens-sharded``: it keeps every document's text key)."""
    root = enwiki_sample_stages(tmp_path_factory.mktemp("keys"), data_mirror, segment=True)
    run_tokens_sharded(root / "ingest", root / "tokens-sharded", SegmentConfig(tokenizer="whitespace"), None, run_here, 40)
    return root


def _member(title: str, text: str) -> tuple[int, int]:
    return tuple(member_keys(pa.array([title]), text_keys([text]))[0].tolist())


def test_a_derived_key_changes_with_what_the_piece_depends_on():
    base = _member("Zürich", "The city's lake.")
    assert _member("Zürich", "The city's lake.") == base
    assert len({base, _member("Zurich", "The city's lake."), _member("Zürich", "The city's lake!"),
                _member("Zürich ", "The city's lake."), _member("", "Zürich The city's lake.")}) == 5
    member = np.array([base] * 4, np.uint64)
    got = window_keys(member, np.array([0, 1, 0, 1]), 100)
    assert np.array_equal(got[0], got[2]) and np.array_equal(got[1], got[3]) and not np.array_equal(got[0], got[1])
    assert not np.array_equal(window_keys(member[:1], np.array([0]), 50), got[:1])        # another window size
    assert not np.array_equal(got[:1], member[:1])                                         # not the member's own key
    with pytest.raises(ValueError, match="titles for"):
        member_keys(pa.array(["a", "b"]), text_keys(["x"]))


def test_distinct_documents_and_windows_give_distinct_keys():
    """The XOR mix is injective in practice: 100K random member keys × windows 0..9 at two window
    sizes, 2M keys, none equal (equal keys would give a passage another one's tokens)."""
    rng = np.random.default_rng(7)
    members = rng.integers(0, 2**64, size=(100_000, 2), dtype=np.uint64)
    docs = np.repeat(np.arange(members.shape[0]), 10)
    windows = np.tile(np.arange(10), members.shape[0])
    keys = np.concatenate([window_keys(members[docs], windows, pw) for pw in (100, 101)])
    assert distinct_keys(keys)[0].shape[0] == keys.shape[0]


def test_kept_and_hashed_text_keys_give_the_same_passage_keys(stages, tmp_path):
    """The passage token shards' keys (hence their entries) are the same whether the text keys come
    from the sharded tokens stage or are hashed from the documents (the one-process stage keeps
    none), and each passage's key is that of its own title and window of its document's text, the
    window read from its ``passage_id``."""
    docs = DOCUMENTS.read(stages / "ingest", columns=["doc_id", "title", "text"])
    rows = np.arange(docs.num_rows)
    kept = document_text_keys(stages / "tokens-sharded", rows, lambda: pytest.fail("the kept keys are read"))
    assert np.array_equal(kept, arrow_text_keys(docs.column("text")))
    assert np.array_equal(document_text_keys(stages / "tokens", rows, lambda: docs.column("text")), kept)

    def shard_keys(tokens_dir, work):
        plan = PassageTokenShards.plan(stages / "segment", stages / "cluster", stages / "ingest", BM25Config(), work,
                                       30_000, tokens_dir=tokens_dir)
        return [fn(*args)[1] for fn, *args in plan.calls]
    sharded = shard_keys(stages / "tokens-sharded", tmp_path / "a")
    assert len(sharded) > 3 and shard_keys(None, tmp_path / "b") == shard_keys(stages / "tokens", tmp_path / "c") == sharded

    passages = PASSAGES.read(stages / "segment", columns=["passage_id", "doc_id", "title", "text", "n_words"])
    run, windows = passage_windows(passages["doc_id"].to_numpy(), passages["n_words"].to_numpy(), 100, "passages")
    assert windows.tolist() == [int(p.rsplit(".p", 1)[1]) for p in passages["passage_id"].to_pylist()]
    by_id = dict(zip(docs["doc_id"].to_pylist(), docs["text"].to_pylist()))
    for i in np.random.default_rng(1).choice(passages.num_rows, 50, replace=False).tolist():   # the window is the passage
        assert article_windows(by_id[passages["doc_id"][i].as_py()], 100)[windows[i]] == passages["text"][i].as_py()


def test_cluster_token_shards_key_members_by_title_and_text_key_either_way(stages, tmp_path):
    """The cluster token shards' member keys (kept in each entry, the next memo's part) are
    :func:`member_keys` of the member's title and text key, in cluster order, and the shards' entry
    keys are the same from the kept text keys and from the texts hashed."""
    docs = DOCUMENTS.read(stages / "ingest", columns=["doc_id", "title", "text"])
    members = CLUSTER_MEMBERS.read(stages / "cluster")
    members = members.take(member_order(members["cluster_id"].to_numpy(), members["position"].to_numpy()))
    rows = rows_of(docs["doc_id"].to_numpy(), members["doc_id"].to_numpy(), "documents")
    expected = member_keys(docs.column("title"), arrow_text_keys(docs.column("text")))[rows]

    def shards(tokens_dir, work):
        plan = plan_cluster_tokens(stages / "ingest", stages / "cluster", BM25Config(), run_here, 30_000, work,
                                   tokens_dir=tokens_dir)
        try:
            return [fn(*args)[2] for fn, *args in plan.calls]
        finally:
            plan.split.close()
    kept = shards(stages / "tokens-sharded", tmp_path / "a")
    assert len(kept) > 3 and shards(None, tmp_path / "b") == kept
    got = np.concatenate([np.load(tmp_path / "a" / "cluster-tokens" / k / PART_KEYS) for k in kept])
    assert np.array_equal(got, expected)


def test_passages_that_are_not_windows_of_passage_words_are_refused():
    """A key stands for a passage's text only while the passage is that window: a window size the
    passages contradict, or a document's passages apart, is an error naming the row."""
    doc_ids, n_words = np.array([5, 5, 5, 9]), np.array([100, 100, 40, 7])
    run, windows = passage_windows(doc_ids, n_words, 100, "p")
    assert run.tolist() == [0, 0, 0, 1] and windows.tolist() == [0, 1, 2, 0]
    with pytest.raises(ValueError, match=r"p: row 0 \(document 5\) has 100 words, not a window of segment.passage_words = 50"):
        passage_windows(doc_ids, n_words, 50, "p")
    with pytest.raises(ValueError, match="row 1 .* has 90 words"):
        passage_windows(doc_ids, np.array([100, 90, 40, 7]), 100, "p")
    with pytest.raises(ValueError, match="row 3: the passages of document 5 are not consecutive"):
        passage_windows(np.array([5, 5, 9, 5]), np.array([100, 10, 7, 3]), 100, "p")


def test_the_window_rule_is_pinned_with_its_version(monkeypatch):
    """Passage keys stand for a window's text by (document, window, passage_words) and the rule's
    version: if :func:`article_windows` cuts or joins otherwise, this pin fails, and
    ``WINDOW_RULE_VERSION`` must change with it (else the token memos would hand old windows' ids to new texts)."""
    import hashlib

    from tasks.corpus.segment import WINDOW_RULE_VERSION
    from tasks.corpus.sharded import piece_keys

    text = "Alpha  beta\tgamma\u00a0delta\u2003eps\x1czeta\u200beta\nthêta  iota kappa\u3000lambda mu"
    windows = [article_windows(text, n) for n in (1, 3, 100)]
    assert windows[1] == ["Alpha beta gamma", "delta eps zeta\u200beta", "thêta iota kappa", "lambda mu"]
    assert (WINDOW_RULE_VERSION, hashlib.sha256(repr(windows).encode()).hexdigest()[:16]) == ("1", "f0aee3964515a372")
    members = np.array([[1, 2], [3, 4]], np.uint64)
    before = window_keys(members, np.array([0, 5]), 100)
    monkeypatch.setattr(piece_keys, "WINDOW_RULE_VERSION", "2")
    after = window_keys(members, np.array([0, 5]), 100)
    assert not (before == after).all(axis=1).any()   # another rule, other keys for every window
