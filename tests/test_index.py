"""bm25s indexes: same scores as bm25s called directly, the query path uses the index's own
tokenizer (stemmer + stop words), atomic and deterministic saves."""
import bz2
import re

import bm25s
import numpy as np
import pytest
import Stemmer

from funnelrag import datasets
from tasks.corpus.index import BM25Config, BM25Index


@pytest.fixture(scope="module")
def enwiki_texts(data_mirror):
    """Real article chunks: the enwiki sample's page texts split into ~300-word pieces."""
    raw = bz2.decompress(datasets.resolve("enwiki-sample", data_mirror).read_bytes()).decode()
    words = re.sub(r"<[^>]+>|\{\{[^}]*\}\}|\[\[|\]\]|'''?", " ", raw).split()
    return [" ".join(words[i:i + 300]) for i in range(0, min(len(words), 300 * 200), 300)]


def test_scores_equal_bm25s_called_directly(enwiki_texts):
    cfg = BM25Config()
    ids = [f"d{i}" for i in range(len(enwiki_texts))]
    index = BM25Index.build(enwiki_texts, ids, cfg)
    stem = Stemmer.Stemmer("english").stemWords
    ref = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
    ref.index(bm25s.tokenize(enwiki_texts, stopwords="en", stemmer=stem, show_progress=False), show_progress=False)
    queries = ["the history of anarchism in spain", "albedo of the surface", "alabama state capital"]
    got_ids, got_scores = index.search(queries, k=10)
    qt = bm25s.tokenize(queries, stopwords="en", stemmer=stem, return_ids=False, show_progress=False)
    ref_rows, ref_scores = ref.retrieve(qt, k=10, show_progress=False)
    np.testing.assert_allclose(got_scores, ref_scores, rtol=1e-6)
    for row_ids, row_ref, scores in zip(got_ids, ref_rows, ref_scores):
        # same documents at each distinct score (ties may be ordered differently)
        assert sorted(row_ids) == sorted(ids[r] for r in row_ref) or len(set(scores.tolist())) < len(scores)
    assert got_scores[0, 0] > 0


def test_query_path_uses_the_index_stemmer(tmp_path):
    texts = ["the runner was running in the marathon races", "a quiet library with many books", "cooking pasta"]
    index = BM25Index.build(texts, ["run", "lib", "cook"], BM25Config(stemmer="english"))
    index.save(tmp_path / "ix")
    loaded = BM25Index.load(tmp_path / "ix")
    ids, scores = loaded.search(["runs race"], k=1)  # only matches through the stemmer
    assert ids == [["run"]] and scores[0, 0] > 0
    plain = BM25Index.build(texts, ["run", "lib", "cook"], BM25Config(stemmer=None))
    _, s = plain.search(["runs race"], k=1)
    assert s[0, 0] == 0  # without stemming the same query finds nothing


def test_save_is_deterministic_and_load_matches(tmp_path, enwiki_texts):
    texts = enwiki_texts[:200]
    ids = [str(i) for i in range(len(texts))]
    a = BM25Index.build(texts, ids).save(tmp_path / "a")
    b = BM25Index.build(texts, ids).save(tmp_path / "b")
    for f in sorted(p.name for p in a.iterdir()):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    loaded = BM25Index.load(a, mmap=True)
    q = ["political philosophy"]
    assert loaded.search(q, 5)[0] == BM25Index.build(texts, ids).search(q, 5)[0]


def test_bad_build_and_missing_index(tmp_path):
    with pytest.raises(ValueError, match="2 texts but 1 ids"):
        BM25Index.build(["a b", "c d"], ["x"])
    with pytest.raises(ValueError, match="not unique"):
        BM25Index.build(["a b", "c d"], ["x", "x"])
    with pytest.raises(FileNotFoundError, match="tokenizer.index.json"):
        BM25Index.load(tmp_path)


def test_empty_and_unknown_queries_are_deterministic():
    index = BM25Index.build(["alpha beta", "gamma delta", "epsilon"], ["a", "b", "c"])
    ids, scores = index.search(["", "zzzz unknown"], k=3)
    assert ids == [["a", "b", "c"], ["a", "b", "c"]] and not scores.any()


@pytest.mark.slow  # builds and saves the index in two fresh interpreters (PYTHONHASHSEED)
def test_saved_index_is_byte_identical_across_hash_seeds(tmp_path, enwiki_texts):
    """bm25s numbers stems through a set, whose order follows PYTHONHASHSEED: two processes must
    still write the same bytes (the nightly build's content digest depends on it)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = tmp_path / "texts.json"
    src.write_text(json.dumps(enwiki_texts[:150]))
    repo = Path(__file__).resolve().parents[1]
    script = ("import json, sys; from tasks.corpus.index import BM25Index; t = json.load(open(sys.argv[1])); "
              "BM25Index.build(t, [str(i) for i in range(len(t))]).save(sys.argv[2])")
    outs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed,
               "PYTHONPATH": os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])}
        out = tmp_path / f"seed{seed}"
        subprocess.run([sys.executable, "-c", script, str(src), str(out)], env=env, cwd=repo, check=True,
                       capture_output=True, timeout=300)
        outs.append(out)
    names = sorted(p.name for p in outs[0].iterdir())
    assert names == sorted(p.name for p in outs[1].iterdir()) and "vocab.index.json" in names
    for f in names:
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes(), f
