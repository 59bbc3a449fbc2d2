"""``funnelrag compare`` on runs and registered model versions in a temporary MLflow SQLite."""
from __future__ import annotations

import io
import json

import mlflow
import pytest

from funnelrag.compare import Column, compare_main, compare_table, format_rows
from funnelrag.registry import register_model
from funnelrag.tracking import flow_run, log_metrics
from funnelrag.workspace import Workspace


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """Two evaluation-like runs and two versions of a registered model (champion, challenger)."""
    home = tmp_path_factory.mktemp("compare-home")
    ws = Workspace(home)
    runs = []
    for tag, ar4, secs in (("bm25", 0.41, 0.012), ("prog", 0.43, 0.31)):
        with flow_run(ws, "evaluate", f"evaluate-{tag}", {"corpus": "wikispeedia", "flat": {"n_retrieve": 400},
                                                           "setting": tag}) as run:
            log_metrics({f"{tag}.all.ar_4": ar4, "shared.all.ar_1": 0.2, "seconds_total": secs})
            runs.append(run.info.run_id)
    versions = []
    for tag, value in (("a", 0.50), ("b", 0.40)):
        d = home / f"model-{tag}"
        d.mkdir()
        (d / "preranker.json").write_text(json.dumps({"kind": "bi"}))
        with flow_run(ws, "distillation", f"distill-{tag}", {"lr": 1e-5 if tag == "a" else 2e-5}):
            versions.append(register_model(d, "cmp-preranker", config={}, data_version="d", metrics={"dev_ar": value},
                                           gate_metric="dev_ar"))
    return {"home": home, "runs": runs, "versions": versions}


def _run(argv) -> tuple[int, str]:
    out = io.StringIO()
    return compare_main(argv, out=out), out.getvalue()


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_two_runs_side_by_side(logged):
    r1, r2 = logged["runs"]
    code, text = _run([r1, r2, "--home", str(logged["home"])])
    assert code == 0
    lines = text.splitlines()
    assert "evaluate-bm25" in lines[0] and "evaluate-prog" in lines[0] and set(lines[1]) <= {"-", " "}
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["param.setting"] == ["*", "bm25", "prog"]             # differing params are marked
    assert rows["param.corpus"] == ["wikispeedia", "wikispeedia"]     # equal ones are not
    assert rows["metric.bm25.all.ar_4"] == ["*", "0.41", "–"]        # absent in one run
    assert rows["metric.shared.all.ar_1"] == ["0.2", "0.2"]
    widths = {len(line) for line in lines[2:] if line.split()[0].startswith("metric.")}
    assert len(lines[0]) >= max(widths)                              # columns are aligned under the header


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_filters_and_model_versions(logged):
    code, text = _run(["models:/cmp-preranker@champion", "models:/cmp-preranker/2", "--home", str(logged["home"]),
                       "--metrics", "dev_*", "--no-params"])
    assert code == 0
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[2:]}
    assert "cmp-preranker v1" in text.splitlines()[0] and "cmp-preranker v2" in text.splitlines()[0]
    assert rows["version.dev_ar"] == ["*", "0.5", "0.4"]
    assert rows["model.aliases"] == ["*", "champion", "challenger"]
    assert not any(k.startswith("param.") for k in rows) and "metric.gate.challenger" not in rows
    code, text = _run([*logged["runs"], "--home", str(logged["home"]), "--diff", "--no-params"])
    assert code == 0 and "shared.all.ar_1" not in text and "seconds_total" in text


@pytest.mark.slow  # MLflow SQLite store and model registry (module fixture)
def test_bad_reference_and_too_few(logged, capsys):
    code, _ = _run([logged["runs"][0], "no-such-run-id", "--home", str(logged["home"])])
    assert code == 2 and "no-such-run-id" in capsys.readouterr().err
    code, _ = _run([logged["runs"][0], "models:/cmp-preranker@nope", "--home", str(logged["home"])])
    assert code == 2
    with pytest.raises(SystemExit):
        compare_main([logged["runs"][0], "--home", str(logged["home"])])


def test_table_core_without_mlflow():
    cols = [Column("a", "A", "r" * 32, {"metric.x": 1.0, "param.p": "1"}),
            Column("b", "B", "s" * 32, {"metric.x": 1.0, "param.p": "2", "metric.y": 0.123456})]
    rows = compare_table(cols)
    assert rows[0] == ["key", "", "A [rrrrrrrr]", "B [ssssssss]"]
    assert rows[1:] == [["metric.x", "", "1", "1"], ["metric.y", "*", "–", "0.1235"], ["param.p", "*", "1", "2"]]
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
