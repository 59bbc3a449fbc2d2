"""The exact dense index against a direct computation on real passages and the real MiniLM."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
import torch.nn.functional as F

from funnelrag.datasets import resolve
from funnelrag.store import StageCache
from models.encoders import BiEncoder, EncoderConfig, encode, resolve_model_path
from tasks.evaluate.dense import DenseIndex, DenseIndexConfig, build_dense_index, encode_texts, model_fingerprint
from tasks.evaluate.stages import dense_index, dense_retriever, passage_texts_for_index

N_PASSAGES = 24
CFG = DenseIndexConfig(encoder=EncoderConfig(max_length=48), dtype="float32", batch_size=24, block_rows=7)


@pytest.fixture(scope="module")
def real(data_mirror):
    path = resolve("nq-open-oracle", data_mirror)
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(N_PASSAGES), fh)]
    model, tok = BiEncoder.from_pretrained(CFG.encoder)
    texts = [f"{r['ctxs'][0]['title']}. {r['ctxs'][0]['text']}" for r in records]
    ids = [f"p{i:03d}" for i in range(len(texts))]
    return {"questions": [r["question"] for r in records], "texts": texts, "ids": ids,
            "model": model, "tok": tok, "index": build_dense_index(texts, ids, model, tok, CFG)}


@pytest.mark.slow  # the real MiniLM encoder on real passages (module fixture)
def test_search_equals_direct_cosine_ranking(real):
    index = real["index"]
    q = encode_texts(real["model"], real["tok"], real["questions"][:8])              # (8, 384)
    ids, scores = index.search(q, k=5)
    # direct: embed again, cosine of every pair, full sort
    d = F.normalize(encode(real["model"], real["tok"], real["texts"]), dim=-1)       # (n, 384)
    qq = F.normalize(encode(real["model"], real["tok"], real["questions"][:8]), dim=-1)
    sims = (qq @ d.T).numpy()                                                         # (8, n)
    for i in range(8):
        order = np.argsort(-sims[i], kind="stable")[:5]
        assert ids[i] == [real["ids"][j] for j in order]
        np.testing.assert_allclose(scores[i], sims[i][order], atol=1e-5)
    # the gold passage of a question is usually its best match: the index is not vacuous
    top1 = sum(ids[i][0] == real["ids"][i] for i in range(8))
    assert top1 >= 5


@pytest.mark.slow  # the real MiniLM encoder on real passages (module fixture)
def test_float16_storage_keeps_rankings_and_halves_memory(real):
    f32 = real["index"]
    f16 = DenseIndex(f32.embeddings.astype(np.float16), f32.ids)
    assert f16.nbytes * 2 == f32.nbytes == N_PASSAGES * 384 * 4
    q = encode_texts(real["model"], real["tok"], real["questions"][:10])
    ids32, s32 = f32.search(q, 3)
    ids16, s16 = f16.search(q, 3)
    assert [r[0] for r in ids16] == [r[0] for r in ids32]
    np.testing.assert_allclose(s16, s32, atol=2e-3)


def test_ties_k_and_bad_input():
    emb = np.array([[1, 0], [0, 1], [1, 0], [0.6, 0.8]], dtype=np.float32)
    index = DenseIndex(emb, ["a", "b", "c", "d"], block_rows=1)
    ids, scores = index.search(np.array([[1.0, 0.0]]), k=10)                        # k > n
    assert ids == [["a", "c", "d", "b"]]                                             # tie a/c by row id
    np.testing.assert_allclose(scores[0], [1, 1, 0.6, 0], atol=1e-6)
    with pytest.raises(ValueError, match="normalised"):
        DenseIndex(np.array([[2.0, 0.0]], np.float32), ["x"])
    with pytest.raises(ValueError, match="unique"):
        DenseIndex(emb[:2], ["x", "x"])
    with pytest.raises(ValueError, match=r"\(n_queries, 2\)"):
        index.search(np.zeros((1, 3)), 1)


@pytest.mark.slow  # the real MiniLM encoder on real passages (module fixture)
def test_save_load_and_content_keyed_cache(real, tmp_path):
    import pyarrow as pa

    passages = pa.table({"passage_id": real["ids"][:6], "title": ["t"] * 6, "text": real["texts"][:6]})
    cfg = DenseIndexConfig(encoder=EncoderConfig(max_length=48), batch_size=16)
    fp = model_fingerprint(resolve_model_path("minilm"))
    cache = StageCache(tmp_path / "cache")
    first, info1 = dense_index(cache, "digest-a", passages, real["model"], real["tok"], fp, cfg)
    again, info2 = dense_index(cache, "digest-a", passages, real["model"], real["tok"], fp, cfg)
    other, info3 = dense_index(cache, "digest-b", passages, real["model"], real["tok"], fp, cfg)
    assert not info1["cache_hit"] and info2["cache_hit"] and not info3["cache_hit"]
    assert again.ids == first.ids and again.embeddings.dtype == np.float32            # upcast in memory
    stored = DenseIndex.load(cache.root / "dense-index" / next(p.name for p in (cache.root / "dense-index").iterdir()
                                                              if not p.name.startswith(".")))
    assert stored.embeddings.dtype == np.float16 and isinstance(stored.embeddings, np.memmap)    # float16 on disk
    np.testing.assert_array_equal(np.asarray(again.embeddings), np.asarray(first.embeddings))
    assert again.params["corpus_digest"] == "digest-a" and again.params["model"] == fp
    retrieve = dense_retriever(again, real["model"], real["tok"])
    assert retrieve(real["questions"][0], 3)[0] == real["ids"][0]
    assert passage_texts_for_index(passages)[0] == f"t. {real['texts'][0]}"
    with pytest.raises(FileNotFoundError, match="no model weights"):
        model_fingerprint(tmp_path)
