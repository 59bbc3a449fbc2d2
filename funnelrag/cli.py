"""``funnelrag`` command line: one subcommand per flow, each with ``--config`` and ``--set``.

Examples::

    funnelrag demo                                   # the whole job on the embedded defaults
    funnelrag demo --set 'steps=[dr-rag, r2ag]'      # the other two systems
    funnelrag build-corpus --config configs/corpus_enwiki_sample.yaml --set clustering.max_tokens=2048
    funnelrag nightly --config configs/corpus_full_enwiki.yaml --home /data/funnelrag-home
    funnelrag search "who wrote the origin of species"
    funnelrag distill --config configs/distillation_wikispeedia_cpu.yaml --set n_train=150
    funnelrag evaluate --config configs/evaluate_demo.yaml --print-config
    funnelrag experiment --config configs/distillation_experiment_cpu.yaml --set parts=[candidates]
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import gc
import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from pydantic import ValidationError

from funnelrag.config import RUN_LOGGERS, ConfigError, FlowCommand, WorkspaceConfig, explain_validation_error, load_config
from funnelrag.display import format_value
from funnelrag.inputs import InputFileError, check_inputs
from funnelrag.progress import heartbeat
from funnelrag.reaper import ensure_reaper
from funnelrag.store import write_json
from funnelrag.workspace import Workspace

log = logging.getLogger(__name__)

# Flow modules that export ``COMMANDS: list[FlowCommand]``; imported only when needed.
FLOW_MODULES = (
    "flows.corpus_build",
    "flows.corpus_nightly",
    "flows.funnel",
    "flows.evaluate",
    "flows.experiment",
    "flows.embed",
    "flows.dr_rag",
    "flows.r2ag",
    "flows.demo",
)

# command → module, so ``funnelrag <cmd>`` imports one flow module (prefect/torch imports are slow).
COMMAND_INDEX = {
    "build-corpus": "flows.corpus_build",
    "nightly": "flows.corpus_nightly",
    "demo": "flows.demo",
    "distill": "flows.funnel",
    "train-reader": "flows.funnel",
    "score-passages": "flows.funnel",
    "distill-preranker": "flows.funnel",
    "evaluate": "flows.evaluate",
    "experiment": "flows.experiment",
    "embed-corpus": "flows.embed",
    "dr-rag": "flows.dr_rag",
    "dr-rag-train": "flows.dr_rag",
    "dr-rag-evaluate": "flows.dr_rag",
    "train-r2former": "flows.r2ag",
    "evaluate-r2ag": "flows.r2ag",
}


# A fresh PREFECT_HOME creates and migrates the API's database on the first start: more than
# Prefect's default 20 s on a busy 2-core box. The user's own value (env, .env, prefect.toml,
# pyproject.toml or profile) wins.
EPHEMERAL_STARTUP_TIMEOUT_S = 300


def prefect_process_defaults() -> None:
    """Process-level Prefect settings of a flow command, set before any flow module is imported.

    * ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` = :data:`EPHEMERAL_STARTUP_TIMEOUT_S`
      unless the user set it in any Prefect settings source;
    * :data:`RUN_LOGGERS` added to ``PREFECT_LOGGING_EXTRA_LOGGERS`` (kept: the user's names), so
      their lines reach the flow and task run logs; lines logged outside a run are not sent to the
      API (``PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW=ignore`` unless set).

    Set in ``os.environ``, so spawned workers read the same values, and Prefect's global settings
    are refreshed from them (importing ``prefect.settings`` does not configure logging yet). When
    prefect is already set up in this process (``main`` called from Python, e.g. under the test
    harness), only the environment is set: its settings contexts are left alone.
    """
    already_set_up = "prefect.main" in sys.modules
    from prefect.settings import Settings  # noqa: PLC0415  (after argv: `search` never imports prefect)

    current = Settings()
    if "startup_timeout_seconds" not in current.server.ephemeral.model_fields_set:
        os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = str(EPHEMERAL_STARTUP_TIMEOUT_S)
    extra = [str(n) for n in (current.logging.extra_loggers or [])]
    os.environ["PREFECT_LOGGING_EXTRA_LOGGERS"] = ",".join([*extra, *(n for n in RUN_LOGGERS if n not in extra)])
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
    if not already_set_up:
        import prefect.context  # noqa: PLC0415  (heavy: prefect, only for a flow command)

        prefect.context.refresh_global_settings_context()


def start_ephemeral_api(cfg: Any = None, imports: Sequence[str] = ()) -> None:
    """Start the ephemeral Prefect API now, with a line every 30 s while it starts (a fresh
    PREFECT_HOME creates and migrates its database: minutes on a busy box), instead of silently
    inside the first flow call. The flows then find it running (Prefect keeps one per process).
    Nothing happens when an API URL is configured or ephemeral mode is off.

    The API's start keeps one core busy (its subprocess migrates the database); meanwhile
    :func:`while_api_starts` does first-run work of ``cfg``'s run (and imports ``imports``) on
    the other one."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED  # noqa: PLC0415  (heavy: prefect, only for a flow command)

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    from prefect.server.api.server import SubprocessASGIServer  # noqa: PLC0415  (heavy: prefect's server, only when the ephemeral API starts)

    server = SubprocessASGIServer()
    if not server.running:
        with heartbeat("starting the ephemeral Prefect API (a new PREFECT_HOME creates its database first)"), \
                while_api_starts(cfg, imports):
            server.start()


# Commands whose runs build a corpus, and so call every numba kernel of flows/numba_warmup.py.
NUMBA_WARMUP_COMMANDS = frozenset({"demo", "build-corpus", "nightly"})
NUMBA_WARMUP = ("-m", "flows.numba_warmup")   # the child's arguments after the interpreter


@contextlib.contextmanager
def while_api_starts(cfg: Any, imports: Sequence[str] = ()) -> Iterator[None]:
    """First-run work done beside the ephemeral API's start, in a thread, waited for at the end
    of the block: the home's MLflow SQLite store is created and migrated
    (:func:`funnelrag.tracking.ensure_sqlite_database`, once per process and URI: the flow's own
    call then finds it ready; ~8 s on a fresh home) when ``cfg.workspace`` uses the home's store;
    MLflow's run-context tags are resolved once (:func:`funnelrag.tracking.resolve_run_context`:
    the imports of the first ``start_run``) when ``cfg`` has a workspace; then the modules
    ``imports`` are imported (:attr:`funnelrag.config.FlowCommand.imports`: the demo's steps' flow
    modules and model code, torch and transformers among them, ~13 CPU s that the steps would
    otherwise spend with the other core idle).

    An error of the MLflow store is raised here, as the flow would have raised it; a module that
    fails to import is left for the run's own import to raise, where it names its step.
    """
    workspace = getattr(cfg, "workspace", None)
    make_store = workspace is not None and workspace.tracking_uri is None
    if workspace is None and not imports:
        yield
        return
    errors: list[BaseException] = []
    start = time.monotonic()
    seconds: dict[str, float] = {}

    def first_run_work() -> None:
        try:
            if make_store:
                from funnelrag.tracking import ensure_sqlite_database  # noqa: PLC0415  (heavy: mlflow, only for a flow command)

                ws = Workspace(workspace.home)
                ws.home.mkdir(parents=True, exist_ok=True)
                ensure_sqlite_database(ws.tracking_uri())
                seconds["MLflow store"] = time.monotonic() - start
        except BaseException as exc:  # noqa: BLE001  (re-raised in the main thread below)
            errors.append(exc)
            return
        t0 = time.monotonic()
        if workspace is not None:
            try:
                from funnelrag.tracking import resolve_run_context  # noqa: PLC0415  (heavy: mlflow, only for a flow command)

                resolve_run_context()
            except Exception as exc:  # noqa: BLE001  (the flow's first run resolves them again and raises)
                log.debug("resolving MLflow's run context beside the API's start failed: %s", exc)
        for module in imports:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001  (the run's own import raises it, naming its step)
                log.debug("importing %s beside the API's start failed: %s", module, exc)
        if workspace is not None or imports:
            seconds["run context and imports"] = time.monotonic() - t0

    thread = threading.Thread(target=first_run_work, name="funnelrag-first-run", daemon=True)
    thread.start()
    try:
        yield
    finally:
        api_up = time.monotonic()
        thread.join()
    if errors:
        raise errors[0]
    log.info("beside the API's start: %s; waited %.0f s for them after the API was up",
             ", ".join(f"{what} {s:.0f} s" for what, s in seconds.items()), time.monotonic() - api_up)


class NumbaWarmup:
    """The corpus build's numba kernels compiled into their on-disk cache by a child process
    (``python -m flows.numba_warmup``; ~14 CPU s on a fresh checkout, a cache load after), started
    once the ephemeral API is up, so it does not compete with the API's database migration, and
    never waited for: it runs beside the build's first stage (the ingest, one core busy), which
    calls no kernel the warm-up compiles last. A kernel the build reaches first compiles there,
    as without the warm-up (numba writes each cache entry whole, so either copy is complete).

    Its failure is logged at WARNING with its last lines and costs nothing else. The child is
    stopped when this process exits or :meth:`stop` is called.
    """

    def __init__(self) -> None:
        self._log = tempfile.TemporaryFile()
        root = str(Path(__file__).resolve().parents[1])   # the checkout this process runs: the child imports it too
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.start = time.monotonic()
        self.process = subprocess.Popen([sys.executable, *NUMBA_WARMUP], stdin=subprocess.DEVNULL,
                                        stdout=self._log, stderr=subprocess.STDOUT, env=env)
        self._watcher = threading.Thread(target=self._watch, name="funnelrag-numba-warmup", daemon=True)
        self._watcher.start()
        atexit.register(self.stop)

    def _watch(self) -> None:
        """Wait for the child; log its outcome (its last 5 lines on failure)."""
        if self.process.wait() != 0:
            self._log.seek(0)
            tail = self._log.read().decode("utf-8", "replace").strip().splitlines()[-5:]
            log.warning("compiling the numba kernels ahead of the run failed (exit %s); they compile where the "
                        "run calls them: %s", self.process.returncode, " | ".join(tail))
        else:
            log.debug("numba kernels compiled ahead of the run in %.0f s", time.monotonic() - self.start)
        self._log.close()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the child has ended and its outcome is logged."""
        self._watcher.join(timeout)

    def stop(self) -> None:
        """Stop the child if it still runs (the run ended or was interrupted first)."""
        if self.process.poll() is None:
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=5)
        atexit.unregister(self.stop)


HOME_HELP = "funnelrag home: sets workspace.home (default: $FUNNELRAG_HOME, else ./funnelrag-home)"


def argparse_text(text: str) -> str:
    """One of our texts as an argparse ``help``: argparse %-formats every help string
    (``%(default)s``), so a literal ``%`` ("95% intervals") is doubled."""
    return text.replace("%", "%%")


def _commands(only: str | None = None) -> dict[str, FlowCommand]:
    """Import flow modules and collect their commands (only the module of ``only`` if known)."""
    found: dict[str, FlowCommand] = {}
    modules = [COMMAND_INDEX[only]] if only in COMMAND_INDEX else FLOW_MODULES
    for module in modules:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:  # a flow module not present in this checkout
                continue
            raise
        for cmd in getattr(mod, "COMMANDS", []):
            found[cmd.name] = cmd
    return found


def print_summary(summary: Any, indent: int = 0, out=sys.stdout) -> None:
    """Print a flow's summary dict as indented ``key: value`` lines (tables as rows)."""
    pad = " " * indent
    if isinstance(summary, dict):
        width = max((len(str(k)) for k in summary), default=0)
        for k, v in summary.items():
            if isinstance(v, (dict, list)) and v:
                print(f"{pad}{k}:", file=out)
                print_summary(v, indent + 2, out)
            else:
                print(f"{pad}{str(k):<{width}} : {format_value(v)}", file=out)
    elif isinstance(summary, list):
        if summary and all(isinstance(r, dict) for r in summary):
            cols = list(dict.fromkeys(k for r in summary for k in r))
            widths = {c: max(len(c), *(len(format_value(r.get(c, ""))) for r in summary)) for c in cols}
            print(pad + "  ".join(f"{c:>{widths[c]}}" for c in cols), file=out)
            for r in summary:
                print(pad + "  ".join(f"{format_value(r.get(c, '')):>{widths[c]}}" for c in cols), file=out)
        else:
            for v in summary:
                print(f"{pad}- {format_value(v)}", file=out)
    else:
        print(f"{pad}{format_value(summary)}", file=out)


def _search(args: argparse.Namespace) -> int:
    from tasks.corpus.published import list_corpora, open_corpus  # noqa: PLC0415  (the corpus reader, ~35 ms of every CLI start: only for `funnelrag search`)

    ws_cfg = WorkspaceConfig(home=Path(args.home)) if args.home else WorkspaceConfig()
    ws = Workspace(ws_cfg.home)
    try:
        corpus = open_corpus(ws, name=args.corpus)
    except FileNotFoundError:
        found = list_corpora(ws)
        there = ", ".join(f"{n} (current {v})" for n, v in found.items()) or "none (run `funnelrag build-corpus`)"
        print(f"funnelrag search: no published corpus {args.corpus!r} in {ws.home}; corpora there: {there}. "
              "Choose one with --corpus NAME (and --home DIR).", file=sys.stderr)
        return 2
    index = corpus.cluster_index()
    t0 = time.perf_counter()
    ids, scores = index.search([args.question], k=args.k)
    seconds = time.perf_counter() - t0
    cluster_ids = [int(i) for i in ids[0]]
    members = corpus.members_of(cluster_ids)
    print(f"corpus {args.corpus} version {corpus.version}: top {len(cluster_ids)} clusters for {args.question!r} ({seconds * 1000:.1f} ms)")
    for rank, (cid, score) in enumerate(zip(cluster_ids, scores[0].tolist()), 1):
        titles = [t for _, t, _ in members[cid]]
        shown = ", ".join(titles[:6]) + (f", … (+{len(titles) - 6})" if len(titles) > 6 else "")
        print(f"{rank:>3}. cluster {cid:<6} score {score:7.3f}  [{len(titles)} articles] {shown}")
    if args.passages:
        _print_passages(corpus, args.question, args.passages)
    return 0


def _print_passages(corpus, question: str, n: int, width: int = 300) -> None:
    """The top ``n`` passages by BM25 (flat index) with their title and text (cut to ``width``)."""
    ids, scores = corpus.passage_index().search([question], k=n)
    rows = corpus.passages.filter(pc.is_in(corpus.passages["passage_id"], pa.array(ids[0], pa.string())))
    by_id = {pid: (title, text) for pid, title, text in zip(rows["passage_id"].to_pylist(), rows["title"].to_pylist(),
                                                            rows["text"].to_pylist())}
    print(f"top {len(ids[0])} passages:")
    for rank, (pid, score) in enumerate(zip(ids[0], scores[0].tolist()), 1):
        title, text = by_id[pid]
        text = " ".join(text.split())
        print(f"{rank:>3}. {title} [{pid}] score {score:.3f}\n     {text[:width]}{'…' if len(text) > width else ''}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``funnelrag`` console script."""
    own_command_line = argv is None   # the console script: this process ends when main returns
    argv = list(sys.argv[1:] if argv is None else argv)
    # Process-level defaults belong at the entry point: no telemetry from the ephemeral
    # Prefect server (this machine has no internet), no tokenizer fork warnings.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    wanted = next((a for a in argv if not a.startswith("-")), None)
    if wanted == "compare":  # its own argument parser: funnelrag compare RUN_OR_MODEL ...
        from funnelrag.compare import compare_main  # noqa: PLC0415  (heavy: torch via tasks.evaluate.models, only for `funnelrag compare`)

        return compare_main(argv[argv.index("compare") + 1:])
    if wanted == "schedule":  # its own argument parser: funnelrag schedule DEPLOYMENT --cron ... [--set ...]
        from funnelrag.schedule import schedule_main  # noqa: PLC0415  (heavy: prefect's client, only for `funnelrag schedule`)

        return schedule_main(argv[argv.index("schedule") + 1:])
    if wanted != "search":
        prefect_process_defaults()
    commands = {} if wanted == "search" else _commands(wanted)
    parser = argparse.ArgumentParser(prog="funnelrag", description=__doc__.split("\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging, and a flow's full summary")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, cmd in sorted(commands.items()):
        p = sub.add_parser(name, help=argparse_text(cmd.help), description=cmd.help)
        p.add_argument("--config", type=Path, help="YAML file with the flow's configuration")
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a config value, e.g. clustering.max_tokens=2048 (repeatable)")
        p.add_argument("--home", help=HOME_HELP + "; a --set workspace.home=... wins")
        for flag, override, text in cmd.flags:   # a switch for one --set override
            p.add_argument(flag, dest="overrides", action="append_const", const=override, help=f"{text} (--set {override})")
        p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
        p.add_argument("--json", type=Path, help="also write the summary as JSON to this file")
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="debug logging, and the full summary (not the one-screen digest)")
    sub.add_parser("compare", help="print MLflow runs or registered model versions side by side "
                   "(funnelrag compare RUN_OR_MODEL RUN_OR_MODEL ... [--home DIR] [--diff])", add_help=False)
    sub.add_parser("schedule", help="turn a deployment's schedule on with overrides kept as its parameters "
                   "(funnelrag schedule DEPLOYMENT --cron CRON [--set KEY=VALUE ...] [--off])", add_help=False)
    s = sub.add_parser("search", help="print the top clusters of the current corpus for a question")
    s.add_argument("question")
    s.add_argument("--k", type=int, default=10)
    s.add_argument("--corpus", default="wikispeedia", help="corpus name (store under home/stores/corpus/)")
    s.add_argument("--home", default=None, help=HOME_HELP)
    s.add_argument("--passages", type=int, default=3, help="also print the top N passages with their text (0: none)")
    args = parser.parse_args(argv)

    level = logging.DEBUG if args.verbose else logging.INFO
    # A no-op once prefect is imported (its console handler is on the root logger, at WARNING):
    # our loggers get their level themselves, so their INFO lines (progress) reach the terminal.
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for name in RUN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for noisy in ("httpx", "alembic", "mlflow", "urllib3", "filelock", "numba"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # bm25s sets its logger to DEBUG when imported (later): a filter outlives that.
    logging.getLogger("bm25s").addFilter(lambda record: record.levelno >= logging.WARNING)
    if args.command == "search":
        return _search(args)
    cmd = commands[args.command]

    try:   # config file and input files checked before any Prefect server or MLflow run starts
        try:
            cfg = load_config(cmd.config_model, args.config, args.overrides, home=args.home)
        except ValidationError as exc:
            raise explain_validation_error(exc, cmd.config_model, args.config, args.overrides, args.home) from exc
        if args.print_config:
            print(json.dumps(cfg.model_dump(mode="json"), indent=2))
            return 0
        if cmd.check is not None:
            cmd.check(cfg)
        check_inputs(cfg)
    except (ConfigError, InputFileError, OSError) as exc:
        return user_error(args.command, exc, args.verbose)
    if not os.environ.get("PREFECT_API_URL"):  # the flow starts an ephemeral API: stop it if we are killed
        ensure_reaper()
        start_ephemeral_api(cfg, cmd.imports(cfg) if cmd.imports is not None else ())
    if args.command in NUMBA_WARMUP_COMMANDS:
        NumbaWarmup()
    summary = cmd.run(cfg)
    if own_command_line:
        # The process ends after this run: what the run left on the heap (tables, indexes, models:
        # millions of objects after a demo) is not walked again by the collections of the
        # interpreter's exit (seconds of one core): moved out of the collector's generations, its
        # memory goes back with the process. (Not when called from Python: the caller lives on.)
        gc.freeze()
    print()
    if cmd.screen is not None and not args.verbose:
        print(cmd.screen(cfg, summary))
    else:
        print_summary(summary)
    if args.json:
        write_json(args.json, summary)
    return cmd.exit_status(summary) if cmd.exit_status is not None else 0


def user_error(command: str, exc: BaseException, verbose: bool) -> int:
    """Report an error the user can fix: ``funnelrag <command>: <message>`` on stderr (the
    message names its subject: file, key, value), the traceback above it only when ``verbose``.
    Returns the exit code, 2."""
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    print(f"funnelrag {command}: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
