"""The shared accelerate training loop: resume equality, checkpoints, accumulation, precision."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from funnelrag.training import (COMPLETE_MARKER, STATE_FILE, EpochSeededSampler, TrainConfig,
                                checkpoint_dirs, latest_checkpoint, log_interval, train)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
N_EXAMPLES = 41  # 11 batches of 4: the last accumulation group of an epoch is a single batch




class RegressionHooks:
    """Linear-regression hooks; ``seen`` records example ids in the order they were batched."""

    def __init__(self):
        self.seen: list[int] = []

    def collate(self, examples):
        self.seen.extend(int(e[0]) for e in examples)
        return {"x": torch.stack([e[1] for e in examples]),    # (batch, 4)
                "y": torch.stack([e[2] for e in examples])}    # (batch,)

    def loss(self, model, batch):
        pred = model(batch["x"]).squeeze(-1)                   # (batch,)
        loss = torch.nn.functional.mse_loss(pred, batch["y"])
        return loss, {"pred_mean": pred.mean().item()}


def _data(n=N_EXAMPLES):
    gen = torch.Generator().manual_seed(123)
    x = torch.randn(n, 4, generator=gen)
    y = x @ torch.tensor([1.0, -2.0, 3.0, 0.5]) + 0.1 * torch.randn(n, generator=gen)
    return [(i, x[i], y[i]) for i in range(n)]


def _model(dropout=0.2):
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Dropout(dropout),
                               torch.nn.Linear(32, 1))


def _cfg(out: Path, **kw):
    base = dict(output_dir=str(out), seed=3, epochs=2, batch_size=4, grad_accum=2, lr=5e-3,
                warmup_steps=2, log_every=1, cpu=True)
    base.update(kw)
    return TrainConfig(**base)


def _params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


class Crash(RuntimeError):
    pass


def _crash_at(step):
    def log(metrics, s):
        if s == step:
            raise Crash(f"simulated crash at step {s}")
    return log


def test_fp16_refused_with_reason():
    with pytest.raises(ValueError, match="fp16.*T5"):
        TrainConfig(output_dir="x", mixed_precision="fp16")
    with pytest.raises(ValueError, match="mixed_precision"):
        TrainConfig(output_dir="x", mixed_precision="fp8")


def test_config_sections_leave_output_dir_to_the_stage_but_train_requires_it():
    cfg = TrainConfig(max_steps=1)   # as a flow's config section writes it
    assert cfg.output_dir == ""
    with pytest.raises(ValueError, match="output_dir is empty"):
        train(_model(), _data(), RegressionHooks(), cfg)


def test_sampler_is_a_function_of_seed_and_epoch():
    a, b = EpochSeededSampler(50, seed=1), EpochSeededSampler(50, seed=1)
    a.set_epoch(3)
    b.set_epoch(3)
    assert list(a) == list(b) and sorted(a) == list(range(50))
    b.set_epoch(4)
    assert list(a) != list(b)


@pytest.mark.slow  # four training runs (straight, crashed, two resumes)
def test_resume_mid_epoch_and_at_epoch_boundary_match_straight_run(tmp_path):
    data = _data()
    straight_model = _model()
    straight = train(straight_model, data, RegressionHooks(), _cfg(tmp_path / "a"))
    assert straight.global_step == 12  # 2 epochs x ceil(11 batches / 2)
    assert straight.last_checkpoint is None

    run = tmp_path / "b"
    with pytest.raises(Crash):
        train(_model(), data, RegressionHooks(), _cfg(run, checkpoint_every=3), log_metrics=_crash_at(10))
    assert [p.name for p in checkpoint_dirs(run)] == ["step_00000006", "step_00000009"]
    state9 = json.loads((run / "checkpoints/step_00000009" / STATE_FILE).read_text())
    assert (state9["global_step"], state9["epoch"], state9["batch_in_epoch"]) == (9, 1, 6)
    state6 = json.loads((run / "checkpoints/step_00000006" / STATE_FILE).read_text())
    assert (state6["epoch"], state6["batch_in_epoch"]) == (1, 0)  # end of epoch 0 -> start of 1

    # Mid-epoch resume (from step 9): a fresh model object, weights come from the checkpoint.
    mid_dir = tmp_path / "mid"
    shutil.copytree(run, mid_dir)
    steps_logged: list[int] = []
    mid_model = _model(dropout=0.2)
    with torch.no_grad():
        for p in mid_model.parameters():
            p.add_(1.0)  # must be overwritten by load_state
    mid = train(mid_model, data, RegressionHooks(), _cfg(mid_dir, checkpoint_every=3),
                log_metrics=lambda m, s: steps_logged.append(s))
    assert steps_logged == [10, 11, 12]
    assert mid.global_step == 12
    torch.testing.assert_close(torch.tensor(mid.losses), torch.tensor(straight.losses))
    torch.testing.assert_close(_params(mid_model), _params(straight_model))

    # Half-written newest checkpoint (no COMPLETE) and a stale temp dir are ignored: resume from 6.
    (run / "checkpoints/step_00000009" / COMPLETE_MARKER).unlink()
    (run / "checkpoints/.step_00000010.tmp").mkdir()
    assert latest_checkpoint(run).name == "step_00000006"
    hooks = RegressionHooks()
    boundary_model = _model()
    boundary = train(boundary_model, data, hooks, _cfg(run, checkpoint_every=3))
    assert len(hooks.seen) == N_EXAMPLES  # exactly epoch 1 was replayed
    torch.testing.assert_close(torch.tensor(boundary.losses), torch.tensor(straight.losses))
    torch.testing.assert_close(_params(boundary_model), _params(straight_model))
    assert not (run / "checkpoints/.step_00000010.tmp").exists()
    assert [p.name for p in checkpoint_dirs(run)] == ["step_00000009", "step_00000012"]


def test_resuming_a_finished_run_takes_no_step(tmp_path):
    data = _data()
    first = train(_model(), data, RegressionHooks(), _cfg(tmp_path, checkpoint_every=5))
    assert first.last_checkpoint.name == "step_00000012"  # final checkpoint at the last step
    hooks, logged = RegressionHooks(), []
    again = train(_model(), data, hooks, _cfg(tmp_path, checkpoint_every=5), log_metrics=lambda m, s: logged.append(s))
    assert hooks.seen == [] and logged == []
    assert again.losses == first.losses and again.global_step == 12


def test_resume_refuses_a_different_schedule(tmp_path):
    data = _data()
    train(_model(), data, RegressionHooks(), _cfg(tmp_path, checkpoint_every=4, max_steps=4))
    with pytest.raises(ValueError, match="fingerprint|written with"):
        train(_model(), data, RegressionHooks(), _cfg(tmp_path, checkpoint_every=4, max_steps=4, seed=4))
    fresh = train(_model(), data, RegressionHooks(), _cfg(tmp_path, checkpoint_every=4, max_steps=4, seed=4),
                  resume=False)
    assert fresh.global_step == 4


def test_gradient_accumulation_equals_large_batch(tmp_path):
    data = _data(48)
    big, acc = _model(dropout=0.0), _model(dropout=0.0)
    r1 = train(big, data, RegressionHooks(), _cfg(tmp_path / "big", batch_size=8, grad_accum=1, epochs=1))
    r2 = train(acc, data, RegressionHooks(), _cfg(tmp_path / "acc", batch_size=4, grad_accum=2, epochs=1))
    assert r1.global_step == r2.global_step == 6
    torch.testing.assert_close(torch.tensor(r1.losses), torch.tensor(r2.losses))
    torch.testing.assert_close(_params(big), _params(acc))


def test_metrics_logged_every_n_steps_with_extras_and_loss_decreases(tmp_path):
    logged: dict[int, dict] = {}
    res = train(_model(dropout=0.0), _data(), RegressionHooks(), _cfg(tmp_path, max_steps=102, log_every=5),
                log_metrics=lambda m, s: logged.__setitem__(s, m))
    assert sorted(logged) == [*range(5, 101, 5), 102]                 # 102 steps: every 5th (>= 20 points) and the last
    assert set(logged[5]) == {"train/loss", "train/lr", "train/epoch", "train/pred_mean"}
    torch.testing.assert_close(logged[10]["train/loss"], sum(res.losses[5:10]) / 5)
    assert logged[102]["train/lr"] == 0.0  # linear decay reaches 0 at the last step
    assert sum(res.losses[-5:]) < sum(res.losses[:5])


def test_a_short_run_logs_every_step_so_its_loss_curve_can_be_read(tmp_path):
    """36 steps with log_every=5 used to give 8 points; now each step's loss and learning rate."""
    logged: dict[int, dict] = {}
    res = train(_model(dropout=0.0), _data(), RegressionHooks(), _cfg(tmp_path, epochs=6, log_every=5),
                log_metrics=lambda m, s: logged.__setitem__(s, m))
    assert sorted(logged) == list(range(1, 37))
    torch.testing.assert_close([logged[s]["train/loss"] for s in range(1, 37)], res.losses)
    lrs = [logged[s]["train/lr"] for s in range(1, 37)]
    assert lrs[0] < lrs[1] and lrs[-1] == 0.0                          # warm-up, then linear decay to 0
    assert [log_interval(5, n) for n in (5, 36, 99, 100, 5000)] == [1, 1, 4, 5, 5]


def test_bf16_trains_on_cpu_and_leaves_an_fp32_model(tmp_path):
    model = _model(dropout=0.0)
    res = train(model, _data(), RegressionHooks(), _cfg(tmp_path, mixed_precision="bf16", max_steps=3))
    assert res.global_step == 3 and all(torch.isfinite(torch.tensor(res.losses)))
    x = torch.stack([e[1] for e in _data()])                       # (41, 4)
    lin1, lin2 = model[0], model[3]
    manual = torch.relu(x @ lin1.weight.T + lin1.bias) @ lin2.weight.T + lin2.bias
    with torch.no_grad():
        torch.testing.assert_close(model(x), manual)  # no autocast left on the returned model


@pytest.mark.slow  # a second interpreter holds the run directory
def test_a_second_process_training_into_the_same_run_directory_is_refused(tmp_path):
    """The lock is held while a run trains; a crashed run's lock is gone, so it resumes."""
    import subprocess
    import sys
    import textwrap

    from funnelrag.training import RunDirLocked, run_dir_lock

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from funnelrag.training import run_dir_lock
        with run_dir_lock(Path({str(tmp_path)!r})):
            print("locked", flush=True)
            sys.stdin.readline()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirLocked, match=str(tmp_path)):
            train(_model(), _data(), RegressionHooks(), _cfg(tmp_path, checkpoint_every=5))
        assert checkpoint_dirs(tmp_path) == []
    finally:
        holder.kill()                                     # killed, not released: the kernel drops the lock
        holder.wait()
    result = train(_model(), _data(), RegressionHooks(), _cfg(tmp_path, checkpoint_every=5))
    assert result.global_step == 12
    with run_dir_lock(tmp_path):                          # released after the run
        pass
