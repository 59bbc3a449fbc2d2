"""Faults that must never pass quietly: each names what failed (file, shard, run) and leaves no
half-written output or stale state behind."""
from __future__ import annotations

import errno
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from data_contracts.base import atomic_write, atomic_write_bytes

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ disk full during an artifact write

def _disk_full(_path: Path) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_names_the_path_and_keeps_errno(tmp_path):
    final = tmp_path / "stores" / "x.parquet"
    final.parent.mkdir(parents=True)
    final.write_bytes(b"old")
    with pytest.raises(OSError) as info:
        atomic_write(final, _disk_full)
    assert info.value.errno == errno.ENOSPC
    assert str(final) in str(info.value) and "disk" in str(info.value).lower()
    assert final.read_bytes() == b"old"
    assert sorted(p.name for p in final.parent.iterdir()) == ["x.parquet"]   # no temporary left


def test_quota_exceeded_names_the_path(tmp_path, monkeypatch):
    def no_quota(self, data):
        raise OSError(errno.EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(Path, "write_bytes", no_quota)
    final = tmp_path / "y.json"
    with pytest.raises(OSError) as info:
        atomic_write_bytes(final, b"{}")
    assert info.value.errno == errno.EDQUOT and str(final) in str(info.value)


def test_other_os_errors_pass_unchanged(tmp_path):
    def denied(_path):
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError, match="Permission denied"):
        atomic_write(tmp_path / "z", denied)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_disk_full_on_a_real_small_file_system(tiny_tmpfs):
    import pyarrow as pa  # noqa: PLC0415

    from data_contracts.base import Contract, ContractWriter  # noqa: PLC0415

    final = tiny_tmpfs / "big.bin"
    with pytest.raises(OSError) as info:
        atomic_write_bytes(final, b"x" * (1 << 20))
    assert info.value.errno == errno.ENOSPC and str(final) in str(info.value)
    assert list(tiny_tmpfs.iterdir()) == []

    contract = Contract(name="blobs", filename="blobs.parquet", schema=pa.schema([("b", pa.binary())]))
    with pytest.raises(OSError) as info, ContractWriter(contract, tiny_tmpfs, row_group_size=None) as w:
        w.write({"b": [os.urandom(16384) for _ in range(16)]})
    assert info.value.errno == errno.ENOSPC and "blobs.parquet" in str(info.value)
    assert list(tiny_tmpfs.iterdir()) == []


# ------------------------------------------------------------------ a CSV-quoted questions file named .tsv

def test_csv_quoted_tsv_is_read_as_dpr_csv(tmp_path):
    from tasks.qa.questions import read_questions  # noqa: PLC0415

    comma = tmp_path / "trivia-test.tsv"          # pyserini's TriviaQA: comma-separated, quoted
    comma.write_text('"Who wrote Babbitt?","[\'Sinclair Lewis\', \'Lewis\']"\n'
                     '"Which ""Bond"" film came first?","[\'Dr. No\']"\n', encoding="utf-8")
    tab = tmp_path / "nq-test.tsv"                # DPR's qa.csv quoting with tab separators
    tab.write_text('who wrote babbitt\t"[""Sinclair Lewis""]"\n', encoding="utf-8")
    rows = read_questions(comma)
    assert [(r["question"], r["answers"]) for r in rows] == [
        ("Who wrote Babbitt?", ["Sinclair Lewis", "Lewis"]), ('Which "Bond" film came first?', ["Dr. No"])]
    assert [(r["question"], r["answers"]) for r in read_questions(tab)] == [("who wrote babbitt", ["Sinclair Lewis"])]


def test_csv_quoted_record_later_in_a_tsv_names_dpr_csv(tmp_path):
    from tasks.qa.questions import read_questions  # noqa: PLC0415

    mixed = tmp_path / "mixed.tsv"
    mixed.write_text("who wrote babbitt\t['Sinclair Lewis']\n"
                     'who is bond\t"[\'Sean Connery\']"\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"mixed\.tsv:2: .*format: dpr-csv"):
        read_questions(mixed)


# ------------------------------------------------------------------ multistream index problems

@pytest.fixture(scope="module")
def enwiki_xml(data_mirror) -> bytes:
    import bz2  # noqa: PLC0415

    from funnelrag.datasets import resolve  # noqa: PLC0415

    return bz2.decompress(resolve("enwiki-sample", data_mirror).read_bytes())


def _ingest_digests(dump: Path, out: Path, submit=None) -> dict:
    from data_contracts.base import sha256_file  # noqa: PLC0415
    from tasks.sources.ingest import IngestConfig, ingest  # noqa: PLC0415

    kw = {"submit": submit, "streams_per_piece": 3} if submit else {}
    ingest([dump], out, IngestConfig(format="mediawiki"), **kw)
    return {p.name: sha256_file(p) for p in sorted(out.glob("*.parquet"))}


def test_truncated_index_is_named_and_the_dump_scanned(enwiki_xml, tmp_path, caplog):
    from benchmarks.synth_dump import repack  # noqa: PLC0415
    from tasks.sources.ingest.multistream import index_offsets, index_path, plan_layout  # noqa: PLC0415

    dump = tmp_path / "cut-multistream.xml.bz2"
    repack(enwiki_xml, dump, pages_per_stream=10)
    good = plan_layout(dump, streams_per_piece=3)
    index = index_path(dump)
    index.write_bytes(index.read_bytes()[: index.stat().st_size // 2])
    with pytest.raises(ValueError, match=re.escape(str(index))):
        index_offsets(index)
    with caplog.at_level("WARNING"):
        layout = plan_layout(dump, streams_per_piece=3)
    assert layout.source == "scan" and layout.pieces == good.pieces
    assert str(index) in caplog.text and "scan" in caplog.text


@pytest.mark.slow
def test_foreign_index_is_blamed_and_the_dump_scanned(enwiki_xml, tmp_path, caplog):
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from benchmarks.synth_dump import repack  # noqa: PLC0415
    from tasks.sources.ingest.multistream import index_path, plan_layout  # noqa: PLC0415

    dump = tmp_path / "a" / "enwiki-multistream.xml.bz2"
    other = tmp_path / "b" / "enwiki-multistream.xml.bz2"
    dump.parent.mkdir(), other.parent.mkdir()
    repack(enwiki_xml, dump, pages_per_stream=10)
    repack(enwiki_xml, other, pages_per_stream=7)
    serial = _ingest_digests(dump, tmp_path / "serial")
    index_path(dump).write_bytes(index_path(other).read_bytes())   # the index of another dump
    with caplog.at_level("WARNING"):
        layout = plan_layout(dump, streams_per_piece=3)
    assert layout.source == "scan" and sum(p.n_streams for p in layout.pieces) == 21
    assert str(index_path(dump)) in caplog.text and "stream header" in caplog.text
    with ThreadPoolExecutor(2) as ex:
        assert _ingest_digests(dump, tmp_path / "parallel", ex.submit) == serial


# ------------------------------------------------------------------ interrupted runs end KILLED

_RUN_UNTIL_KILLED = """
import sys, time
from funnelrag.tracking import flow_run
from funnelrag.workspace import Workspace
with flow_run(Workspace(sys.argv[1]), "interrupts", "sleeper", {"a": 1}) as run:
    print(run.info.run_id, flush=True)
    time.sleep(120)
"""


def _runs(home: Path, experiment: str) -> dict[str, object]:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return {r.info.run_id: r for r in client.search_runs([exp.experiment_id])}


@pytest.mark.slow
def test_sigterm_ends_the_mlflow_run_killed(tmp_path):

    proc = subprocess.Popen([sys.executable, "-c", _RUN_UNTIL_KILLED, str(tmp_path)], stdout=subprocess.PIPE,
                            text=True, cwd=Path(__file__).parent.parent)
    run_id = proc.stdout.readline().strip()
    assert run_id, "the flow run did not start"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) != 0
    assert _runs(tmp_path, "interrupts")[run_id].info.status == "KILLED"


@pytest.mark.slow
def test_ctrl_c_ends_the_mlflow_run_killed(tmp_path):
    from funnelrag.tracking import flow_run  # noqa: PLC0415
    from funnelrag.workspace import Workspace  # noqa: PLC0415

    with pytest.raises(KeyboardInterrupt), flow_run(Workspace(tmp_path), "interrupts", "ctrl-c", {}) as run:
        raise KeyboardInterrupt
    runs = _runs(tmp_path, "interrupts")
    assert runs[run.info.run_id].info.status == "KILLED"
    assert runs[run.info.run_id].data.tags["funnelrag.pid"] == str(os.getpid())


@pytest.mark.slow
def test_a_dead_process_run_is_marked_killed_by_the_next_start(tmp_path):
    import socket  # noqa: PLC0415

    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    from funnelrag.tracking import configure, ensure_experiment, flow_run  # noqa: PLC0415
    from funnelrag.workspace import Workspace  # noqa: PLC0415

    ws = Workspace(tmp_path)
    client = MlflowClient(configure(ws))
    exp_id = ensure_experiment(ws, "interrupts")
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = client.create_run(exp_id, run_name="killed -9", tags={"funnelrag.pid": str(dead.pid),
                                                                  "funnelrag.host": socket.gethostname()}).info.run_id
    alive = client.create_run(exp_id, run_name="still running", tags={"funnelrag.pid": str(os.getpid()),
                                                                      "funnelrag.host": socket.gethostname()}).info.run_id
    elsewhere = client.create_run(exp_id, run_name="other host", tags={"funnelrag.pid": str(dead.pid),
                                                                       "funnelrag.host": "another-box"}).info.run_id
    with flow_run(ws, "interrupts", "next", {}):
        pass
    runs = _runs(tmp_path, "interrupts")
    assert runs[stale].info.status == "KILLED" and "dead" in runs[stale].data.tags["funnelrag.killed"]
    assert runs[alive].info.status == "RUNNING" and runs[elsewhere].info.status == "RUNNING"


# ------------------------------------------------------------------ inputs checked before anything starts

@pytest.fixture
def nothing_starts(monkeypatch):
    """Fail if the CLI gets as far as starting the Prefect API reaper or a flow."""
    import funnelrag.reaper  # noqa: PLC0415

    def started(*_a, **_k):
        raise AssertionError("the command started before its inputs were checked")

    monkeypatch.setattr(funnelrag.reaper, "start_reaper", started)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)


def test_directory_given_as_a_dump_is_named_before_anything_starts(tmp_path, nothing_starts, capsys):
    from funnelrag.cli import main  # noqa: PLC0415

    dumps = tmp_path / "dumps"
    dumps.mkdir()
    assert main(["build-corpus", "--set", "ingest.format=mediawiki", "--set", f"source.paths=[{dumps}]"]) == 2
    err = capsys.readouterr().err
    assert f"source.paths: {dumps} is a directory" in err and "expected a dump file" in err


@pytest.mark.slow
def test_missing_inputs_are_all_named_before_anything_starts(tmp_path, nothing_starts, capsys):
    from funnelrag.cli import main  # noqa: PLC0415

    missing = tmp_path / "nq-test.tsv"
    assert main(["evaluate", "--set", f"questions.paths=[{missing}, {tmp_path}]"]) == 2
    err = capsys.readouterr().err
    assert f"questions.paths: {missing} does not exist" in err
    assert f"questions.paths: {tmp_path} is a directory; expected a questions file" in err
    assert main(["distill", "--config", str(tmp_path)]) == 2
    assert f"config file {tmp_path} is a directory" in capsys.readouterr().err
    assert main(["build-corpus", "--set", f"gate.paths=[{missing}]"]) == 2
    assert f"gate.paths: {missing} does not exist" in capsys.readouterr().err


def test_flow_configs_list_their_input_files(tmp_path):
    from flows.corpus_build import CorpusBuildConfig  # noqa: PLC0415
    from flows.funnel import DistillationConfig  # noqa: PLC0415
    from funnelrag.inputs import InputFileError, check_inputs  # noqa: PLC0415

    qa = tmp_path / "dev.tsv"
    qa.write_text("q\t['a']\n")
    check_inputs(DistillationConfig.model_validate({"questions": {"paths": [str(qa)]}}))
    with pytest.raises(InputFileError, match=r"questions\.paths: .*nope\.tsv does not exist"):
        check_inputs(DistillationConfig.model_validate({"questions": {"paths": [str(tmp_path / "nope.tsv")]}}))
    with pytest.raises(InputFileError, match=r"source\.paths: .* is a directory; expected a dump file"):
        check_inputs(CorpusBuildConfig.model_validate({"source": {"paths": [str(tmp_path)]}}))


@pytest.mark.slow
def test_flows_check_inputs_before_mlflow(prefect_harness, workspace_home, tmp_path):
    from flows.corpus_build import CorpusBuildConfig, corpus_build_flow  # noqa: PLC0415
    from flows.evaluate import EvaluateConfig, evaluate_flow  # noqa: PLC0415
    from funnelrag.inputs import InputFileError  # noqa: PLC0415

    ws = {"home": str(workspace_home)}
    with pytest.raises(InputFileError, match=r"source\.paths: .* is a directory"):
        corpus_build_flow(CorpusBuildConfig.model_validate({"source": {"paths": [str(tmp_path)]}, "workspace": ws}))
    with pytest.raises(InputFileError, match=r"questions\.paths: .*absent\.tsv does not exist"):
        evaluate_flow(EvaluateConfig.model_validate({"questions": {"paths": [str(tmp_path / "absent.tsv")]},
                                                     "workspace": ws}))
    assert not (workspace_home / "mlflow.db").exists()


# ------------------------------------------------------------------ a dead local worker

def square_or_die(marker: str, x: int, die: str) -> int:
    """``x * x``; when ``die`` is ``"once"`` and ``marker`` is absent (or ``"always"``), first kill
    this worker process as the OOM killer would."""

    if die == "always" or (die == "once" and not Path(marker).exists()):
        Path(marker).touch()
        os.kill(os.getpid(), signal.SIGKILL)
    return x * x


@pytest.mark.slow
def test_a_shard_whose_worker_died_is_retried_on_a_fresh_pool(prefect_harness, tmp_path):
    from prefect import flow  # noqa: PLC0415

    from flows.runners import RunnerConfig, ShardRunner  # noqa: PLC0415

    @flow
    def squares(die_at: int, die: str) -> list[int]:
        with ShardRunner(RunnerConfig(workers=2)) as runner, runner.pool("squares") as pool:
            futures = [pool.submit(square_or_die, str(tmp_path / f"died-{i}"), i, die if i == die_at else "")
                       for i in range(6)]
            return [f.result() for f in futures]

    import logging  # noqa: PLC0415

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__(logging.WARNING)
            self.lines: list[str] = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    handler = Lines()
    logging.getLogger("flows.runners").addHandler(handler)
    try:
        assert squares(3, "once") == [i * i for i in range(6)]
    finally:
        logging.getLogger("flows.runners").removeHandler(handler)
    assert any("square_or_die" in m and "died-3', 3, 'once')" in m and "retrying it on a fresh process pool" in m
               for m in handler.lines), handler.lines
    with pytest.raises(RuntimeError, match=r"(?s)shard square_or_die\(.*died-4', 4, 'always'\).*3 attempts"):
        squares(4, "always")




def sleep_in_shard(marker: str, seconds: float) -> None:
    """A shard that announces its start with a file, then sleeps ``seconds``."""
    import time  # noqa: PLC0415

    Path(marker).touch()
    time.sleep(seconds)


class Interrupted(BaseException):
    """What a flow engine's SIGTERM handler raises (Prefect's ``TerminationSignal``)."""


@pytest.mark.slow
def test_an_interrupted_stage_does_not_run_its_in_flight_shards_again(tmp_path):
    """SIGTERM while two shards run and two wait, under a caller that waits for its shards before
    re-raising (as ingest's pass 1 does, so no worker still writes into its scratch directory):
    the pool's handler stops the workers, their broken futures raise at once and are not run again
    on a fresh pool, so the wait ends in seconds, not after the shards' 60 s."""
    import threading  # noqa: PLC0415
    import time  # noqa: PLC0415

    from flows.runners import RunnerConfig, ShardRunner  # noqa: PLC0415

    def raise_interrupted(signum, frame):
        raise Interrupted(signum)

    def interrupt_when_both_run() -> None:
        deadline = time.monotonic() + 300
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    warnings: list[str] = []

    class Lines(logging.Handler):
        def emit(self, record):
            warnings.append(record.getMessage())

    handler = Lines(logging.WARNING)
    logging.getLogger("flows.runners").addHandler(handler)
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    waited: list[float] = []
    try:
        with pytest.raises(Interrupted):
            with ShardRunner(RunnerConfig(workers=2)) as runner, runner.pool("sleepy") as pool:
                futures = [pool.submit(sleep_in_shard, str(tmp_path / f"started-{i}"), 60.0) for i in range(4)]
                threading.Thread(target=interrupt_when_both_run, daemon=True).start()
                try:
                    for f in futures:
                        f.result()
                except BaseException:
                    t0 = time.monotonic()
                    for f in futures:
                        f.cancel()
                    for f in futures:
                        try:
                            f.result()
                        except BaseException:  # noqa: BLE001 - the interrupt is the one re-raised
                            pass
                    waited.append(time.monotonic() - t0)
                    raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        logging.getLogger("flows.runners").removeHandler(handler)
    print(f"\nSIGTERM → in-flight shards given up in {waited[0]:.2f} s; {pool.renewed} pools renewed")
    assert pool.interrupted and pool.renewed == 0, warnings
    assert not [m for m in warnings if "retrying" in m], warnings
    assert waited[0] < 30.0
    assert sorted(p.name for p in tmp_path.glob("started-*")) == ["started-0", "started-1"]   # queued ones never ran
