"""Deployment parameters come from configs/ and merge key by key; the home is templated from the
environment; the evaluate-champion automation follows every corpus build that made a version
current, with its home and version."""
from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
import yaml

from flows.corpus_build import CORPUS_CURRENT_EVENT, CorpusBuildConfig
from flows.evaluate import EvaluateConfig
from funnelrag.config import load_config, resolve_flow_config

ROOT = Path(__file__).resolve().parents[1]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}
CORPUS_DEPLOYMENTS = [d for d in SPEC["deployments"] if d["entrypoint"].endswith(":corpus_build_flow")]


def _home_of(params: dict) -> str:
    return params.get("home") or params.get("config", params.get("cfg", {})).get("workspace", {}).get("home")


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_deployment_home_is_templated_from_the_environment(name):
    assert _home_of(DEPLOYMENTS[name]["parameters"]) == "{{ $FUNNELRAG_HOME }}"


@pytest.mark.parametrize("dep", CORPUS_DEPLOYMENTS, ids=[d["name"] for d in CORPUS_DEPLOYMENTS])
def test_corpus_deployments_use_the_config_files_unchanged(dep, monkeypatch):
    monkeypatch.chdir(ROOT)
    params = dep["parameters"]
    assert "config" not in params and params["config_file"].startswith("configs/")
    resolved = resolve_flow_config(CorpusBuildConfig, config_file=params["config_file"],
                                   overrides=params["overrides"], home="/srv/funnelrag")
    expected = load_config(CorpusBuildConfig, ROOT / params["config_file"], ["workspace.home=/srv/funnelrag"])
    assert resolved == expected


def test_enwiki_deployment_builds_with_the_papers_s(monkeypatch):
    monkeypatch.chdir(ROOT)
    params = DEPLOYMENTS["nightly-corpus-build-enwiki"]["parameters"]
    cfg = resolve_flow_config(CorpusBuildConfig, config_file=params["config_file"], home="/x")
    assert cfg.name == "enwiki-sample" and cfg.ingest.format == "mediawiki"
    assert cfg.clustering.max_tokens == 4096  # the deployment had drifted to Wikispeedia's 16,384


def test_overriding_one_field_keeps_the_rest_of_the_config(tmp_path):
    """A nested override used to replace the whole config: the enwiki deployment built Wikispeedia."""
    base = resolve_flow_config(CorpusBuildConfig, config_file=ROOT / "configs/corpus_enwiki_sample.yaml")
    changed = resolve_flow_config(CorpusBuildConfig, config_file=ROOT / "configs/corpus_enwiki_sample.yaml",
                                  overrides=[f"workspace.home={tmp_path}", "bm25.k1=1.2"])
    assert changed.workspace.home == tmp_path and changed.bm25.k1 == 1.2
    assert changed.model_dump(exclude={"workspace", "bm25"}) == base.model_dump(exclude={"workspace", "bm25"})
    assert changed.bm25.b == base.bm25.b
    # a config object (the CLI's) merges the same way
    from_model = resolve_flow_config(CorpusBuildConfig, base, overrides=["clustering.max_tokens=2048"], home=str(tmp_path))
    assert from_model.clustering.max_tokens == 2048 and from_model.name == "enwiki-sample"
    assert from_model.workspace.home == tmp_path
    with pytest.raises(ValueError, match="either config or config_file"):
        resolve_flow_config(CorpusBuildConfig, base, config_file="configs/corpus_enwiki_sample.yaml")


def test_yaml_syntax_error_names_the_file(tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nclustering: {max_tokens: 4096\n")
    with pytest.raises(ValueError, match=r"config file .*broken\.yaml, line 3, column 1: YAML syntax error: .* "
                                         r"\(while parsing a flow mapping at line 2, column 13\)"):
        load_config(CorpusBuildConfig, bad)


def _render_parameters(trigger: dict, event: dict) -> dict:
    """A trigger's parameters as the Prefect server renders its templates with the event."""
    def render(value):
        if isinstance(value, list):
            return [render(v) for v in value]
        return jinja2.Template(value).render(event=event) if isinstance(value, str) else value
    return {k: render(v) for k, v in trigger["parameters"].items()}


def _triggered_config(model, trigger: dict, event: dict):
    """The flow config of the run a trigger starts for ``event`` (templates rendered, then merged)."""
    params = _render_parameters(trigger, event)
    return params, resolve_flow_config(model, config_file=params["config_file"], overrides=params["overrides"],
                                       home=params["home"])


def test_evaluate_champion_follows_every_corpus_build_with_its_home_and_version(monkeypatch):
    monkeypatch.chdir(ROOT)
    dep = DEPLOYMENTS["evaluate-champion"]
    (trigger,) = dep["triggers"]
    assert trigger["expect"] == [CORPUS_CURRENT_EVENT]
    assert trigger["match"] == {"prefect.resource.id": "funnelrag.corpus.*"}
    assert "match_related" not in trigger  # not tied to one deployment's name
    # the server renders the templates with the event; the evaluation then runs on that build
    event = {"payload": {"corpus": "enwiki-sample", "version": "20261123T020000.000000Z-abcdef12",
                         "home": "/srv/funnelrag"}}
    params, cfg = _triggered_config(EvaluateConfig, trigger, event)
    assert cfg.workspace.home == Path("/srv/funnelrag") and cfg.corpus == "enwiki-sample"
    assert cfg.corpus_version == "20261123T020000.000000Z-abcdef12"
    assert cfg.prerankers["champion"] == "models:/funnelrag-preranker@champion"
    assert dep["parameters"]["config_file"] == params["config_file"]


def _entrypoint(dep: dict):
    import importlib  # noqa: PLC0415
    path, func = dep["entrypoint"].split(":")
    return getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), func)


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_deployment_merges_one_overridden_field_into_its_config(name, monkeypatch, tmp_path):
    """Every deployment's flow takes ``config_file | config``, ``overrides`` and ``home`` and merges them
    key by key: overriding one field (here the home) keeps everything else of the deployment's config."""
    import inspect  # noqa: PLC0415
    monkeypatch.chdir(ROOT)
    dep = DEPLOYMENTS[name]
    fn = _entrypoint(dep).fn
    params = list(inspect.signature(fn).parameters)
    assert params[1:4] == ["config_file", "overrides", "home"], (name, params)
    model = inspect.get_annotations(fn, eval_str=True)[params[0]].__args__[0]
    given = dict(dep["parameters"])
    base_cfg, config_file = given.get(params[0]), given.get("config_file")
    base = resolve_flow_config(model, base_cfg, config_file, given.get("overrides"), home="/srv/a")
    changed = resolve_flow_config(model, base_cfg, config_file, [*given.get("overrides", []), f"workspace.home={tmp_path}"],
                                  home="/srv/a")
    assert changed.workspace.home == tmp_path
    assert changed.model_dump(exclude={"workspace"}) == base.model_dump(exclude={"workspace"})


def test_every_automation_is_named_and_described():
    """Automations show a name and a purpose in the Prefect UI (not ``<deployment>__automation_1``)."""
    triggers = [(name, t) for name, dep in DEPLOYMENTS.items() for t in dep.get("triggers", [])]
    assert triggers
    for dep_name, trigger in triggers:
        assert trigger.get("name") and len(trigger.get("description", "")) > 20, dep_name
    names = [t["name"] for _, t in triggers]
    assert len(names) == len(set(names))


def test_embed_champion_after_a_distillation_embeds_the_corpus_and_home_it_trained_on(monkeypatch):
    from flows.embed import EmbedConfig
    from flows.funnel import CHAMPION_EVENT

    monkeypatch.chdir(ROOT)
    dep = DEPLOYMENTS["embed-champion"]
    (trigger,) = [t for t in dep["triggers"] if t["expect"] == [CHAMPION_EVENT]]
    assert trigger["match"] == {"prefect.resource.id": "funnelrag.model.*"}
    event = {"payload": {"name": "funnelrag-preranker", "version": "3", "corpus": "enwiki-sample",
                         "home": "/srv/funnelrag"}}
    _, cfg = _triggered_config(EmbedConfig, trigger, event)
    assert cfg.workspace.home == Path("/srv/funnelrag") and cfg.corpus == "enwiki-sample"
    assert cfg.preranker == "models:/funnelrag-preranker@champion"


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_deployment_takes_a_config_file_the_home_and_overrides(name):
    """One parameter shape for every deployment, so ``--param overrides=[...]`` and
    ``funnelrag schedule --set`` work on each: no inline ``config`` that a config file would clash with."""
    params = DEPLOYMENTS[name]["parameters"]
    assert set(params) == {"config_file", "home", "overrides"}, (name, params)
    assert isinstance(params["overrides"], list)
    if params["config_file"] is not None:
        assert (ROOT / params["config_file"]).is_file(), params["config_file"]
