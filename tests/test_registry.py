"""Model registry on a temporary MLflow SQLite: versions, aliases, the champion/challenger gate."""
from __future__ import annotations

import json

import pytest

from funnelrag.registry import (CHALLENGER, CHAMPION, champion_version, clears_margin, download_model, find_version,
                                gate_gain, model_uri, register_model)
from funnelrag.tracking import flow_run
from funnelrag.workspace import Workspace

NAME = "test-preranker"


pytestmark = pytest.mark.slow  # one MLflow SQLite store for the module: creating its tables takes ~10 s here


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """One MLflow SQLite for the module (creating its tables takes seconds); tests use own names."""
    return Workspace(tmp_path_factory.mktemp("registry-home"))


def _model_dir(tmp_path, tag: str):
    d = tmp_path / f"model-{tag}"
    d.mkdir()
    (d / "weights.txt").write_text(f"weights of {tag}\n")
    (d / "preranker.json").write_text(json.dumps({"kind": "bi", "tag": tag}))
    return d


def _register(ws, tmp_path, tag, value, name=NAME, **kw):
    with flow_run(ws, "registry-test", f"run-{tag}", {"tag": tag}):
        return register_model(_model_dir(tmp_path, tag), name, config={"tag": tag}, data_version="sha-" + tag,
                              metrics={"dev_ar": value, "other": 1.0}, gate_metric="dev_ar", **kw)


def test_gate_keeps_champion_when_worse_or_tied_and_promotes_when_better(ws, tmp_path):
    first = _register(ws, tmp_path, "a", 0.50)
    assert first.promoted and first.reason == "no_champion" and first.version == "1"

    worse = _register(ws, tmp_path, "b", 0.40)
    assert not worse.promoted and worse.reason == "worse"
    assert (worse.champion_version, worse.champion_value, worse.challenger_value) == ("1", 0.50, 0.40)
    assert str(champion_version(NAME).version) == "1"
    assert str(champion_version(NAME, CHALLENGER).version) == "2"

    equal = _register(ws, tmp_path, "c", 0.50)    # a tie never promotes (it used to: "not worse")
    assert not equal.promoted and equal.reason == "no_measurable_gain" and equal.gain == 0.0 and equal.n is None
    assert str(champion_version(NAME).version) == "1"

    # a champion value re-measured on the same dev data overrides the recorded one
    fresh = _register(ws, tmp_path, "d", 0.45, champion_value=0.44)
    assert fresh.promoted and fresh.reason == "better" and fresh.champion_value == 0.44
    champ = champion_version(NAME)
    assert str(champ.version) == "4" and champ.tags["data_version"] == "sha-d"
    assert json.loads(champ.tags["gate"])["reason"] == "better"
    lower_is_better = _register(ws, tmp_path, "e", 0.46, higher_is_better=False)
    assert not lower_is_better.promoted and str(champion_version(NAME).version) == "4"


def _scores(hits):
    return {f"q{i:03d}": float(h) for i, h in enumerate(hits)}


def test_paired_gate_identical_challengers_stay_challengers_and_a_clearly_better_one_is_promoted(ws, tmp_path):
    """Per-question dev results decide: two challengers identical to the champion are not
    promoted (interval [0, 0]), with the reason in the decision and the version's description;
    one that answers 75 more of 300 questions and loses none is."""
    from mlflow import MlflowClient

    name = "test-paired-gate"
    champ_hits = [i % 4 == 0 for i in range(300)]                      # AR 0.25
    _register(ws, tmp_path, "p0", 0.25, name=name)
    for tag in ("p1", "p2"):
        same = _register(ws, tmp_path, tag, 0.25, name=name, challenger_scores=_scores(champ_hits),
                         champion_scores=_scores(champ_hits))
        assert not same.promoted and same.reason == "no_measurable_gain"
        assert (same.gain, same.gain_low, same.gain_high, same.n) == (0.0, 0.0, 0.0, 300)
        desc = MlflowClient().get_model_version(name, same.version).description
        assert "not promoted: no measurable gain" in desc and "n=300" in desc and "[+0.0000, +0.0000]" in desc
    assert str(champion_version(name).version) == "1"
    better_hits = [h or i % 4 == 1 for i, h in enumerate(champ_hits)]   # AR 0.50: 75 more questions, none lost
    better = _register(ws, tmp_path, "p3", 0.50, name=name, challenger_scores=_scores(better_hits),
                       champion_scores=_scores(champ_hits), margin=0.1)
    assert better.promoted and better.reason == "better" and better.n == 300
    assert better.gain == pytest.approx(0.25) and 0.1 <= better.gain_low < 0.25 < better.gain_high
    assert str(champion_version(name).version) == better.version
    mv = MlflowClient().get_model_version(name, better.version)
    assert "promoted: the lower bound clears the margin 0.1" in mv.description and "over champion v1" in mv.description
    assert json.loads(mv.tags["gate"])["gain_low"] == better.gain_low
    run = MlflowClient().get_run(mv.run_id)
    assert run.data.metrics["gate.n"] == 300 and run.data.metrics["gate.gain_low"] == pytest.approx(better.gain_low)
    with pytest.raises(ValueError, match="question sets differ"):
        _register(ws, tmp_path, "p4", 0.5, name=name, challenger_scores=_scores(better_hits[:10]),
                  champion_scores=_scores(champ_hits))


def test_gate_rule_and_gain_direction():
    assert not clears_margin(0.0) and clears_margin(1e-9) and not clears_margin(0.02, 0.05) and clears_margin(0.05, 0.05)
    with pytest.raises(ValueError, match="margin"):
        clears_margin(0.1, -0.01)
    loss_champ, loss_chall = {"a": 2.0, "b": 2.0}, {"a": 1.0, "b": 1.5}
    assert gate_gain(loss_chall, loss_champ, higher_is_better=False).diff == pytest.approx(0.75)
    assert gate_gain(loss_chall, loss_champ).diff == pytest.approx(-0.75)


def test_load_by_alias_and_version(ws, tmp_path):
    name = "test-load"
    _register(ws, tmp_path, "a", 0.5, name=name)
    _register(ws, tmp_path, "b", 0.1, name=name)
    champ = download_model(model_uri(name, CHAMPION), tmp_path / "dl-champ")
    assert (champ / "weights.txt").read_text() == "weights of a\n"
    assert json.loads((champ / "registry_config.json").read_text())["data_version"] == "sha-a"
    v2 = download_model(model_uri(name, 2), tmp_path / "dl-v2")
    assert (v2 / "weights.txt").read_text() == "weights of b\n"
    assert model_uri(NAME, "champion") == f"models:/{NAME}@champion" and model_uri(NAME, 7) == f"models:/{NAME}/7"


def test_errors(ws, tmp_path):
    with pytest.raises(RuntimeError, match="active MLflow run"):
        register_model(tmp_path, NAME, config={}, data_version="x", metrics={"m": 1.0}, gate_metric="m")
    with flow_run(ws, "registry-test", "err", {}):
        with pytest.raises(KeyError, match="gate metric"):
            register_model(tmp_path, NAME, config={}, data_version="x", metrics={"m": 1.0}, gate_metric="ar")
        with pytest.raises(FileNotFoundError):
            register_model(tmp_path / "nope", NAME, config={}, data_version="x", metrics={"m": 1.0}, gate_metric="m")
    assert champion_version("never-registered") is None


def test_find_version_by_tag(ws, tmp_path):
    name = "test-find"
    with flow_run(ws, "registry-test", "find", {}):
        register_model(_model_dir(tmp_path, "x"), name, config={}, data_version="d", metrics={"m": 0.1},
                       gate_metric="m", tags={"model_digest": "abc"})
    found = find_version(name, "model_digest", "abc")
    assert found is not None and str(found.version) == "1" and "champion" in found.aliases
    assert find_version(name, "model_digest", "zzz") is None
    assert find_version("no-such-model", "model_digest", "abc") is None


def test_gate_compares_on_one_fixed_question_set_and_records_its_digest(ws, tmp_path):
    from funnelrag.registry import question_set_digest

    name = "test-fixed-set"
    fixed = question_set_digest(["q2", "q1", "q3"])
    assert fixed == question_set_digest(["q1", "q2", "q3"]) != question_set_digest(["q1", "q2"])
    first = _register(ws, tmp_path, "f1", 0.30, name=name, eval_set=fixed)
    assert first.eval_set == fixed and champion_version(name).tags["eval_set_digest"] == fixed
    same = _register(ws, tmp_path, "f2", 0.35, name=name, eval_set=fixed)   # recorded value, same set: comparable
    assert same.promoted and same.champion_value == 0.30 and json.loads(
        champion_version(name).tags["gate"])["eval_set"] == fixed
    other = question_set_digest(["q9"])
    with pytest.raises(ValueError, match="re-measure"):
        _register(ws, tmp_path, "f3", 0.90, name=name, eval_set=other)
    remeasured = _register(ws, tmp_path, "f4", 0.20, name=name, eval_set=other, champion_value=0.25)
    assert not remeasured.promoted and remeasured.eval_set == other


def _artifact_file(mv, rel: str):
    """The artifact store's own copy of a registered file (the version's logged model, a local store here)."""
    from pathlib import Path
    from urllib.parse import unquote, urlparse

    from mlflow import MlflowClient

    from funnelrag.registry import logged_model_id

    root = MlflowClient().get_logged_model(logged_model_id(mv)).artifact_location
    return Path(unquote(urlparse(root).path) if root.startswith("file:") else root) / rel


def test_versions_are_logged_models_and_evaluation_runs_link_them(ws, tmp_path):
    """A registered version is an MLflow 3 logged model of its training run (with its metrics);
    a run that used it records the link (run inputs) and a searchable tag."""
    import mlflow
    from mlflow import MlflowClient

    from funnelrag.registry import link_model_versions, logged_model_id, resolve_version

    name = "test-logged"
    _register(ws, tmp_path, "a", 0.5, name=name)
    mv = resolve_version(model_uri(name, 1))
    logged = MlflowClient().get_logged_model(logged_model_id(mv))
    assert logged.source_run_id == mv.run_id and logged.name == name
    assert {m.key for m in logged.metrics} >= {"dev_ar", "other"}
    with flow_run(ws, "registry-test", "evaluate", {}) as run:
        assert link_model_versions([(name, "1")], {"prog_ar_4": 0.25, "note": "x"}) == [logged.model_id]
    got = MlflowClient().get_run(run.info.run_id)
    assert got.data.tags[f"model_version.{name}"] == "1"
    evaluated = MlflowClient().get_logged_model(logged.model_id)
    assert [(m.key, m.value, m.run_id) for m in evaluated.metrics if m.key == "prog_ar_4"] == \
        [("prog_ar_4", 0.25, run.info.run_id)]
    assert mlflow.active_run() is None


def test_registered_files_are_verified_on_load(ws, tmp_path):
    """Same-size corruption and truncation of a registered weight file fail the load with the
    model, version and file named; an untouched version loads."""
    from funnelrag.registry import FILES_TAG, ModelIntegrityError, resolve_version

    name = "test-integrity"
    _register(ws, tmp_path, "a", 0.5, name=name)
    mv = resolve_version(model_uri(name, 1))
    assert json.loads(mv.tags[FILES_TAG]) == {
        "preranker.json": __import__("hashlib").sha256(b'{"kind": "bi", "tag": "a"}').hexdigest(),
        "weights.txt": __import__("hashlib").sha256(b"weights of a\n").hexdigest()}
    assert (download_model(model_uri(name, CHAMPION), tmp_path / "ok") / "weights.txt").exists()

    stored = _artifact_file(mv, "weights.txt")
    original = stored.read_bytes()
    stored.write_bytes(b"X" * len(original))                    # same size, other bytes
    with pytest.raises(ModelIntegrityError, match=rf"{name} v1: file weights.txt has sha256"):
        download_model(model_uri(name, CHAMPION), tmp_path / "bad")
    stored.write_bytes(original[:5])                            # truncated
    with pytest.raises(ModelIntegrityError, match="weights.txt"):
        download_model(model_uri(name, 1), tmp_path / "bad2")
    stored.unlink()                                             # gone
    with pytest.raises(ModelIntegrityError, match="weights.txt is missing"):
        download_model(model_uri(name, 1), tmp_path / "bad3")
    stored.write_bytes(original)
    assert (download_model(model_uri(name, 1), tmp_path / "again") / "weights.txt").read_bytes() == original


def test_verify_model_files_rejects_added_files(tmp_path):
    from funnelrag.registry import ModelIntegrityError, model_file_digests, verify_model_files

    d = _model_dir(tmp_path, "x")
    digests = model_file_digests(d)
    verify_model_files(d, digests, name="m", version="1")
    (d / "registry_config.json").write_text("{}")               # written by the registry itself: allowed
    verify_model_files(d, digests, name="m", version="1")
    (d / "extra.bin").write_bytes(b"?")
    with pytest.raises(ModelIntegrityError, match="extra.bin"):
        verify_model_files(d, digests, name="m", version="1")
    with pytest.raises(ValueError, match="is not a models:/ reference"):
        __import__("funnelrag.registry", fromlist=["resolve_version"]).resolve_version("runs:/abc/model")
