"""Two CPU processes (gloo) through ``accelerate launch --config_file infra/accelerate/cpu_2proc.yaml``.

Run as a script, this file is the worker each rank executes: it trains a small regression model
with :func:`funnelrag.training.train` and writes what its rank saw to ``OUT/rank{r}.json``.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
N_EXAMPLES, BATCH = 32, 4


class _Hooks:
    def __init__(self):
        self.seen: list[int] = []

    def collate(self, examples):
        self.seen.extend(int(e[0]) for e in examples)
        return {"x": torch.stack([e[1] for e in examples]), "y": torch.stack([e[2] for e in examples])}

    def loss(self, model, batch):
        return torch.nn.functional.mse_loss(model(batch["x"]).squeeze(-1), batch["y"]), {}


class _Crash(RuntimeError):
    pass


def _worker(out: Path, cpu: bool, crash_at: int | None = None) -> None:
    from funnelrag.training import TrainConfig, train  # noqa: PLC0415

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N_EXAMPLES, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5])
    data = [(i, x[i], y[i]) for i in range(N_EXAMPLES)]
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)  # different initial weights per rank: DDP must broadcast rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    hooks, logged = _Hooks(), []
    cfg = TrainConfig(output_dir=str(out / "run"), epochs=1, batch_size=BATCH, lr=1e-2, log_every=1,
                      checkpoint_every=2, cpu=cpu)

    def log(metrics, step):
        if step == crash_at:
            raise _Crash(f"simulated crash of rank 0 at step {step}")
        logged.append(step)

    res = train(model, data, hooks, cfg, log_metrics=log)
    params = torch.cat([p.detach().flatten() for p in model.parameters()]).tolist()
    (out / f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "world_size": int(os.environ["WORLD_SIZE"]), "seen": hooks.seen,
        "logged_steps": logged, "losses": res.losses, "params": params, "global_step": res.global_step}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_USE_CPU", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    # the ranks import this checkout even when another checkout is the one pip-installed
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(REPO / "infra/accelerate/cpu_2proc.yaml"), "--main_process_port", str(_free_port()),
           __file__, str(out), *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # launches two training processes (accelerate/torchrun)
def test_two_cpu_processes_shard_data_and_sync_gradients(tmp_path):
    proc = _launch(tmp_path, "--cpu")
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert (r0["rank"], r1["rank"]) == (0, 1) and r0["world_size"] == r1["world_size"] == 2
    # each optimizer step consumes batch_size x 2 examples: 32 / 8 = 4 steps, disjoint shards
    assert r0["global_step"] == r1["global_step"] == 4
    assert sorted(r0["seen"] + r1["seen"]) == list(range(N_EXAMPLES))
    assert not set(r0["seen"]) & set(r1["seen"])
    # gradients were all-reduced: identical parameters although ranks started from different ones
    torch.testing.assert_close(torch.tensor(r0["params"]), torch.tensor(r1["params"]))
    assert r0["losses"] == r1["losses"]  # the logged loss is reduced over processes
    assert r0["logged_steps"] == [1, 2, 3, 4] and r1["logged_steps"] == []  # main process only
    ckpt = tmp_path / "run/checkpoints/step_00000004"
    assert (ckpt / "COMPLETE").exists()
    assert {p.name for p in ckpt.glob("random_states_*.pkl")} == {"random_states_0.pkl", "random_states_1.pkl"}


@pytest.mark.slow  # launches two training processes (accelerate/torchrun)
def test_multi_process_launch_without_cpu_flag_is_refused(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the refusal concerns CPU-only machines")
    proc = _launch(tmp_path)
    assert proc.returncode != 0
    assert "accelerate sees 1" in proc.stderr
    assert not list(tmp_path.glob("rank*.json"))


@pytest.mark.slow  # resume equality is covered single-process in test_training.py
def test_two_process_resume_after_rank0_crash_matches_straight_run(tmp_path):
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    assert _launch(straight, "--cpu").returncode == 0
    proc = _launch(crashed, "--cpu", "--crash-at", "3")
    assert proc.returncode != 0 and "simulated crash" in proc.stderr
    assert not list(crashed.glob("rank*.json"))
    proc = _launch(crashed, "--cpu")
    assert proc.returncode == 0, proc.stderr[-4000:]
    a, b = (json.loads((d / "rank0.json").read_text()) for d in (straight, crashed))
    assert b["logged_steps"] == [3, 4]  # resumed after the step-2 checkpoint
    torch.testing.assert_close(torch.tensor(b["losses"]), torch.tensor(a["losses"]))
    torch.testing.assert_close(torch.tensor(b["params"]), torch.tensor(a["params"]))


if __name__ == "__main__":
    crash = sys.argv[sys.argv.index("--crash-at") + 1] if "--crash-at" in sys.argv else None
    _worker(Path(sys.argv[1]), cpu="--cpu" in sys.argv[2:], crash_at=int(crash) if crash else None)
