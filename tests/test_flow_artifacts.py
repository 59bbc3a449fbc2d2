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
