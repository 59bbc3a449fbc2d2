"""The Prefect artifact of a flow that trains or evaluates: its summary as markdown tables."""
from __future__ import annotations

from flows.artifacts import summary_markdown


def test_summary_markdown_flattens_scalars_and_tabulates_records():
    summary = {
        "mlflow_run_id": "abc",
        "reader_eval": {"em": 0.25, "questions": 30, "by": {"k": {"deep": 1}}},   # depth 4: left out
        "reader_gate": {"version": 2, "promoted": True, "reason": "beats champion | by 0.1"},
        "ranking": [{"ranking": "full", "map": 0.51234, "recall@1": 0.4},
                    {"ranking": "retriever", "map": 0.3, "recall@1": None}],
        "answers": ["a", "b"],                                                    # list of scalars: left out
        "seconds": 123456.7,
    }
    assert summary_markdown("train-reader on `w`", "`abc`", summary) == (
        "# train-reader on `w`\n"
        "\n"
        "- MLflow run: `abc`\n"
        "\n"
        "| figure | value |\n"
        "|---|---:|\n"
        "| mlflow_run_id | abc |\n"
        "| reader_eval.em | 0.25 |\n"
        "| reader_eval.questions | 30 |\n"
        "| reader_gate.version | 2 |\n"
        "| reader_gate.promoted | True |\n"
        "| reader_gate.reason | beats champion \\| by 0.1 |\n"
        "| seconds | 123,457 |\n"
        "\n"
        "**ranking**\n"
        "\n"
        "| ranking | map | recall@1 |\n"
        "|---:|---:|---:|\n"
        "| full | 0.5123 | 0.4 |\n"
        "| retriever | 0.3 | – |\n")


def test_distillation_run_markdown_names_every_step_and_both_gates():
    from flows.funnel import distillation_run_markdown

    md = distillation_run_markdown(
        "wikispeedia", "v1", "`p`", [("train-reader", "`r`"), ("score-passages", "`s`"), ("distill-preranker", "`d`")],
        {"em": 0.125, "questions": 40}, {"name": "funnelrag-reader", "version": 3, "reason": "no_champion",
                                        "promoted": True},
        30, [{"k": 1, "before": 0.1, "after": 0.2}, {"k": 4, "before": 0.3, "after": 0.25}],
        {"name": "funnelrag-preranker", "version": 2, "reason": "worse_than_champion", "promoted": False})
    assert md == (
        "# distillation-run on `wikispeedia` version `v1`\n"
        "\n"
        "- MLflow run: `p`\n"
        "- FiD reader: dev exact match 0.125 on 40 held-out questions; registry: funnelrag-reader v3 — no_champion"
        " (now champion)\n"
        "- pre-ranker: registry: funnelrag-preranker v2 — worse_than_champion\n"
        "\n"
        "| step | MLflow run |\n"
        "|---|---|\n"
        "| train-reader | `r` |\n"
        "| score-passages | `s` |\n"
        "| distill-preranker | `d` |\n"
        "\n"
        "Answer recall of the pre-ranking stage on 30 held-out dev questions:\n"
        "\n"
        "| k | before | after | change |\n"
        "|---:|---:|---:|---:|\n"
        "| 1 | 0.100 | 0.200 | +0.100 |\n"
        "| 4 | 0.300 | 0.250 | -0.050 |\n")


def test_distillation_markdown_carries_the_gate_decision_with_its_interval_and_n():
    from flows.funnel import distillation_markdown
    from funnelrag.registry import GateDecision

    decision = GateDecision("funnelrag-preranker", "3", "dev_prerank_ar_at_8", True, 0.067, "2", 0.067, False,
                            "no_measurable_gain", None, 0.0, 0.0, 0.0, 30, 0.0)
    md = distillation_markdown("wikispeedia", "v1", 30, [{"k": 8, "before": 0.05, "after": 0.067}],
                               {"name": "funnelrag-preranker", "version": "3", "reason": decision.reason,
                                "promoted": False, "description": decision.description()}, "`p`")
    assert ("- registry: funnelrag-preranker v3 — no_measurable_gain. Champion gate: not promoted: no measurable gain "
            "(the lower bound must be > 0 and >= the margin 0; a tie never promotes). dev_prerank_ar_at_8: challenger "
            "0.0670, champion 0.0670; paired gain in dev_prerank_ar_at_8 over champion v2: +0.0000 [+0.0000, +0.0000] "
            "(95% percentile bootstrap over the questions, n=30).\n") in md
