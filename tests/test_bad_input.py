"""Bad input never passes quietly (fault injection: bad question files, empty or corrupt dumps)."""
from __future__ import annotations

import ast
import bz2
import csv
import functools
import stat

import pytest

from data_contracts.corpus import DOCUMENTS
from flows.corpus_build import CorpusBuildConfig, corpus_build_flow
from flows.evaluate import EvaluateConfig
from funnelrag.config import load_config
from tasks.corpus import stages as corpus_stages
from tasks.sources.ingest import IngestError
from tasks.sources.ingest.mediawiki import MediaWikiReader
from tasks.qa.questions import QuestionsConfig, load_questions, read_questions

DUMP = "enwiki-sample/enwiki-20160501-pages-articles-shortened.xml.bz2"
NO_PAGES = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10">\n'
            "<siteinfo><sitename>Wikipedia</sitename></siteinfo>\n</mediawiki>\n")


# ---- 1. empty questions file
@pytest.mark.parametrize("content", ["", "\n\n  \n"], ids=["zero-bytes", "blank-lines"])
def test_empty_questions_file_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "questions.tsv"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"questions: no question in .*questions\.tsv"):
        load_questions([path])


# ---- 5. format named by the error message is accepted
def test_questions_format_named_in_the_error_is_accepted(tmp_path):
    path = tmp_path / "questions.dat"
    path.write_text("who wrote the origin of species\t['Charles Darwin']\n")
    with pytest.raises(ValueError, match=r"--set questions\.format=tsv"):
        load_questions([path])
    cfg = load_config(EvaluateConfig, None, ["questions.format=tsv", f"questions.paths=[{path}]", "questions.datasets=[]"])
    table, _ = load_questions(cfg.questions.paths, QuestionsConfig(format=cfg.questions.format))
    assert table["answers"].to_pylist() == [["Charles Darwin"]]
    with pytest.raises(ValueError, match=r"distill --set split\.format=tsv"):
        load_questions([path])
    from flows.funnel import DistillationConfig  # noqa: PLC0415
    distill = load_config(DistillationConfig, None, ["split.format=tsv"])
    table, _ = load_questions([path], distill.split)
    assert table["question"].to_pylist() == ["who wrote the origin of species"]


# ---- 6. DPR's own qa.csv
def test_dpr_qa_csv_is_read_as_dpr_reads_it(tmp_path):
    path = tmp_path / "trivia-test.qa.csv"
    records = [('Who wrote "Babbitt"?', ["Sinclair Lewis", "Harry Sinclair Lewis"]),
               ("what is the capital of france", ["Paris"])]
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, delimiter="\t")
        for q, answers in records:
            writer.writerow([q, str(answers).replace("'", '"')])  # JSON-style quotes → CSV-quoted field
    assert '"[""Sinclair Lewis""' in path.read_text()
    rows = read_questions(path)
    assert [(r["question"], r["answers"]) for r in rows] == [(q, a) for q, a in records]
    with open(path, newline="", encoding="utf-8") as fh:  # DPR's reader (dpr/data/qa_validation)
        dpr = [(row[0], ast.literal_eval(row[1])) for row in csv.reader(fh, delimiter="\t")]
    assert dpr == [(r["question"], r["answers"]) for r in rows]


def test_real_nq_open_reads_the_same_as_dpr_csv(data_mirror):
    path = data_mirror / "nq-open" / "nq-open-test.tsv"
    as_tsv = read_questions(path, QuestionsConfig(format="tsv"))
    as_csv = read_questions(path, QuestionsConfig(format="dpr-csv"))
    assert len(as_tsv) == 3610
    assert [(r["question"], r["answers"]) for r in as_csv] == [(r["question"], r["answers"]) for r in as_tsv]


# ---- 5. corrupt and empty dumps say what is wrong with the file
def test_empty_dump_file_is_reported_as_empty(tmp_path):
    empty = tmp_path / "enwiki-empty.xml.bz2"
    empty.write_bytes(b"")
    with pytest.raises(IngestError, match=r"enwiki-empty\.xml\.bz2: the file is empty \(0 bytes\)"):
        list(MediaWikiReader(empty).pages())
    hollow = tmp_path / "enwiki-hollow.xml.bz2"
    hollow.write_bytes(bz2.compress(b""))
    with pytest.raises(IngestError, match=r"decompresses to 0 bytes"):
        list(MediaWikiReader(hollow).pages())


@pytest.mark.slow  # recompresses the whole enwiki sample (bz2 -9)
def test_corrupt_bz2_block_is_reported_as_corrupt_compressed_data(tmp_path, data_mirror):
    raw = bz2.decompress((data_mirror / DUMP).read_bytes())
    data = bytearray(bz2.compress(raw, 9))
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of a block
    bad = tmp_path / "enwiki-bad-block.xml.bz2"
    bad.write_bytes(bytes(data))
    with pytest.raises(IngestError, match=r"enwiki-bad-block\.xml\.bz2: compressed data is corrupt \(Invalid data stream\)"):
        list(MediaWikiReader(bad).pages())


# ---- 2 and 3. a dump without pages; deterministic errors are not retried
@pytest.mark.parametrize("content, error", [(NO_PAGES, r"ingest: 0 documents in .*no-pages\.xml: no page/record at all"),
                                            ("<mediawiki><page><title>A</title>", r"malformed XML")],
                         ids=["no-pages", "malformed-xml"])
def test_bad_dump_fails_once_with_a_clear_error(prefect_harness, workspace_home, data_mirror, tmp_path, monkeypatch,
                                                content, error):
    dump = tmp_path / "no-pages.xml"
    dump.write_text(content)
    calls = []
    real = corpus_stages.run_ingest

    @functools.wraps(real)  # keeps the @stage declaration the cache reads
    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(corpus_stages, "run_ingest", counting)
    cfg = CorpusBuildConfig.model_validate({
        "name": "broken", "source": {"datasets": [], "paths": [str(dump)]}, "ingest": {"format": "mediawiki"},
        "workspace": {"home": workspace_home, "data_mirror": data_mirror}})
    with pytest.raises((ValueError, IngestError), match=error):
        corpus_build_flow(cfg)
    assert len(calls) == 1  # read once: a full dump is not read a second time to fail the same way


# ---- 0644 for streamed writes too
def test_streamed_parquet_is_world_readable(tmp_path):
    with DOCUMENTS.open_writer(tmp_path) as writer:
        writer.write({"doc_id": [0], "title": ["A"], "text": ["alpha"], "page_id": [1], "source": ["x.xml"]})
    assert stat.S_IMODE((tmp_path / "documents.parquet").stat().st_mode) == 0o644
