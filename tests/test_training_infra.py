"""The accelerate YAMLs and DeepSpeed JSONs in infra/ load, and every DeepSpeed "auto" is
filled from a TrainConfig the way accelerate fills it at ``prepare`` time."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from funnelrag.training import TrainConfig

INFRA = Path(__file__).resolve().parents[1] / "infra"


def _load(name: str):
    from accelerate.commands.config.config_args import load_config_from_file

    return load_config_from_file(str(INFRA / "accelerate" / f"{name}.yaml"))


def test_cpu_2proc_uses_the_multi_process_launcher():
    from accelerate.utils import DistributedType

    cfg = _load("cpu_2proc")
    # MULTI_CPU would go through mpirun; torchrun + cpu=True yields gloo MULTI_CPU per rank.
    assert cfg.distributed_type == DistributedType.MULTI_GPU and cfg.num_processes == 2
    assert _load("single_gpu").num_processes == 1


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_autos_are_filled_from_train_config(stage):
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    cluster = _load(f"multi_gpu_deepspeed_zero{stage}")
    assert cluster.distributed_type == DistributedType.DEEPSPEED
    ds_file = INFRA.parent / cluster.deepspeed_config["deepspeed_config_file"]
    raw = json.loads(ds_file.read_text())
    assert raw["zero_optimization"]["stage"] == stage
    assert "optimizer" not in raw and "scheduler" not in raw  # train() builds AdamW + LambdaLR
    assert raw["gradient_clipping"] == raw["train_micro_batch_size_per_gpu"] == "auto"

    tc = TrainConfig(output_dir="unused", batch_size=4, grad_accum=2, mixed_precision="bf16", max_grad_norm=0.5)
    plugin = DeepSpeedPlugin(hf_ds_config=str(ds_file))
    hidden = 256
    fills = {"train_micro_batch_size_per_gpu": tc.batch_size,
             "gradient_accumulation_steps": tc.grad_accum,
             "train_batch_size": tc.batch_size * tc.grad_accum * 8,
             "gradient_clipping": tc.max_grad_norm,
             "bf16.enabled": tc.mixed_precision == "bf16",
             "zero_optimization.reduce_bucket_size": hidden * hidden,
             "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
             "zero_optimization.stage3_param_persistence_threshold": 10 * hidden}
    plugin.deepspeed_config_process(must_match=True, **fills)
    filled = plugin.deepspeed_config
    assert "auto" not in json.dumps(filled)
    assert filled["gradient_clipping"] == 0.5 and filled["bf16"]["enabled"] is True
    assert filled["train_micro_batch_size_per_gpu"] == 4 and filled["gradient_accumulation_steps"] == 2
