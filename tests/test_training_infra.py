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


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_bucket_autos_are_filled_from_our_models(stage, data_mirror):
    """accelerate sizes ZeRO buckets from ``model.config.hidden_size`` and raises when a model has
    none; our FiD reader is a plain ``nn.Module`` around T5, so train() fills them itself."""
    from types import SimpleNamespace

    from accelerate.utils import DeepSpeedPlugin

    from funnelrag.datasets import resolve
    from funnelrag.training import DEEPSPEED_HIDDEN_SIZE_KEYS, _configure_deepspeed, model_hidden_size
    from models.fid import FiDConfig, FiDReader

    tok_dir = resolve("t5-tokenizer", data_mirror).parent
    model, _ = FiDReader.from_config(FiDConfig(tokenizer=str(tok_dir), d_model=48, n_layers=1,
                                               n_heads=2, d_ff=64))
    assert not hasattr(model, "config") and model_hidden_size(model) == 48
    plugin = DeepSpeedPlugin(hf_ds_config=str(INFRA / "deepspeed" / f"zero{stage}.json"))
    autos = [k for k in DEEPSPEED_HIDDEN_SIZE_KEYS if plugin.is_auto(k)]
    assert autos  # what accelerate's prepare() would refuse for a model without .config
    _configure_deepspeed(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
                         TrainConfig(output_dir="unused", max_grad_norm=0.5), model)
    assert not [k for k in DEEPSPEED_HIDDEN_SIZE_KEYS if plugin.is_auto(k)]
    zero = plugin.deepspeed_config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 48 * 48 and plugin.deepspeed_config["gradient_clipping"] == 0.5
    if stage == 3:
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 48 * 48)
        assert zero["stage3_param_persistence_threshold"] == 480


def test_deepspeed_bucket_autos_without_hidden_size_name_the_model():
    from types import SimpleNamespace

    import torch
    from accelerate.utils import DeepSpeedPlugin

    from funnelrag.training import _configure_deepspeed

    plugin = DeepSpeedPlugin(hf_ds_config=str(INFRA / "deepspeed" / "zero2.json"))
    with pytest.raises(ValueError, match=r"Linear: no submodule has config.hidden_size.*DeepSpeed JSON"):
        _configure_deepspeed(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
                             TrainConfig(output_dir="unused"), torch.nn.Linear(2, 2))
