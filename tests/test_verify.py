"""Cache entries' digest manifests (funnelrag/verify.py): recorded when written, checked before a
read; a stage output with a fault is rebuilt; the first difference of two builds' files; and
``funnelrag build-corpus --verify`` on the real enwiki sample finds a planted corruption of
``current``'s tables."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from funnelrag.content_store import ContentMemo
from funnelrag.store import StageCache
from funnelrag.verify import DIGESTS_FILE, entry_problem, first_difference, record_digests, verified_entry


def _entry(root: Path) -> Path:
    entry = root / "entry"
    (entry / "sub").mkdir(parents=True)
    (entry / "a.npy").write_bytes(bytes(range(256)) * 8)
    (entry / "sub" / "b.txt").write_text("passage text\n")
    record_digests(entry)
    return entry


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


FAULTS = {
    "flip": (lambda e: _flip(e / "a.npy"), "other bytes"),
    "truncate": (lambda e: (e / "a.npy").write_bytes((e / "a.npy").read_bytes()[:100]), "truncated"),
    "delete": (lambda e: (e / "sub" / "b.txt").unlink(), "missing file sub/b.txt"),
    "unlisted file": (lambda e: (e / "extra.bin").write_bytes(b"x"), "extra.bin not in"),
    "no manifest": (lambda e: (e / DIGESTS_FILE).unlink(), "no digest manifest"),
    "bad manifest": (lambda e: (e / DIGESTS_FILE).write_text("{"), "unreadable"),
}


def test_a_recorded_entry_verifies(tmp_path):
    entry = _entry(tmp_path)
    body = json.loads((entry / DIGESTS_FILE).read_text())
    assert sorted(body["files"]) == ["a.npy", "sub/b.txt"] and body["files"]["a.npy"]["bytes"] == 2048
    assert entry_problem(entry) is None and verified_entry(entry) and entry.is_dir()
    assert not verified_entry(None) and not verified_entry(tmp_path / "absent")


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_faulty_entry_is_discarded_and_logged(tmp_path, fault, caplog):
    entry = _entry(tmp_path)
    plant, reason = FAULTS[fault]
    plant(entry)
    assert reason in entry_problem(entry)
    with caplog.at_level(logging.WARNING, logger="funnelrag.verify"):
        assert not verified_entry(entry)
    assert not entry.exists() and list(tmp_path.iterdir()) == []   # moved aside, then deleted
    assert f"cache entry {entry} discarded" in caplog.text and reason in caplog.text


def _build(calls: list[int]):
    def build(out: Path) -> dict:
        calls.append(1)
        pq.write_table(pa.table({"passage_id": ["p0", "p1"], "text": ["alpha", "beta"]}), out / "passages.parquet")
        return {"rows": 2}
    return build


@pytest.mark.parametrize("fault", ["flip", "truncate", "delete", "no manifest"])
def test_a_stage_output_with_a_fault_is_rebuilt(tmp_path, fault, caplog):
    cache, calls = StageCache(tmp_path / "cache"), []
    first = cache.run("segment", "k1", _build(calls))
    assert not first.cache_hit and cache.run("segment", "k1", _build(calls)).cache_hit and len(calls) == 1
    target = first.path / "passages.parquet"
    if fault == "flip":
        _flip(target)
    elif fault == "truncate":
        target.write_bytes(target.read_bytes()[:-7])
    elif fault == "delete":
        target.unlink()
    else:
        (first.path / DIGESTS_FILE).unlink()
    with caplog.at_level(logging.WARNING, logger="funnelrag.verify"):
        again = cache.run("segment", "k1", _build(calls))
    assert not again.cache_hit and len(calls) == 2 and again.files == first.files
    assert str(first.path) in caplog.text and entry_problem(again.path) is None


def test_a_content_store_entry_records_its_arrays_and_the_files_beside_them(tmp_path):
    keys = np.array([[1, 1], [5, 5]], np.uint64)
    ContentMemo.write(tmp_path / "memo", keys, {"terms": (np.array([0, 2, 3]), np.array([7, 8, 9], np.int32))},
                      extra={"rows.arrow": lambda path: path.write_bytes(b"rows of the memo")})
    assert entry_problem(tmp_path / "memo") is None
    assert sorted(json.loads((tmp_path / "memo" / DIGESTS_FILE).read_text())["files"]) == [
        "COMPLETE", "keys.npy", "rows.arrow", "terms.bounds.npy", "terms.data.npy"]
    _flip(tmp_path / "memo" / "rows.arrow")
    assert "other bytes" in entry_problem(tmp_path / "memo")


def test_first_difference_names_the_table_and_row(tmp_path):
    left, right = tmp_path / "left", tmp_path / "right"
    for side, third in ((left, "gamma"), (right, "gamma!")):
        side.mkdir()
        pq.write_table(pa.table({"doc_id": [0, 1], "title": ["A", "B"]}), side / "documents.parquet")
        pq.write_table(pa.table({"passage_id": ["p0", "p1", "p2"], "text": ["alpha", "beta", third]}),
                       side / "passages.parquet")
        np.save(side / "data.csc.index.npy", np.arange(10, dtype=np.float32) + (side == right) * (np.arange(10) == 6))
    files = lambda side, names: {n: side / n for n in names}  # noqa: E731
    names = ["documents.parquet", "passages.parquet", "data.csc.index.npy"]
    assert first_difference(files(left, names), files(right, names)) == {"file": "passages.parquet", "row": 2,
                                                                          "column": "text"}
    assert first_difference(files(left, names[:1]), files(right, names[:1])) is None
    assert first_difference(files(left, names[2:]), files(right, names[2:])) == {"file": "data.csc.index.npy",
                                                                                   "element": 6}
    assert first_difference(files(left, names[:1]), files(right, names[:2]))["missing"] == "left"
    (right / "odd.json").write_text('{"a": 2}')
    (left / "odd.json").write_text('{"a": 1}')
    assert first_difference(files(left, ["odd.json"]), files(right, ["odd.json"])) == {"file": "odd.json", "byte": 6}


def test_build_corpus_verify_finds_a_planted_corruption(prefect_harness, tmp_path, data_mirror, capsys):
    """``--no-cache`` publishes the cached build's content; ``--verify`` exits 0 while ``current``
    is intact and 1 with the table and row once a passage of ``current`` is changed."""
    from funnelrag.cli import main  # noqa: PLC0415  (imports the CLI's Prefect settings)

    home = tmp_path / "home"
    base = ["build-corpus", "--config", "configs/corpus_enwiki_sample.yaml", "--set", f"workspace.home={home}",
            "--set", f"workspace.data_mirror={data_mirror}", "--set", "gate.enabled=false"]
    assert main([*base, "--json", str(tmp_path / "built.json")]) == 0
    built = json.loads((tmp_path / "built.json").read_text())
    cache = home / "cache" / "corpus"
    entries = sorted(p.relative_to(cache) for p in cache.rglob("*"))
    assert main([*base, "--no-cache", "--json", str(tmp_path / "fresh.json")]) == 0
    assert json.loads((tmp_path / "fresh.json").read_text())["unchanged"] is True   # same content digest
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == entries   # the home's cache untouched
    assert main([*base, "--verify", "--json", str(tmp_path / "same.json")]) == 0
    assert json.loads((tmp_path / "same.json").read_text())["verify"]["same"] is True

    passages = Path(built["path"]) / "passages.parquet"
    table = pq.read_table(passages)
    texts = table.column("text").to_pylist()
    texts[17] = texts[17].replace("a", "u", 1)   # one letter, as the fault run's "auimal"
    field = table.schema.field("text")
    planted = table.set_column(table.schema.get_field_index("text"), field, pa.array(texts, field.type))
    passages.unlink()   # a hard link of the cache's file: the cache keeps the good bytes
    pq.write_table(planted, passages)
    assert main([*base, "--verify", "--json", str(tmp_path / "differs.json")]) == 1
    found = json.loads((tmp_path / "differs.json").read_text())["verify"]
    assert found["same"] is False and found["current"] == built["version"]
    assert found["first_difference"] == {"file": "passages.parquet", "row": 17, "column": "text"}
