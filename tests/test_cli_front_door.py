"""The front door: every ``--help`` exits 0, ``funnelrag nightly`` runs the nightly flow,
``build-corpus`` with a mirror points to it before any run, ``--home`` on every flow command, and
errors a user can cause (an unknown key, a broken YAML file, a value of the wrong type) say what
and where in one or two lines with exit code 2, the traceback only with ``--verbose``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

import funnelrag.cli as cli
from funnelrag.cli import main
from funnelrag.config import WorkspaceConfig
from funnelrag.tracking import resolve_run_context

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def kept_environ():
    """``main`` sets process-level Prefect defaults in ``os.environ``: put it back afterwards."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def nothing_starts(monkeypatch, kept_environ):
    """A command that must stop at its config: fail the test if the reaper or the API would start."""
    def started(*_a, **_k):
        raise AssertionError("the command went past its config check")

    monkeypatch.setattr(cli, "ensure_reaper", started)
    monkeypatch.setattr(cli, "start_ephemeral_api", started)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


def _help_exit(argv: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(argv)
    return done.value.code, capsys.readouterr().out


def test_every_help_exits_0(capsys, kept_environ):
    commands = sorted(cli._commands())
    assert {"build-corpus", "nightly", "experiment", "demo"} <= set(commands)
    assert set(cli.COMMAND_INDEX) == set(commands)   # every command is indexed, so `funnelrag <cmd>` loads one module
    code, out = _help_exit(["--help"], capsys)
    assert code == 0 and "95% intervals" in out and "nightly" in out and "search" in out
    for name in [*commands, "search", "compare"]:
        code, out = _help_exit([name, "--help"], capsys)
        assert code == 0, name
        assert out.startswith(f"usage: funnelrag {name}"), (name, out[:200])
        if name not in ("search", "compare"):
            assert "--home" in out and "--config" in out and "--set" in out, name


def test_console_script_help():
    script = shutil.which("funnelrag") or str(Path(sys.executable).parent / "funnelrag")
    assert Path(script).exists(), "the funnelrag console script is not installed (pip install -e .)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([script, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "95% intervals" in proc.stdout and "nightly" in proc.stdout and "Traceback" not in proc.stderr


def test_argparse_text_keeps_a_percent():
    assert cli.argparse_text("95% intervals, %(prog)s") == "95%% intervals, %%(prog)s"


def test_home_sets_the_workspace_on_every_flow_command(tmp_path, capsys, kept_environ):
    home = tmp_path / "my home"
    for name in sorted(cli._commands()):
        assert main([name, "--home", str(home), "--print-config"]) == 0, name
        printed = json.loads(capsys.readouterr().out)
        assert printed["workspace"]["home"] == str(home), name
    # an explicit --set of the key wins over --home, as in a deployment's home + overrides
    assert main(["build-corpus", "--home", str(home), "--set", f"workspace.home={tmp_path}", "--print-config"]) == 0
    assert json.loads(capsys.readouterr().out)["workspace"]["home"] == str(tmp_path)


def test_build_corpus_with_a_mirror_points_to_nightly(nothing_starts, capsys):
    assert main(["build-corpus", "--set", "source.mirror=https://user:secret@dumps.example.org"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "use `funnelrag nightly`" in err and "source.mirror" in err
    assert "secret" not in err and "Traceback" not in err


def test_unknown_key_names_it_and_its_section_keys(nothing_starts, capsys):
    assert main(["build-corpus", "--set", "nonsense=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("funnelrag build-corpus: --set nonsense=1: unknown key 'nonsense'")
    assert "clustering" in err and "runner" in err and "Traceback" not in err and err.count("\n") == 1
    assert main(["build-corpus", "--set", "clustering.max_tokenz=1"]) == 2   # a dataclass section
    err = capsys.readouterr().err
    assert "unknown key 'clustering.max_tokenz'; clustering has the keys: max_tokens" in err


def test_wrong_type_names_key_value_and_type(nothing_starts, capsys):
    assert main(["build-corpus", "--set", "runner.workers=abc"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("funnelrag build-corpus: --set runner.workers=abc: runner.workers = 'abc'")
    assert "valid integer" in err and "(expected int | None)" in err and "Traceback" not in err


def test_broken_yaml_names_file_line_and_column(nothing_starts, capsys, tmp_path):
    broken = tmp_path / "broken.yaml"   # an unclosed flow mapping on line 4: the parser stops on line 5
    broken.write_text("name: x\nsource:\n  datasets: [wikispeedia]\nclustering: {max_tokens: 4096\n"
                      "runner:\n  workers: 2\n")
    assert main(["build-corpus", "--config", str(broken)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"funnelrag build-corpus: config file {broken}, line 5, column 7: ")
    assert "YAML syntax error" in err and "at line 4, column 13" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_verbose_shows_the_traceback(nothing_starts, capsys):
    assert main(["-v", "build-corpus", "--set", "runner.workers=abc"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ValidationError" in err
    assert err.rstrip().splitlines()[-1].startswith("funnelrag build-corpus: --set runner.workers=abc")
    assert main(["build-corpus", "-v", "--set", "nonsense=1"]) == 2   # after the command too
    assert "Traceback" in capsys.readouterr().err


def test_bad_values_in_a_config_file_name_the_file(nothing_starts, capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("runner:\n  workers: lots\n")
    assert main(["build-corpus", "--config", str(cfg)]) == 2
    assert f"config file {cfg}: runner.workers = 'lots'" in capsys.readouterr().err
    assert main(["build-corpus", "--set", "source.paths=[a,"]) == 2   # a value that is not YAML
    assert "override 'source.paths=[a,': the value is not YAML" in capsys.readouterr().err
    assert main(["build-corpus", "--set", "index.passage_shard_tokens=-1"]) == 2   # a section's own check
    assert capsys.readouterr().err == ("funnelrag build-corpus: --set index.passage_shard_tokens=-1: index: "
                                       "index.passage_shard_tokens must be >= 0 (0 = one passage index), got -1\n")
    assert main(["build-corpus", "--set", "source.datasets=[]"]) == 2               # the whole config's check
    assert "funnelrag build-corpus: config: source: give at least one dataset" in capsys.readouterr().err


@pytest.mark.slow
def test_nightly_command_follows_a_mirror(prefect_harness, tmp_path, data_mirror, monkeypatch, kept_environ):
    from prefect.settings import PREFECT_API_URL  # noqa: PLC0415  (heavy: prefect)

    from benchmarks.synth_dump import SAMPLE, write_mirror  # noqa: PLC0415  (test data writer)

    monkeypatch.setenv("PREFECT_API_URL", PREFECT_API_URL.value())   # the harness's API: no reaper, no second server
    mirror = tmp_path / "mirror"
    write_mirror(mirror, 200, 1, seed=5, wiki="synwiki", sample=data_mirror / SAMPLE, not_done=1)
    config = tmp_path / "nightly.yaml"
    config.write_text(yaml.safe_dump({
        "name": "synwiki", "source": {"datasets": [], "wiki": "synwiki"}, "ingest": {"format": "mediawiki"},
        "clustering": {"max_tokens": 4096}, "gate": {"enabled": False},
        "runner": {"kind": "local", "workers": 2, "streams_per_piece": 1, "docs_per_shard": 100},
        "workspace": {"data_mirror": str(data_mirror)}}))
    home = tmp_path / "home"
    night = ["nightly", "--config", str(config), "--home", str(home), "--set", f"source.mirror={mirror}"]
    assert main([*night, "--json", str(tmp_path / "full.json")]) == 0
    full = json.loads((tmp_path / "full.json").read_text())
    assert full["nightly"]["action"] == "full"
    assert (home / "stores" / "corpus" / "synwiki" / "versions" / full["version"] / "manifest.json").is_file()
    assert main([*night, "--json", str(tmp_path / "idle.json")]) == 0
    idle = json.loads((tmp_path / "idle.json").read_text())
    assert idle["nightly"]["action"] == "nothing" and idle["version"] == full["version"]
    assert idle["nightly"]["waiting_days"] == ["20260102"]   # the day not done yet: nothing to build


def test_a_failed_numba_warm_up_is_a_warning(monkeypatch, caplog):
    """The start-up's numba warm-up is first-run work only: its failure is logged with its last
    lines and the run goes on (its kernels compile where they are called)."""
    monkeypatch.setattr(cli, "NUMBA_WARMUP", ("-c", "import sys; print('no kernels here'); sys.exit(3)"))
    with caplog.at_level("WARNING", logger="funnelrag.cli"):
        cli.NumbaWarmup().join(timeout=60)
    assert "exit 3" in caplog.text and "no kernels here" in caplog.text


def test_the_numba_warm_up_is_stopped_with_the_run(monkeypatch):
    """The warm-up is never waited for: a run that ends first stops it (at exit, or by ``stop``)."""
    monkeypatch.setattr(cli, "NUMBA_WARMUP", ("-c", "import time; time.sleep(60)"))
    warm = cli.NumbaWarmup()
    assert warm.process.poll() is None
    warm.stop()
    warm.join(timeout=10)
    assert warm.process.returncode is not None and warm.process.returncode != 0


def test_a_runs_later_imports_are_done_while_the_api_starts(tmp_path, monkeypatch):
    """A command's ``imports`` are imported in the block's thread; a module that fails is left to
    the run's own import (no error here), and nothing else is made."""
    monkeypatch.delitem(sys.modules, "xml.dom.minidom", raising=False)
    cfg = types.SimpleNamespace(workspace=WorkspaceConfig(home=tmp_path / "h", tracking_uri="http://mlflow.invalid"))
    with cli.while_api_starts(cfg, ["xml.dom.minidom", "no_such_module_here"]):
        pass
    assert "xml.dom.minidom" in sys.modules and "no_such_module_here" not in sys.modules
    assert not (tmp_path / "h").exists()
    assert {"mlflow.user", "mlflow.source.name", "mlflow.source.type"} <= set(resolve_run_context())


@pytest.mark.slow
def test_the_mlflow_store_is_made_while_the_api_starts(tmp_path):
    """MLflow creates and migrates a new store (~12 s): beside the API's start, in a thread."""
    home = tmp_path / "home"
    cfg = types.SimpleNamespace(workspace=WorkspaceConfig(home=home, tracking_uri=None))
    with cli.while_api_starts(cfg):
        pass
    assert (home / "mlflow.db").is_file()
    cfg = types.SimpleNamespace(workspace=WorkspaceConfig(home=tmp_path / "other", tracking_uri="http://mlflow.invalid"))
    with cli.while_api_starts(cfg):   # a configured server: nothing made here
        pass
    assert not (tmp_path / "other").exists()
