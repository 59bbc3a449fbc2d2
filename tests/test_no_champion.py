"""The champion automations on a home where no distillation has run yet: the runs complete and
say there is nothing to do (a normal state of a fresh deployment, not a failure)."""
from __future__ import annotations

from pathlib import Path

from flows.embed import embed_flow
from flows.evaluate import evaluate_flow

ROOT = Path(__file__).resolve().parents[1]


def test_embed_and_evaluate_champion_complete_with_a_message_without_a_champion(
        prefect_harness, workspace_home, monkeypatch):
    monkeypatch.chdir(ROOT)
    state = embed_flow(config_file="configs/embed_champion.yaml", home=str(workspace_home), return_state=True)
    assert state.is_completed()
    assert "nothing to embed: registered model funnelrag-preranker has no version with alias 'champion'" \
        in state.message
    assert state.result()["skipped"] == state.message

    state = evaluate_flow(config_file="configs/evaluate_champion.yaml", home=str(workspace_home), return_state=True)
    assert state.is_completed() and state.message.startswith("nothing to evaluate: registered model "
                                                             "funnelrag-preranker has no version")
