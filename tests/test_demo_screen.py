"""The one screen ``funnelrag demo`` ends on: built corpora, registered models, figures with
bootstrap intervals or a smoke-run mark, where to look; at most ~40 lines."""
from __future__ import annotations

import numpy as np

from flows.demo import DemoConfig, step_command, summary_path
from flows.demo_screen import binary_interval, demo_screen

OUT = {
    "corpus-wikispeedia": {"corpus": "wikispeedia", "version": "20260101T000000Z-aaaa", "step_seconds": 120.0,
                           "counts": {"documents": 4598, "clusters": 1200, "passages": 60000}},
    "distillation": {"step_seconds": 400.0,
                     "answer_recall": [{"k": k, "before": 0.3, "after": 0.3} for k in (1, 2, 3, 4)],
                     "train_reader": {"reader_eval": {"em": 0.0, "questions": 30}},
                     "distill_preranker": {"evaluate": {"questions": 30}}},
    "evaluate": {"step_seconds": 60.0, "corpus": "wikispeedia", "questions": 10,
                 "table": [{"setting": f"setting-{i}", "AR@1": 0.1, "AR@4": 0.3, "EM": "–"} for i in range(12)]},
}


def test_binary_interval_is_the_bootstrap_of_the_0_1_values():
    from funnelrag.paired import bootstrap_indices, interval  # noqa: PLC0415

    values = np.array([1.0, 0, 0, 1, 0, 0, 0, 1, 0, 0])
    assert binary_interval(0.3, 10) == interval(np.sort(values)[::-1].copy(), bootstrap_indices(10, 1000, 0))
    lo, hi = binary_interval(0.3, 10)[1:]
    assert lo < 0.3 < hi
    assert binary_interval(0.0, 10) == (0.0, 0.0, 0.0) and binary_interval("–", 10) is None


def test_screen_fits_one_screen_and_says_where_to_look(tmp_path):
    cfg = DemoConfig(workspace={"home": tmp_path})
    text = demo_screen(OUT, cfg, step_command, summary_path(cfg))
    lines = text.splitlines()
    assert len(lines) <= 42
    assert "corpus wikispeedia" in text and "4,598 documents" in text and "60,000 passages" in text
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path.resolve() / 'mlflow.db'}" in text
    assert "prefect server start" in text and str(tmp_path / "demo-summary.json") in text
    assert "SMOKE RUN at demo size: 10-30 questions" in text
    assert "AR@4  30 [" in text and "4 more settings" in text
    assert "trained from scratch" in text and "EM 0 is expected" in text
