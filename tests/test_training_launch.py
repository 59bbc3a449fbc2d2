"""Training under ``accelerate launch`` (``funnelrag/launch.py``, ``flows/launched/``) on 2 CPU processes.

The real FiD reader (a tiny scratch T5, the real T5 tokenizer) on NQ-open oracle questions
(``infra/gpu/sample.py``) through the same launcher the flows use: 2 processes vs 1 process at the
same global batch, a SIGKILL of the launch's process group after a checkpoint and its resumption,
a failing rank's traceback; and the ``train-reader`` flow with ``training.launch.kind=accelerate``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from funnelrag import launch as L
from funnelrag.training import TrainConfig

REPO = Path(__file__).resolve().parents[1]
CPU2 = "infra/accelerate/cpu_2proc.yaml"


def _weights(reader_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file  # noqa: PLC0415

    return load_file(str(reader_dir / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


# ---------------------------------------------------------------------------- fast
def test_entry_modules_and_launcher_import_without_prefect_or_mlflow():
    """The ranks (and the GPU check) run where Prefect, MLflow, bm25s, polars and faiss are absent."""
    code = ("import sys\n"
            "for m in ('prefect', 'mlflow', 'bm25s', 'polars', 'faiss'): sys.modules[m] = None\n"
            "import flows.launched.reader, flows.launched.preranker, funnelrag.launch, infra.gpu.check\n"
            "import tasks.funnel.stages, tasks.funnel.reader, tasks.funnel.attention, tasks.funnel.labels\n")
    env = L.child_env(cpu=True)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_launch_section_at_the_flow_boundary_and_the_command():
    from flows.funnel import DistillationConfig  # noqa: PLC0415
    from funnelrag.config import load_config  # noqa: PLC0415

    assert DistillationConfig().training.launch.kind == "in_process"
    cfg = load_config(DistillationConfig, None, ["training.launch.kind=accelerate", f"training.launch.config={CPU2}"])
    assert cfg.training.launch.kind == "accelerate" and cfg.training.launch.config == CPU2
    with pytest.raises(ValueError):
        load_config(DistillationConfig, None, ["training.launch.kind=torchrun"])
    n, cpu = L.resolve_processes(cfg.training.launch)
    if not torch.cuda.is_available():
        assert (n, cpu) == (2, True)   # the YAML's count, on CPU
    cmd = L.build_command(CPU2, 2, "flows.launched.reader", Path("/x/spec.json"), 29999)
    assert cmd[1:3] == ["-m", "accelerate.commands.launch"] and cmd[-4:] == ["-m", "flows.launched.reader", "--spec", "/x/spec.json"]
    assert cmd[cmd.index("--num_processes") + 1] == "2"
    assert L.child_env(True)["PYTHONPATH"].split(os.pathsep)[0] == str(REPO)
    assert L.per_process_train_config(TrainConfig(batch_size=4), 2).batch_size == 2
    with pytest.raises(ValueError, match="not a multiple"):
        L.per_process_train_config(TrainConfig(batch_size=3), 2)


def test_failed_rank_picks_the_first_error_file(tmp_path):
    (tmp_path / "rank1.txt").write_text("Traceback (most recent call last):\nValueError: first\n")
    time.sleep(0.01)
    (tmp_path / "rank0.txt").write_text("Traceback (most recent call last):\nRuntimeError: later\n")
    assert L.failed_rank(tmp_path) == (1, "Traceback (most recent call last):\nValueError: first")
    assert L.failed_rank(tmp_path / "none") == (None, "")


# ---------------------------------------------------------------------------- launched reader
def _sample(data_mirror: Path, out: Path, n: int = 16) -> Path:
    """``n`` oracle questions whose first answer is 4 T5 tokens (3 + EOS): the LM loss is a token
    mean per rank, so equal answer lengths make 2 ranks x 2 examples the exact 4-example mean."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    from funnelrag.datasets import resolve  # noqa: PLC0415
    from infra.gpu.sample import read_oracle, write_candidates  # noqa: PLC0415

    tok = AutoTokenizer.from_pretrained(str(resolve("t5-tokenizer", data_mirror).parent))
    records = [r for r in read_oracle(resolve("nq-open-oracle", data_mirror), 600)
               if len(tok(r["answers"][0]).input_ids) == 4][:n]
    assert len(records) == n
    return write_candidates(records, 4, out)


def _reader_cfg(data_mirror: Path, **train):
    from funnelrag.datasets import resolve  # noqa: PLC0415
    from models.fid import FiDConfig  # noqa: PLC0415
    from tasks.funnel.reader import ReaderTrainConfig  # noqa: PLC0415

    tok = str(resolve("t5-tokenizer", data_mirror).parent)
    t = TrainConfig(max_steps=24, batch_size=4, lr=1e-3, warmup_steps=1, checkpoint_every=4, log_every=1, cpu=True)
    return ReaderTrainConfig(fid=FiDConfig(tokenizer=tok, d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.0),
                             train=replace(t, **train), n_passages=4, max_passage_tokens=64, max_answer_tokens=8)


def _launch_reader(cands: Path, cfg, root: Path, n: int, **kw) -> dict:
    from flows.launched.reader import launch_reader  # noqa: PLC0415

    return launch_reader(cands, cfg, root / "work", root / "out", L.LaunchConfig(kind="accelerate", config=CPU2,
                                                                                   num_processes=n),
                         tracking={"kind": "jsonl", "path": str(root / "metrics.jsonl"), "prefix": "reader"}, **kw)


@pytest.fixture(scope="module")
def launched(data_mirror, tmp_path_factory):
    """The sample and one straight 2-process run of 24 steps (global batch 4, checkpoints every 4)."""
    root = tmp_path_factory.mktemp("launch")
    cands = _sample(data_mirror, root / "cands")
    cfg = _reader_cfg(data_mirror)
    t0 = time.perf_counter()
    summary = _launch_reader(cands, cfg, root / "two", 2)
    return {"root": root, "cands": cands, "cfg": cfg, "two": summary, "two_s": time.perf_counter() - t0}


@pytest.mark.slow  # ~1 min beside other jobs: 2 launches
def test_two_processes_train_the_weights_of_one_process(launched):
    root = launched["root"]
    two = launched["two"]
    assert two["steps"] == 24 and two["kept"] == 16
    result = json.loads((root / "two/work/launch/result.json").read_text())
    assert result["world_size"] == 2 and result["global_step"] == 24
    ckpt = root / "two/work/checkpoints/step_00000024"
    assert {p.name for p in ckpt.glob("random_states_*.pkl")} == {"random_states_0.pkl", "random_states_1.pkl"}
    # main rank only: one metrics line per step, the flow's names
    lines = [json.loads(x) for x in (root / "two/metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 25)) and "reader/loss" in lines[0]
    # the saved reader names the global batch, as the in-process one does
    saved = json.loads((root / "two/out/reader/reader_config.json").read_text())
    assert saved["train"]["batch_size"] == 4

    t0 = time.perf_counter()
    one = _launch_reader(launched["cands"], launched["cfg"], root / "one", 1)
    one_s = time.perf_counter() - t0
    diff = _max_diff(_weights(root / "one/out/reader"), _weights(root / "two/out/reader"))
    print(f"2 processes {launched['two_s']:.1f} s, 1 process {one_s:.1f} s (beside other jobs); max |dw| = {diff:.2e}")
    assert diff < 1e-3   # 1.6e-6 after 8 steps; AdamW amplifies reduction-order noise in near-zero gradients
    assert one["last_loss"] == pytest.approx(two["last_loss"], rel=1e-4)


@pytest.mark.slow  # ~1 min beside other jobs
def test_sigkill_of_the_launch_after_a_checkpoint_resumes_to_the_same_weights(launched):
    root, run = launched["root"], launched["root"] / "killed"
    procs: list[subprocess.Popen] = []
    killed = threading.Event()

    def kill_after_first_checkpoint():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed.is_set():
            done = list((run / "work/checkpoints").glob("step_*/COMPLETE"))
            if done and procs:
                os.killpg(procs[0].pid, signal.SIGKILL)   # the launcher; the ranks die with it (PDEATHSIG)
                killed.set()
                return
            time.sleep(0.02)

    # the straight run's config (a resume checks the schedule's fingerprint); the watcher kills as
    # soon as step 4's checkpoint is complete (steps 5..24 still to go)
    watcher = threading.Thread(target=kill_after_first_checkpoint)
    watcher.start()
    with pytest.raises(L.LaunchFailed):
        _launch_reader(launched["cands"], launched["cfg"], run, 2, on_start=procs.append)
    watcher.join()
    assert killed.is_set()
    ckpts = sorted(p.parent.name for p in (run / "work/checkpoints").glob("step_*/COMPLETE"))
    assert ckpts and ckpts[-1] < "step_00000024", ckpts   # killed mid-training
    resumed = _launch_reader(launched["cands"], launched["cfg"], run, 2)
    assert resumed["steps"] == 24
    assert _max_diff(_weights(run / "out/reader"), _weights(root / "two/out/reader")) < 1e-6
    assert resumed["last_loss"] == pytest.approx(launched["two"]["last_loss"], rel=1e-6)


@pytest.mark.slow  # ~20 s beside other jobs
def test_a_failing_rank_is_reported_with_its_traceback(tmp_path):
    module = tmp_path / "mods" / "fail_on_rank1.py"
    module.parent.mkdir()
    module.write_text(textwrap.dedent("""
        import time
        from funnelrag import launch as L

        def run(spec):
            if L.rank() == 1:
                raise ValueError("rank one cannot read its shard")
            time.sleep(30)   # rank 0 would go on: the launcher's torchrun stops it

        if __name__ == "__main__":
            spec = L.read_spec()
            with L.rank_guard(spec):
                run(spec)
    """))
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(module.parent)])}
    t0 = time.perf_counter()
    with pytest.raises(L.LaunchFailed) as err:
        L.launch("fail_on_rank1", {}, tmp_path / "spec", L.LaunchConfig(kind="accelerate", config=CPU2), env=env)
    assert err.value.rank == 1 and err.value.returncode != 0
    assert "ValueError: rank one cannot read its shard" in str(err.value)
    assert time.perf_counter() - t0 < 60


# ---------------------------------------------------------------------------- the flow
@pytest.mark.slow  # ~3-4 min beside other jobs: corpus build, candidates, a 2-process launch
def test_train_reader_flow_under_accelerate_matches_in_process(tmp_path, data_mirror, workspace_home, prefect_harness):
    import mlflow  # noqa: PLC0415

    from flows.funnel import Context, train_reader_flow  # noqa: PLC0415
    from tasks.funnel import stages as S  # noqa: PLC0415

    cfg = _flow_config(tmp_path, data_mirror, workspace_home)
    launched_cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={
        "launch": L.LaunchConfig(kind="accelerate", config=CPU2)})})
    out = train_reader_flow(launched_cfg)
    assert out["reader"]["cache_hit"] is False and out["reader"]["steps"] == 4
    # one MLflow run (the flow's) holds the main rank's step metrics
    client = mlflow.MlflowClient()
    runs = client.search_runs([client.get_experiment_by_name("distillation").experiment_id])
    assert [r.info.run_name for r in runs] == ["train-reader"] and runs[0].info.run_id == out["mlflow_run_id"]
    history = client.get_metric_history(out["mlflow_run_id"], "reader/loss")
    assert [m.step for m in history] == [1, 2, 3, 4]
    # registered (champion gate on dev EM) as the in-process path registers it
    assert out["reader_gate"]["registered"] is True and out["reader_gate"]["version"] == "1"

    # the launch kind is not in the cache key: the in-process flow finds the launched reader
    again = train_reader_flow(cfg)
    assert again["reader"]["cache_hit"] is True

    # same weights as training in this process on the same candidates, global batch 4 either way
    ctx = Context.open(cfg)
    cands = sorted((ctx.cache.root / "candidates").iterdir())
    train_dir = next(d for d in cands if json.loads((d / "COMPLETE").read_text())["summary"]["split"] == "train")
    reader_dir = next(p for p in (ctx.cache.root / "reader").iterdir() if (p / "COMPLETE").exists())
    S.run_reader(train_dir, ctx.reader_config(), tmp_path / "inproc-work", tmp_path / "inproc")
    diff = _max_diff(_weights(tmp_path / "inproc/reader"), _weights(reader_dir / "reader"))
    print(f"flow: launched vs in-process max |dw| = {diff:.2e}")
    assert diff < 2e-2   # answers of different lengths: the token-mean loss is per rank (see _sample)


def _flow_config(tmp_path: Path, data_mirror: Path, home: Path):
    """The distillation sample of tests/test_flow_distillation.py (60 oracle records), reader: 4 steps."""
    import gzip  # noqa: PLC0415

    from flows.corpus_build import CorpusBuildConfig, corpus_build_flow  # noqa: PLC0415
    from flows.funnel import DistillationConfig  # noqa: PLC0415
    from funnelrag.datasets import resolve  # noqa: PLC0415

    with gzip.open(resolve("nq-open-oracle", data_mirror), "rt", encoding="utf-8") as fh:
        records = [json.loads(line) for _, line in zip(range(60), fh)]
    corpus_src = tmp_path / "gold_passages.jsonl"
    corpus_src.write_text("".join(json.dumps({"title": r["ctxs"][0]["title"], "text": r["ctxs"][0]["text"]}) + "\n"
                                  for r in records))
    questions = tmp_path / "questions.jsonl"
    questions.write_text("".join(json.dumps({"question": r["question"], "answers": r["answers"]}) + "\n" for r in records))
    ws = {"home": str(home), "data_mirror": str(data_mirror)}
    corpus_build_flow(CorpusBuildConfig.model_validate({
        "name": "nq-gold", "source": {"datasets": [], "paths": [str(corpus_src)]}, "ingest": {"format": "jsonl"},
        "clustering": {"tokenizer": "whitespace"},
        "segment": {"tokenizer": "whitespace", "passage_words": 25, "unit_max_tokens": 60}, "workspace": ws}))
    return DistillationConfig.model_validate({
        "workspace": ws, "corpus": "nq-gold", "questions": {"datasets": [], "paths": [str(questions)]},
        "split": {"dev_fraction": 0.3, "seed": 0}, "n_train": None, "n_eval": None,
        "candidates": {"n_clusters": 3, "n_units": 3, "batch_size": 32},
        "preranker": {"kind": "bi", "max_length": 64},
        "reader": {"fid": {"d_model": 32, "n_layers": 2, "n_heads": 2, "d_ff": 64, "dropout": 0.0},
                   "train": {"max_steps": 4, "batch_size": 4, "lr": 1e-3, "cpu": True, "log_every": 1},
                   "n_passages": 4, "max_passage_tokens": 64},
        "registry_name": "test-preranker", "reader_registry_name": "test-reader"})


def test_the_loop_reports_steps_rate_and_loss_on_the_main_process(tmp_path, caplog):
    import logging  # noqa: PLC0415

    from funnelrag.training import train  # noqa: PLC0415

    class Hooks:
        def collate(self, examples):
            return {"x": torch.stack([e[0] for e in examples]), "y": torch.stack([e[1] for e in examples])}

        def loss(self, model, batch):
            return torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"]), {}

    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(0))
    data = [(x[i], x[i].sum()) for i in range(16)]
    with caplog.at_level(logging.INFO, logger="funnelrag.progress"):
        res = train(torch.nn.Linear(3, 1), data, Hooks(), TrainConfig(output_dir=str(tmp_path / "run"), epochs=2,
                                                                        batch_size=4, cpu=True))
    lines = [r.getMessage() for r in caplog.records if r.name == "funnelrag.progress"]
    assert res.global_step == 8 and lines[-1].startswith("train run: 8/8 steps (")
    assert "steps/s" in lines[-1] and f"loss={res.losses[-1]:.4g}" in lines[-1] and lines[-1].endswith("(done)")


def test_a_launch_past_its_timeout_is_killed_with_its_ranks(tmp_path):
    import psutil  # noqa: PLC0415

    module = tmp_path / "mods" / "sleeper.py"
    module.parent.mkdir()
    module.write_text("import time\ntime.sleep(120)\n")
    env = {"PYTHONPATH": os.pathsep.join([str(REPO), str(module.parent)])}
    procs: list[subprocess.Popen] = []
    t0 = time.perf_counter()
    with pytest.raises(L.LaunchFailed, match="timeout_s=8"):
        L.launch("sleeper", {}, tmp_path / "spec", L.LaunchConfig(kind="accelerate", config=CPU2, timeout_s=8),
                 env=env, on_start=procs.append)
    assert time.perf_counter() - t0 < 60
    left = [p for p in psutil.process_iter(["cmdline"]) if "sleeper" in " ".join(p.info["cmdline"] or [])]
    assert not left
