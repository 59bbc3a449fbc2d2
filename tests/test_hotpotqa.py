"""HotpotQA loader: the real IRCoT subsample, the original JSON format, errors and the split."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from funnelrag.datasets import resolve
from tasks.dr_rag.hotpotqa import (HotpotQAFormatError, QARecord, SplitConfig, load_hotpotqa,
                            read_hotpotqa, split_train_dev)


@pytest.fixture(scope="module")
def hotpot_path(data_mirror) -> Path:
    return resolve("hotpotqa-dev-subsampled", data_mirror)


@pytest.fixture(scope="module")
def records(hotpot_path) -> list[QARecord]:
    return load_hotpotqa(hotpot_path)


def test_real_file_loads_every_record(hotpot_path, records):
    n_lines = sum(1 for line in open(hotpot_path, encoding="utf-8") if line.strip())
    assert len(records) == n_lines
    assert len({r.question_id for r in records}) == len(records)
    raw = [json.loads(line) for line in open(hotpot_path, encoding="utf-8")]
    for rec, obj in zip(records, raw):
        assert rec.question_id == obj["question_id"]
        assert rec.question == obj["question_text"]
        assert list(rec.answers) == [s for a in obj["answers_objects"] for s in a["spans"]]
        assert [(p.title, p.text, p.is_supporting) for p in rec.paragraphs] == [
            (c["title"], c["paragraph_text"], c["is_supporting"]) for c in obj["contexts"]]
    # HotpotQA: every question has exactly two supporting paragraphs.
    assert all(len(r.supporting) == 2 for r in records)


def test_original_hotpotqa_format(tmp_path):
    obj = {"_id": "q1", "question": "Which band?", "answer": "Muse",
           "context": [["Muse (band)", ["Muse are a band.", " From Teignmouth."]],
                       ["Other", ["Unrelated."]],
                       ["Teignmouth", ["A town in Devon."]]],
           "supporting_facts": [["Muse (band)", 0], ["Teignmouth", 0]]}
    array_file = tmp_path / "hotpot.json"
    array_file.write_text(json.dumps([obj]))
    lines_file = tmp_path / "hotpot.jsonl"
    lines_file.write_text(json.dumps(obj) + "\n")
    for path in (array_file, lines_file):
        (rec,) = load_hotpotqa(path)
        assert rec.question_id == "q1" and rec.answers == ("Muse",)
        assert [p.title for p in rec.supporting] == ["Muse (band)", "Teignmouth"]
        assert rec.paragraphs[0].text == "Muse are a band.  From Teignmouth."


def test_errors_name_file_and_line(tmp_path, hotpot_path):
    good = open(hotpot_path, encoding="utf-8").readline()
    bad = json.loads(good)
    del bad["contexts"]
    path = tmp_path / "bad.jsonl"
    path.write_text(good + json.dumps(bad) + "\n" + "{not json\n")
    with pytest.raises(HotpotQAFormatError, match=r"bad\.jsonl line 2: missing field 'contexts'"):
        load_hotpotqa(path)
    data = read_hotpotqa(path, skip_invalid=True)
    assert len(data.records) == 1
    assert [w for w, _ in data.skipped] == ["line 2", "line 3"]
    dup = tmp_path / "dup.jsonl"
    dup.write_text(good + good)
    with pytest.raises(HotpotQAFormatError, match="line 2: question_id .* repeats"):
        load_hotpotqa(dup)


def test_split_is_deterministic_and_order_free(records):
    cfg = SplitConfig(seed=3, dev_fraction=0.2)
    train, dev = split_train_dev(records, cfg)
    assert len(train) + len(dev) == len(records)
    assert not {r.question_id for r in train} & {r.question_id for r in dev}
    assert 0.1 * len(records) < len(dev) < 0.3 * len(records)
    train_rev, dev_rev = split_train_dev(list(reversed(records)), cfg)
    assert {r.question_id for r in dev_rev} == {r.question_id for r in dev}
    # A subset keeps each question on its side.
    _, dev_half = split_train_dev(records[:100], cfg)
    assert {r.question_id for r in dev_half} == {r.question_id for r in dev} & {r.question_id for r in records[:100]}
    _, dev_other = split_train_dev(records, SplitConfig(seed=4, dev_fraction=0.2))
    assert {r.question_id for r in dev_other} != {r.question_id for r in dev}
    with pytest.raises(ValueError):
        split_train_dev(records, SplitConfig(dev_fraction=1.5))
