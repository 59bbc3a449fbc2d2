"""Flow configuration: embedded defaults, YAML file, dotted overrides, typed validation."""
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from flows.corpus_build import CorpusBuildConfig, enwiki_sample_config
from funnelrag.config import config_hash, flatten_params, load_config, parse_overrides


def test_parse_overrides_nested_and_typed():
    assert parse_overrides(["a.b=1", "a.c=true", "d=x", "e=[1, 2]"]) == {"a": {"b": 1, "c": True}, "d": "x", "e": [1, 2]}
    with pytest.raises(ValueError, match="key.path=value"):
        parse_overrides(["novalue"])


def test_yaml_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("name: enwiki-sample\nsource: {datasets: [enwiki-sample]}\ningest: {format: mediawiki}\nclustering: {max_tokens: 2048}\n")
    cfg = load_config(CorpusBuildConfig, f, ["clustering.max_tokens=1024", "workspace.home=/tmp/x"])
    assert cfg.name == "enwiki-sample" and cfg.ingest.format == "mediawiki"
    assert cfg.clustering.max_tokens == 1024 and str(cfg.workspace.home) == "/tmp/x"


def test_unknown_key_and_bad_type_are_rejected(tmp_path):
    with pytest.raises(ValidationError, match="nonsense"):
        load_config(CorpusBuildConfig, None, ["nonsense=1"])
    with pytest.raises(ValidationError):
        load_config(CorpusBuildConfig, None, ["clustering.max_tokens=lots"])
    with pytest.raises(FileNotFoundError):
        load_config(CorpusBuildConfig, tmp_path / "missing.yaml")


def test_tokenizers_must_agree():
    with pytest.raises(ValidationError, match="same tokenizer"):
        load_config(CorpusBuildConfig, None, ["clustering.tokenizer=whitespace"])


def test_hash_and_params_are_stable():
    a, b = enwiki_sample_config(), enwiki_sample_config()
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(CorpusBuildConfig())
    params = flatten_params(a.model_dump(exclude={"workspace"}))
    assert params["clustering.max_tokens"] == "4096" and params["ingest.format"] == "mediawiki"


@pytest.mark.parametrize("name", ["corpus_enwiki_sample.yaml", "corpus_full_enwiki.yaml", "corpus_wikispeedia.yaml"])
def test_shipped_corpus_configs_load(name):
    """Every shipped corpus config validates (a renamed setting would fail the nightly build at its start)."""
    from pathlib import Path  # noqa: PLC0415

    cfg = load_config(CorpusBuildConfig, Path(__file__).resolve().parents[1] / "configs" / name)
    if name == "corpus_full_enwiki.yaml":
        assert cfg.index.sharded and cfg.runner.tokens_per_shard == cfg.index.passage_shard_tokens == 32_000_000
        assert cfg.runner.workers is None   # follows the machine: one worker per CPU this process may use
        assert cfg.runner.n_workers() == len(os.sched_getaffinity(0)) >= 1


def test_old_passage_shard_count_is_rejected():
    with pytest.raises(ValidationError, match="passage_shards"):
        load_config(CorpusBuildConfig, None, ["index.passage_shards=64"])
    with pytest.raises(ValidationError, match="passage_shard_tokens must be >= 0"):
        load_config(CorpusBuildConfig, None, ["index.passage_shard_tokens=-1"])


def test_home_defaults_to_funnelrag_home_env(monkeypatch, tmp_path):
    """Every command's home (flow configs, search, compare) honours $FUNNELRAG_HOME."""
    from funnelrag.config import WorkspaceConfig

    monkeypatch.delenv("FUNNELRAG_HOME", raising=False)
    assert WorkspaceConfig().home == Path("funnelrag-home")
    monkeypatch.setenv("FUNNELRAG_HOME", str(tmp_path / "srv"))
    assert WorkspaceConfig().home == tmp_path / "srv"
    assert WorkspaceConfig(home=tmp_path / "other").home == tmp_path / "other"   # explicit wins


def test_missing_mirror_error_names_the_setting(tmp_path):
    from funnelrag.datasets import DataUnavailable, resolve

    with pytest.raises(DataUnavailable, match="set FUNNELRAG_DATA_MIRROR .* `prefect worker start`"):
        resolve("enwiki-sample", None)
