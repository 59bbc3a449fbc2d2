"""The embed-champion deployment re-embeds after every event that can change (corpus, model)."""
from pathlib import Path

import yaml

from flows.embed import EmbedConfig
from funnelrag.config import resolve_flow_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENTS = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}


def test_embed_champion_follows_corpus_builds_and_promotions(monkeypatch):
    monkeypatch.chdir(ROOT)
    dep = DEPLOYMENTS["embed-champion"]
    assert dep["entrypoint"] == "flows/embed.py:embed_flow" and dep["concurrency_limit"] == 1
    params = dep["parameters"]
    cfg = resolve_flow_config(EmbedConfig, config_file=params["config_file"], overrides=params["overrides"], home="/x")
    assert cfg.preranker == "models:/funnelrag-preranker@champion" and str(cfg.workspace.home) == "/x"
    on_build = [t for t in dep["triggers"] if t["expect"] == ["funnelrag.corpus.current"]]
    assert len(on_build) == 1 and on_build[0]["parameters"]["home"] == "{{ event.payload.home }}"
    assert "corpus_version={{ event.payload.version }}" in on_build[0]["parameters"]["overrides"]
    # a distillation that promoted a champion (both distillation deployments run register_task,
    # which emits the event) re-embeds the corpus it trained on, in its home
    (after,) = [t for t in dep["triggers"] if t["enabled"] and t["expect"] == ["funnelrag.preranker.champion"]]
    assert after["parameters"]["home"] == "{{ event.payload.home }}"
    assert after["parameters"]["overrides"] == ["corpus={{ event.payload.corpus }}"]
