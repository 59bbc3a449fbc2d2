"""``funnelrag compare`` on runs and registered model versions in a temporary MLflow SQLite."""
from __future__ import annotations

import io
import json

import mlflow
import pytest

from funnelrag.compare import Column, compare_main, compare_table, format_rows
from funnelrag.compare import NO_DIFFERENCE, better_direction, paired_rows
from funnelrag.registry import link_model_versions, register_model
from funnelrag.tracking import flow_run, log_metrics, log_question_scores, question_scores_table
from funnelrag.workspace import Workspace


def _hits(n: int, every: int, extra: int = 0) -> dict[str, float]:
    """``{question id: 0/1}``: question i answered when ``i % every == 0`` or ``i % every == extra``."""
    return {f"nq:{i:06d}": float(i % every == 0 or (extra and i % every == extra)) for i in range(n)}


def _log_scores(home, scores: dict[str, dict[str, float]]) -> None:
    texts = {q: f"question {q}?" for m in scores.values() for q in m}
    log_question_scores(question_scores_table(scores, texts), home / "scores" / mlflow.active_run().info.run_id)


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Two evaluation-like runs on the same 200 questions (per-question results logged), one on
    other questions, and two versions of a registered model (champion, challenger) whose runs
    logged their dev results; an evaluation of v2 attached its figures to v2's logged model."""
    home = tmp_path_factory.mktemp("compare-home")
    ws = Workspace(home)
    runs = []
    for tag, ar4, secs, extra in (("bm25", 0.41, 0.012, 0), ("prog", 0.43, 0.31, 1)):
        with flow_run(ws, "evaluate", f"evaluate-{tag}", {"corpus": "wikispeedia", "flat": {"n_retrieve": 400},
                                                           "setting": tag}) as run:
            log_metrics({f"{tag}.all.ar_4": ar4, "shared.all.ar_1": 0.2, "seconds_total": secs,
                         "passages": 22540.0 if tag == "bm25" else 275911.0})
            _log_scores(home, {"shared.all.ar_4": _hits(200, 4, extra), "shared.all.ar_1": _hits(200, 5)})
            runs.append(run.info.run_id)
    with flow_run(ws, "evaluate", "evaluate-other-questions", {"setting": "x"}) as run:
        _log_scores(home, {"shared.all.ar_4": _hits(150, 4)})
        other = run.info.run_id
    versions = []
    for tag, value, extra in (("a", 0.25, 0), ("b", 0.50, 1)):
        d = home / f"model-{tag}"
        d.mkdir()
        (d / "preranker.json").write_text(json.dumps({"kind": "bi"}))
        with flow_run(ws, "distillation", f"distill-{tag}", {"lr": 1e-5 if tag == "a" else 2e-5}):
            _log_scores(home, {"evaluate.after_ar_at_8": _hits(300, 4, extra)})
            versions.append(register_model(d, "cmp-preranker", config={}, data_version="d", metrics={"dev_ar": value},
                                           gate_metric="dev_ar"))
    with flow_run(ws, "evaluate", "evaluate-v2", {}):
        link_model_versions([("cmp-preranker", "2")], {"prog.all.ar_4": 0.47, "questions": 12345.0})
    return {"home": home, "runs": runs, "other": other, "versions": versions}


def _run(argv) -> tuple[int, str]:
    out = io.StringIO()
    return compare_main(argv, out=out), out.getvalue()


def _side_by_side(text: str) -> list[str]:
    """The lines of the side-by-side table (after the paired table, when there is one)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("key "))
    return lines[start:]


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_two_runs_side_by_side(logged):
    r1, r2 = logged["runs"]
    code, text = _run([r1, r2, "--home", str(logged["home"])])
    assert code == 0
    lines = _side_by_side(text)
    assert "evaluate-bm25" in lines[0] and "evaluate-prog" in lines[0] and set(lines[1]) <= {"-", " "}
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["param.setting"] == ["*", "bm25", "prog"]             # differing params are marked
    assert rows["param.corpus"] == ["wikispeedia", "wikispeedia"]     # equal ones are not
    assert rows["metric.bm25.all.ar_4"] == ["*", "0.41", "–", "↑"]    # absent in one run: no difference
    assert rows["metric.shared.all.ar_1"] == ["0.2", "0.2", "↑"]
    assert rows["metric.seconds_total"] == ["*", "0.012", "0.31", "+0.298", "↓"]   # difference, lower is better
    assert rows["metric.passages"] == ["*", "22,540", "275,911", "+2.534e+05"]     # counts as integers
    widths = {len(line) for line in lines[2:] if line.split()[0].startswith("metric.")}
    assert len(lines[0]) >= max(widths)                              # columns are aligned under the header


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_two_runs_paired_on_the_same_questions(logged):
    """The per-question results of both runs: difference, 95% interval, n and the verdict."""
    code, text = _run([*logged["runs"], "--home", str(logged["home"]), "--no-params"])
    assert code == 0 and text.startswith("Paired on the same questions: A = evaluate-bm25, B = evaluate-prog")
    paired = {line.split()[0]: line for line in text.splitlines()[3:] if line.startswith("shared.")}
    ar1, ar4 = paired["shared.all.ar_1"].split(), paired["shared.all.ar_4"].split()
    assert ar1[1:7] == ["↑", "0.2", "0.2", "+0", "[+0,", "+0]"] and ar1[7] == "200" and NO_DIFFERENCE in paired[
        "shared.all.ar_1"]
    assert ar4[1:5] == ["↑", "0.25", "0.5", "+0.25"] and ar4[7] == "200" and "evaluate-prog better" in paired[
        "shared.all.ar_4"]
    low, high = float(ar4[5].strip("[,")), float(ar4[6].strip("]"))
    assert 0.15 < low < 0.25 < high < 0.35


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_different_question_sets_are_refused_unless_unpaired(logged, capsys):
    code, _ = _run([logged["runs"][0], logged["other"], "--home", str(logged["home"])])
    err = capsys.readouterr().err
    assert code == 2 and "shared.all.ar_4" in err and "question sets differ" in err and "200 vs 150" in err
    code, text = _run([logged["runs"][0], logged["other"], "--home", str(logged["home"]), "--unpaired"])
    assert code == 0 and "Paired" not in text and text.startswith("key ")


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_filters_and_model_versions(logged):
    code, text = _run(["models:/cmp-preranker/1", "models:/cmp-preranker@champion", "--home", str(logged["home"]),
                       "--no-params"])
    assert code == 0
    assert "A = cmp-preranker v1, B = cmp-preranker v2" in text.splitlines()[0]
    row = next(line for line in text.splitlines() if line.startswith("evaluate.after_ar_at_8"))
    assert "+0.25" in row and "300" in row and "cmp-preranker v2 better" in row
    lines = _side_by_side(text)
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert "cmp-preranker v1" in lines[0] and "cmp-preranker v2" in lines[0]
    assert rows["version.dev_ar"] == ["*", "0.25", "0.5", "+0.25", "↑"]
    assert rows["model.aliases"] == ["*", "–", "challenger,champion"]
    # the figures an evaluation attached to v2's logged model, counts with separators
    assert rows["model.prog.all.ar_4"] == ["*", "–", "0.47", "↑"] and rows["model.questions"] == ["*", "–", "12,345"]
    assert "metric.gate.challenger" in rows
    code, text = _run(["models:/cmp-preranker/1", "models:/cmp-preranker/2", "--home", str(logged["home"]),
                       "--metrics", "dev_*", "--no-params"])
    rows = {line.split()[0]: line.split()[1:] for line in _side_by_side(text)[2:]}
    assert "version.dev_ar" in rows and "metric.gate.challenger" not in rows and "model.questions" not in rows
    assert "No per-question results" in text    # the filter left no paired metric
    code, text = _run([*logged["runs"], "--home", str(logged["home"]), "--diff", "--no-params", "--unpaired"])
    assert code == 0 and "shared.all.ar_1" not in text and "seconds_total" in text


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_bad_reference_and_too_few(logged, capsys):
    code, _ = _run([logged["runs"][0], "no-such-run-id", "--home", str(logged["home"])])
    assert code == 2 and "no-such-run-id" in capsys.readouterr().err
    code, _ = _run([logged["runs"][0], "models:/cmp-preranker@nope", "--home", str(logged["home"])])
    assert code == 2
    with pytest.raises(SystemExit):
        compare_main([logged["runs"][0], "--home", str(logged["home"])])


def test_direction_of_better_and_paired_rows_without_mlflow():
    assert [better_direction(m) for m in ("prog.all.ar_4", "reader_eval.em", "seconds_total", "train/loss",
                                          "prog.all.seconds_per_query", "entropy_top4", "dev_pair_auc",
                                          "evaluate.after_ar_at_3.n")] == ["↑", "↑", "↓", "↓", "↓", "", "↑", ""]
    a = Column("a", "A", "r" * 32, scores={"x.seconds": {"q1": 1.0, "q2": 1.0, "q3": 1.0}},
               questions={"q1": "one?", "q2": "two?", "q3": "three?"})
    b = Column("b", "B", "s" * 32, scores={"x.seconds": {"p1": 3.0, "p2": 3.0, "p3": 3.0}},
               questions={"p1": "one?", "p2": "two?", "p3": "three?"})       # other ids, same texts: paired by text
    rows = paired_rows(a, b)
    assert rows[1] == ["x.seconds", "↓", "1", "3", "+2", "[+2, +2]", "3", "A better"]


def test_table_core_without_mlflow():
    cols = [Column("a", "A", "r" * 32, {"metric.x": 1.0, "param.p": "1"}),
            Column("b", "B", "s" * 32, {"metric.x": 1.0, "param.p": "2", "metric.y": 0.123456})]
    rows = compare_table(cols)
    assert rows[0] == ["key", "", "A [rrrrrrrr]", "B [ssssssss]", "B − A", "better"]
    assert rows[1:] == [["metric.x", "", "1", "1", "", ""], ["metric.y", "*", "–", "0.1235", "", ""],
                        ["param.p", "*", "1", "2", "", ""]]
    text = format_rows(rows)
    assert text.splitlines()[2].startswith("metric.x") and len({len(x) for x in text.splitlines()[:2]}) == 1
    assert mlflow.active_run() is None


def test_long_values_are_cut_unless_asked_for_whole():
    """A config logged as one param printed 1,100-character lines."""
    long_value = json.dumps({"progressive": [{"n_clusters": i, "n_units": 8} for i in range(40)]})
    cols = [Column("a", "A", "r" * 32, {"param.config": long_value}), Column("b", "B", "s" * 32, {"param.config": "{}"})]
    rows = compare_table(cols)
    short = format_rows(rows)
    assert max(len(line) for line in short.splitlines()) <= 100
    assert long_value[:39] + "…" in short
    assert long_value in format_rows(rows, max_cell=0)
