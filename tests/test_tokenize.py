"""Token counters (tasks.corpus.tokenize): T5's counts summed word by word equal whole-text encodings."""
from __future__ import annotations

import json
import tarfile

import numpy as np

from tasks.corpus import tokenize as T
from tasks.corpus.segment import article_windows
from tasks.corpus.tokenize import HFTokenizerCounter, counts_words_alone, load_token_counter

TRICKY = ["", " ", "plain words", "  leading and trailing  ", "tab\tnew\nline", "nbsp\u00a0ideographic\u3000space",
          "file\x1cseparator\x1fwords", "a\u2581b \u2581\u2581 x\u2581", "<extra_id_3>in<extra_id_0>side </s> <pad>x",
          "Ünïcödé naïve café 東京 😀 \u200bzero-width", "repeat " * 40]


def real_windows(data_mirror, n_articles: int = 120) -> list[str]:
    """~100-word windows of the first real Wikispeedia articles, as the corpus build cuts them."""
    texts = []
    with tarfile.open(data_mirror / "wikispeedia" / "wikispeedia_articles_plaintext.tar.gz") as tar:
        for member in tar:
            if member.isfile() and member.name.endswith(".txt"):
                texts.append(tar.extractfile(member).read().decode("utf-8"))
                if len(texts) == n_articles:
                    break
    return [w for t in texts for w in article_windows(t, 100)]


def test_t5_counts_word_by_word_equal_whole_encodings(data_mirror):
    counter = load_token_counter("t5", data_mirror)
    assert isinstance(counter, HFTokenizerCounter) and counter.by_word
    texts = [*TRICKY, *real_windows(data_mirror)]
    whole = counter.count_whole(texts)
    assert np.array_equal(counter.count(texts), whole) and whole.sum() > 100_000
    assert np.array_equal(counter.count(texts[::-1]), whole[::-1])          # kept word counts, same answers


def test_word_counts_are_dropped_past_the_bound_and_stay_exact(data_mirror, monkeypatch):
    counter = HFTokenizerCounter("t5", data_mirror / "t5-tokenizer" / "tokenizer.json")
    monkeypatch.setattr(T, "MAX_KEPT_WORDS", 50)
    texts = real_windows(data_mirror, 5)[:20]
    assert np.array_equal(counter.count(texts), counter.count_whole(texts))
    assert len(counter._word_tokens) <= max(50, len({w for t in texts for w in t.split()}))


def test_only_word_local_tokenizers_count_by_word(data_mirror):
    t5 = json.loads((data_mirror / "t5-tokenizer" / "tokenizer.json").read_text(encoding="utf-8"))
    assert counts_words_alone(t5)
    assert not counts_words_alone({**t5, "normalizer": {"type": "NFKC"}})
    assert not counts_words_alone({**t5, "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "first"}})
    first = {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Metaspace", "prepend_scheme": "first"}]}
    assert not counts_words_alone({**t5, "pre_tokenizer": first})
    assert not counts_words_alone({**t5, "pre_tokenizer": {"type": "ByteLevel"}})


def test_words_tokenized_by_the_model_alone_count_as_the_pipeline(data_mirror):
    """T5's words without special characters go through its Unigram model alone; the others (the
    Metaspace replacement, an added token's ``<``) through the whole pipeline: same counts."""
    path = data_mirror / "t5-tokenizer" / "tokenizer.json"
    assert T.model_word_prefix(json.loads(path.read_text(encoding="utf-8"))) == ("\u2581", "\u2581<")
    words = [w for t in [*TRICKY, *real_windows(data_mirror, 40)] for w in t.split()]
    model = HFTokenizerCounter("t5", path)
    pipeline = HFTokenizerCounter("t5", path)
    pipeline._model_words = None
    counts = model.count_words(words)
    assert np.array_equal(counts, pipeline.count_words(words)) and counts.sum() > 20_000
    assert np.array_equal(counts, model.count_whole(words))
    assert model.count_words([]).shape == (0,)


def test_window_counts_from_word_counts_equal_each_window_counted_whole(data_mirror):
    """The corpus build's window counts (:func:`tasks.corpus.segment.count_window_tokens`, summed
    from each document's word counts) equal each window's text encoded whole, across batches."""
    from tasks.corpus.segment import SegmentConfig, count_window_tokens

    texts = ["", *TRICKY, *real_windows(data_mirror, 30), "  "]
    cfg = SegmentConfig(passage_words=7, tokenizer="t5")
    counter = load_token_counter("t5", data_mirror)
    got = count_window_tokens(texts, cfg, counter, batch_windows=50)
    windows = [article_windows(t, 7) for t in texts]
    assert got.n_windows().tolist() == [len(w) for w in windows]
    assert got.n_tokens.tolist() == counter.count_whole([w for ws in windows for w in ws]).tolist()
