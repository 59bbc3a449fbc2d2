"""``infra/gpu/check.sh --device cpu --tiny``: the GPU check's every phase, tiny, on CPU (CI runs it)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~2-3 min beside other jobs: five launches
def test_gpu_check_runs_tiny_on_cpu(tmp_path, data_mirror):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([str(REPO / "infra/gpu/check.sh"), "--device", "cpu", "--tiny", "--work", str(tmp_path / "w")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads((tmp_path / "w/figures.json").read_text())
    phases = figures["phases"]
    assert figures["failed"] == [] and figures["device"] == "cpu"
    assert phases["reader_t5"]["steps"] == 4 and phases["reader_t5"]["loss_end"] < phases["reader_t5"]["loss_start"]
    resume = phases["reader_t5_resume"]
    assert resume["killed"] and resume["steps"] == 4 and resume["identical"]
    assert "skipped" in phases["reader_zero2"] and "skipped" in phases["reader_zero3"]   # DeepSpeed: GPU only
    assert phases["reader_bert2bert"]["steps"] == 2 and phases["bpr"]["steps"] == 2
    assert phases["attention"]["passages"] == 64 and phases["embedding"]["top10_agreement"] >= 0.9
    assert phases["embedding_scale"]["passages"] == 128


@pytest.mark.slow  # MiniLM on 120 passages on CPU (~1-3 min beside other jobs)
def test_gpu_check_embeds_at_scale_on_cpu(tmp_path, data_mirror):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    proc = subprocess.run([str(REPO / "infra/gpu/check.sh"), "--device", "cpu", "--tiny", "--work", str(tmp_path / "w"),
                           "--phases", "embedding_scale", "--scale-passages", "120"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    scale = json.loads((tmp_path / "w/figures.json").read_text())["phases"]["embedding_scale"]
    assert scale["passages"] == 120 and scale["segments_written"] == 2           # 64-passage chunks as they arrive
    assert scale["embedded"] == scale["distinct_texts"] == 119 and scale["passages_per_s"] > 0   # one duplicate
    assert scale["precision"] == "fp32" and scale["projected_hours_21m_one_device"] > 0   # no bf16 agreement measured
