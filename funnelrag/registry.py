"""Model registry on MLflow: log a trained model directory as a model version, gate promotion.

Generic over models (pre-ranker, FiD reader, DR-RAG classifier, R²-Former): a model is a
directory of files. :func:`register_model` logs it as an MLflow 3 *logged model* of the active
run (with ``registry_config.json``: its config, data version and metrics, which are also linked
to the logged model), creates a version of the registered model ``name`` from it
(``MlflowClient.create_model_version``, no ``pyfunc`` flavour needed), gives it the
alias ``challenger`` and promotes it to ``champion`` only on evidence: the challenger's paired gain
over the champion on the same fixed dev questions has a 95% percentile-bootstrap lower bound above 0
and at least the configured margin (:func:`clears_margin`, :mod:`funnelrag.paired`); a tie never
promotes. The decision, the interval and n are logged to the run, stored as the version's ``gate``
tag and written into the version's description.

Load with :func:`download_model` from ``models:/<name>@champion``, ``models:/<name>@challenger``
or ``models:/<name>/<version>``.

Integrity: every version records the sha256 of each file of its model directory (version tag
``files_sha256``, canonical JSON ``{relative path: sha256}``); :func:`download_model` re-hashes
the downloaded files and raises :class:`ModelIntegrityError` naming the model, the version and
the file when one is missing or differs (an artifact store damaged or altered after
registration). Versions registered before digests were recorded load with a warning.
"""
from __future__ import annotations

import hashlib
import json
import logging
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from data_contracts.base import sha256_file
from funnelrag.config import config_hash, to_jsonable
from funnelrag.paired import N_BOOTSTRAP, SEED, PairedDifference, pair_by_question, paired_difference

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
MODEL_ARTIFACT = "model"
METRIC_TAG = "metric."
EVAL_SET_TAG = "eval_set_digest"
FILES_TAG = "files_sha256"
# Files MLflow writes into the model artifact at registration, not part of the trained model.
_REGISTRY_FILES = frozenset({"registry_config.json"})


class ModelIntegrityError(Exception):
    """A registered model's downloaded files do not match the digests recorded at registration.

    Deliberately not a ``ValueError``/``OSError``: code that skips a *missing* model must never
    skip a *damaged* one.
    """


def model_file_digests(model_dir: Path) -> dict[str, str]:
    """``{relative posix path: sha256 hex}`` of every file below ``model_dir``, sorted by path.

    Raises
    ------
    FileNotFoundError
        ``model_dir`` is not a directory.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    return {p.relative_to(model_dir).as_posix(): sha256_file(p)
            for p in sorted(model_dir.rglob("*")) if p.is_file()}


def verify_model_files(model_dir: Path, expected: Mapping[str, str], *, name: str, version: str) -> None:
    """Check that every file recorded at registration is in ``model_dir`` with its sha256.

    Parameters
    ----------
    model_dir : the downloaded model directory.
    expected : ``{relative path: sha256}`` recorded at registration (:func:`model_file_digests`).
    name, version : the registered model and version, for the error message.

    Raises
    ------
    ModelIntegrityError
        A recorded file is missing or its sha256 differs (names model, version and file), or a
        file appeared that was not there at registration.
    """
    actual = model_file_digests(model_dir)
    for rel, digest in sorted(expected.items()):
        if rel not in actual:
            raise ModelIntegrityError(f"registered model {name} v{version}: file {rel} is missing from "
                                      f"{model_dir} (recorded at registration)")
        if actual[rel] != digest:
            raise ModelIntegrityError(f"registered model {name} v{version}: file {rel} has sha256 "
                                      f"{actual[rel][:16]}…, recorded {digest[:16]}… at registration "
                                      "(the artifact store copy is damaged or was altered)")
    extra = sorted(set(actual) - set(expected) - _REGISTRY_FILES)
    if extra:
        raise ModelIntegrityError(f"registered model {name} v{version}: files not present at registration: "
                                  f"{', '.join(extra[:5])}")


@dataclass(frozen=True)
class GateDecision:
    """Outcome of the champion/challenger gate.

    name, version : registered model and the new (challenger) version.
    metric : gate metric name; higher_is_better : its direction.
    challenger_value : the new version's value.
    champion_version, champion_value : the champion before the gate (None if there was none).
    promoted : the new version is now the champion.
    reason : ``no_champion`` | ``better`` (the gain's lower 95% bound clears the margin) |
        ``no_measurable_gain`` (it does not: a tie, or an interval reaching below the margin) |
        ``worse`` (the whole interval is below 0).
    eval_set : sha256 of the held-out question set both values were measured on (None if not given).
    gain, gain_low, gain_high : the challenger's gain over the champion (in the better direction)
        and its 95% paired-bootstrap interval; without per-question results the gain of the means
        (``gain_low == gain_high == gain``). None without a champion.
    n : questions paired (None without per-question results).
    margin : the configured margin the lower bound had to reach.
    """

    name: str
    version: str
    metric: str
    higher_is_better: bool
    challenger_value: float
    champion_version: str | None
    champion_value: float | None
    promoted: bool
    reason: str
    eval_set: str | None = None
    gain: float | None = None
    gain_low: float | None = None
    gain_high: float | None = None
    n: int | None = None
    margin: float = 0.0

    def description(self) -> str:
        """One paragraph for the registry version's description: the decision and its evidence."""
        if self.champion_version is None:
            return f"Champion gate: promoted (no champion before; {self.metric} = {self.challenger_value:.4f})."
        evidence = (f"paired gain in {self.metric} over champion v{self.champion_version}: {self.gain:+.4f} "
                    f"[{self.gain_low:+.4f}, {self.gain_high:+.4f}] (95% percentile bootstrap over the questions, "
                    f"n={self.n:,})" if self.n is not None else
                    f"gain in {self.metric} over champion v{self.champion_version}: {self.gain:+.4f} "
                    "(means only: no per-question results)")
        verdict = {"better": f"promoted: the lower bound clears the margin {self.margin:g}",
                   "worse": "not promoted: worse than the champion",
                   "no_measurable_gain": f"not promoted: no measurable gain (the lower bound must be > 0 and "
                                         f">= the margin {self.margin:g}; a tie never promotes)"}[self.reason]
        return (f"Champion gate: {verdict}. {self.metric}: challenger {self.challenger_value:.4f}, "
                f"champion {self.champion_value:.4f}; {evidence}.")


def clears_margin(gain_low: float, margin: float = 0.0) -> bool:
    """The promotion rule on the lower 95% bound of the challenger's paired gain: above 0 and at
    least ``margin`` (a tie, whose interval is [0, 0], never promotes).

    Raises
    ------
    ValueError
        ``margin`` is negative (a gate promotes on evidence of a gain, not of non-inferiority).
    """
    if margin < 0:
        raise ValueError(f"gate margin must be >= 0, got {margin}")
    return gain_low > 0.0 and gain_low >= margin


def gate_gain(challenger_scores: Mapping[str, float], champion_scores: Mapping[str, float],
              higher_is_better: bool = True, n_bootstrap: int = N_BOOTSTRAP, seed: int = SEED) -> PairedDifference:
    """The challenger's paired gain over the champion, question by question (``diff`` > 0: the
    challenger is better, whatever the metric's direction), with its 95% bootstrap interval.

    Parameters
    ----------
    challenger_scores, champion_scores : ``{question id: value}`` on the same fixed dev questions.

    Raises
    ------
    ValueError
        The question sets differ (names the counts and examples) or are empty.
    """
    _, chall, champ = pair_by_question(challenger_scores, champion_scores, "champion gate (challenger vs champion)")
    return paired_difference(champ, chall, n_bootstrap, seed) if higher_is_better else \
        paired_difference(chall, champ, n_bootstrap, seed)


def question_set_digest(question_ids) -> str:
    """sha256 of the sorted question ids joined by newlines: the identity of a fixed held-out set."""
    return hashlib.sha256("\n".join(sorted(question_ids)).encode()).hexdigest()


def _client():
    from mlflow import MlflowClient  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    return MlflowClient()


def champion_version(name: str, alias: str = CHAMPION):
    """The ``ModelVersion`` holding ``alias`` of registered model ``name``, or None (no model or
    no such alias)."""
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    client = _client()
    try:
        model = client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    version = model.aliases.get(alias)
    return None if version is None else client.get_model_version(name, str(version))


def missing_alias(ref: str) -> str | None:
    """Why a ``models:/<name>@<alias>`` reference names no version yet (``None`` if it names one,
    or ``ref`` is not an alias reference): on a fresh home there is no champion before the first
    distillation, which is a normal state, not a failure.
    """
    body = ref[len("models:/"):] if ref.startswith("models:/") else ""
    name, sep, alias = body.partition("@")
    if not (sep and name and alias) or champion_version(name, alias) is not None:
        return None
    return (f"registered model {name} has no version with alias {alias!r} yet "
            "(no distillation has registered one in this home)")


def find_version(name: str, tag: str, value: str):
    """The newest version of ``name`` whose tag ``tag`` equals ``value`` (e.g. a model digest,
    to avoid registering the same trained model twice), or None."""
    client = _client()
    versions = [mv for mv in client.search_model_versions(f"name='{name}'") if mv.tags.get(tag) == value]
    if not versions:
        return None
    newest = max(versions, key=lambda mv: int(mv.version))
    return client.get_model_version(name, str(newest.version))


def version_metric(mv, metric: str) -> float | None:
    """The gate metric stored on a model version (tag ``metric.<name>``), or None."""
    raw = mv.tags.get(METRIC_TAG + metric)
    return None if raw is None else float(raw)


def register_model(model_dir: Path, name: str, *, config: Any, data_version: str, metrics: Mapping[str, float],
                   gate_metric: str, higher_is_better: bool = True, champion_value: float | None = None,
                   tags: Mapping[str, str] | None = None, eval_set: str | None = None,
                   challenger_scores: Mapping[str, float] | None = None,
                   champion_scores: Mapping[str, float] | None = None, margin: float = 0.0,
                   n_bootstrap: int = N_BOOTSTRAP, seed: int = SEED) -> GateDecision:
    """Log ``model_dir`` to the active MLflow run, register it as a version of ``name`` and gate it.

    Parameters
    ----------
    model_dir : directory of the trained model (weights, tokenizer, its own config file).
    name : registered model name (stable, e.g. ``funnelrag-preranker``).
    config : training config (dataclass / pydantic / mapping), logged as ``model/registry_config.json``.
    data_version : sha256 of the corpus manifest the model was trained on.
    metrics : evaluation metrics; all are stored as version tags, ``gate_metric`` must be one.
    gate_metric, higher_is_better : the metric the gate compares and its direction.
    champion_value : the current champion's value of ``gate_metric`` measured on the same
        evaluation data now; default: the value recorded when the champion was registered.
    tags : extra version tags.
    eval_set : digest of the fixed held-out question set ``metrics`` were measured on (e.g.
        :func:`question_set_digest`); stored as the version tag
        ``eval_set_digest`` and in the decision. When given, a champion value recorded on a
        different set is never compared: ``champion_value`` (re-measured on this set) is required.
    challenger_scores, champion_scores : ``{question id: value}`` of ``gate_metric`` for the new
        model and the current champion, measured now on the same fixed dev questions: the gate
        then decides on the paired gain's 95% bootstrap interval (:func:`gate_gain`). Without
        them it compares the two means (no interval: ``n`` is None), by the same rule.
    margin : the lower bound of the gain must be > 0 and >= ``margin`` (:func:`clears_margin`).
    n_bootstrap, seed : the bootstrap's resamples and seed.

    Returns
    -------
    GateDecision
        Also logged to the run as metrics ``gate.challenger``, ``gate.champion``, ``gate.promoted``,
        ``gate.gain``, ``gate.gain_low``, ``gate.gain_high``, ``gate.n``; its
        :meth:`GateDecision.description` is the version's description.

    Raises
    ------
    RuntimeError
        No active MLflow run.
    KeyError
        ``gate_metric`` is not in ``metrics``.
    ValueError
        ``eval_set`` differs from the champion's and no ``champion_value`` / ``champion_scores``
        was given; the two score maps hold different questions; ``margin`` < 0.
    FileNotFoundError
        ``model_dir`` is not a directory.
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)
    from mlflow.exceptions import MlflowException  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("register_model needs an active MLflow run (funnelrag.tracking.flow_run)")
    if gate_metric not in metrics:
        raise KeyError(f"gate metric {gate_metric!r} not among the metrics {sorted(metrics)}")
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist")
    champion = champion_version(name)
    if margin < 0:
        raise ValueError(f"gate margin must be >= 0, got {margin}")
    if (champion_scores is None) != (challenger_scores is None):
        raise ValueError("give both challenger_scores and champion_scores (the same dev questions) or neither")
    if champion_scores is not None:
        champion_value = sum(champion_scores.values()) / max(len(champion_scores), 1)
    if (champion is not None and eval_set is not None and champion_value is None
            and champion.tags.get(EVAL_SET_TAG) != eval_set):
        raise ValueError(f"{name} champion v{champion.version} was measured on question set "
                         f"{champion.tags.get(EVAL_SET_TAG)}, not {eval_set}: re-measure it (champion_value)")
    client = _client()
    digests = model_file_digests(model_dir)
    cfg_json = to_jsonable(config)
    # An MLflow 3 logged model (the run's "Logged models" view) holding the model directory and
    # the registry config; its metrics are linked to it; the version's source is the logged model.
    logged = mlflow.initialize_logged_model(name=name, source_run_id=run.info.run_id,
                                            tags={"data_version": data_version, **dict(tags or {})})
    client.log_model_artifacts(logged.model_id, str(model_dir))
    with tempfile.TemporaryDirectory() as tmp:
        reg_cfg = Path(tmp) / "registry_config.json"
        reg_cfg.write_text(json.dumps({"config": cfg_json, "data_version": data_version, "metrics": dict(metrics)},
                                      indent=2, sort_keys=True))
        client.log_model_artifact(logged.model_id, str(reg_cfg))
    mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, model_id=logged.model_id)
    mlflow.finalize_logged_model(logged.model_id, "READY")
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version_tags = {**({EVAL_SET_TAG: eval_set} if eval_set else {}), "data_version": data_version,
                    "config_sha256": config_hash(cfg_json),
                    FILES_TAG: json.dumps(digests, sort_keys=True, separators=(",", ":")),
                    **{METRIC_TAG + k: repr(float(v)) for k, v in metrics.items()}, **dict(tags or {})}
    mv = client.create_model_version(name, source=f"models:/{logged.model_id}", run_id=run.info.run_id,
                                     tags=version_tags, model_id=logged.model_id)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    value = float(metrics[gate_metric])
    if champion is None:
        decision = GateDecision(name, str(mv.version), gate_metric, higher_is_better, value, None, None, True,
                                "no_champion", eval_set, margin=margin)
    else:
        best = champion_value if champion_value is not None else version_metric(champion, gate_metric)
        if best is None:
            raise KeyError(f"champion {name} v{champion.version} has no recorded {gate_metric!r}; pass champion_value")
        if challenger_scores is not None:
            g = gate_gain(challenger_scores, champion_scores, higher_is_better, n_bootstrap, seed)
            gain, low, high, n = g.diff, g.low, g.high, g.n
        else:
            gain = (value - best) if higher_is_better else (best - value)
            low = high = gain
            n = None
        ok = clears_margin(low, margin)
        reason = "better" if ok else ("worse" if high < 0 else "no_measurable_gain")
        decision = GateDecision(name, str(mv.version), gate_metric, higher_is_better, value, str(champion.version),
                                float(best), ok, reason, eval_set, gain, low, high, n, margin)
    if decision.promoted:
        client.set_registered_model_alias(name, CHAMPION, mv.version)
    client.set_model_version_tag(name, mv.version, "gate", json.dumps(asdict(decision), sort_keys=True))
    client.update_model_version(name, mv.version, description=decision.description())
    evidence = {"gate.champion": decision.champion_value, "gate.gain": decision.gain, "gate.gain_low": decision.gain_low,
                "gate.gain_high": decision.gain_high, "gate.n": decision.n}
    mlflow.log_metrics({"gate.challenger": value, "gate.promoted": float(decision.promoted),
                        **{k: float(v) for k, v in evidence.items() if v is not None}})
    mlflow.set_tags({"registry.name": name, "registry.version": str(mv.version), "registry.gate": decision.reason})
    log.info("registry %s v%s: %s", name, mv.version, decision.description())
    return decision


def logged_model_id(mv) -> str | None:
    """The logged model behind a model version (``None`` for versions registered from a run
    artifact). The SQLite registry does not keep ``model_id`` on the version; its source
    ``models:/<model id>`` names it."""
    if getattr(mv, "model_id", None):
        return mv.model_id
    source = getattr(mv, "source", "") or ""
    return source[len("models:/"):] if source.startswith("models:/m-") else None


def link_model_versions(versions: Sequence[tuple[str, str]], metrics: Mapping[str, float] | None = None) -> list[str]:
    """Record on the active MLflow run that it used these registered model versions: tags
    ``model_version.<name> = <version>`` (searchable), and ``metrics`` logged against each
    version's logged model (MLflow 3: the model's page then lists this run's figures beside its
    training metrics). Versions registered from a run artifact get the tag only.

    Returns
    -------
    list of str
        The logged model ids the metrics were linked to.

    Raises
    ------
    mlflow.exceptions.MlflowException
        No such model version.
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when tracking)

    client, linked = _client(), []
    for name, version in versions:
        mv = client.get_model_version(name, str(version))
        mlflow.set_tag(f"model_version.{name}", str(version))
        model_id = logged_model_id(mv)
        if model_id:
            linked.append(model_id)
            clean = {k: float(v) for k, v in (metrics or {}).items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
            if clean:
                mlflow.log_metrics(clean, model_id=model_id)
    return linked


def model_uri(name: str, ref: str | int = CHAMPION) -> str:
    """``models:/<name>@<alias>`` for an alias, ``models:/<name>/<version>`` for a version number."""
    ref = str(ref)
    return f"models:/{name}/{ref}" if ref.isdigit() else f"models:/{name}@{ref}"


def is_registry_ref(ref: str) -> bool:
    """``ref`` names a registered model (``models:/...``)."""
    return ref.startswith("models:/")


def parse_registry_ref(ref: str) -> tuple[str, str | None, str | None]:
    """``models:/name@alias`` → ``(name, alias, None)``; ``models:/name/3`` → ``(name, None, "3")``.

    Raises
    ------
    ValueError
        Not of either form (names the reference).
    """
    if not is_registry_ref(ref):
        raise ValueError(f"{ref!r} is not a models:/ reference")
    body = ref[len("models:/"):]
    if "@" in body:
        name, alias = body.split("@", 1)
        if name and alias:
            return name, alias, None
    else:
        name, _, version = body.rpartition("/")
        if name and version.isdigit():
            return name, None, version
    raise ValueError(f"{ref!r}: expected models:/<name>@<alias> or models:/<name>/<version>")


def resolve_version(uri: str):
    """The ``ModelVersion`` a ``models:/<name>@<alias>`` or ``models:/<name>/<version>`` URI names.

    Raises
    ------
    ValueError
        ``uri`` is not of either form.
    mlflow.exceptions.MlflowException
        No such model, version or alias.
    """
    name, alias, version = parse_registry_ref(uri)
    if alias is not None:
        return _client().get_model_version_by_alias(name, alias)
    return _client().get_model_version(name, version)


def download_model(uri: str, dst: Path, *, version=None) -> Path:
    """Download the model directory of ``uri`` (``models:/name@champion``, ``models:/name/3``)
    into ``dst`` and verify its files against the digests recorded at registration; returns the
    local directory. ``version``: the ``ModelVersion`` the caller already resolved ``uri`` to (one
    registry query less); the files are those of that version either way.

    Raises
    ------
    mlflow.exceptions.MlflowException
        No such model, version or alias.
    ModelIntegrityError
        A downloaded file is missing or differs from its recorded sha256 (names model, version, file).
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a model is loaded)

    mv = version if version is not None else resolve_version(uri)
    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    # Download the resolved version, not the alias: an alias moved meanwhile cannot mix versions.
    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=f"models:/{mv.name}/{mv.version}",
                                                     dst_path=str(dst)))
    recorded = mv.tags.get(FILES_TAG)
    if recorded is None:
        log.warning("registered model %s v%s has no recorded file digests (registered before they were "
                    "kept): loaded unverified", mv.name, mv.version)
    else:
        verify_model_files(local, json.loads(recorded), name=mv.name, version=str(mv.version))
    return local


def find_model_dir(root: Path, marker: str) -> Path:
    """The directory holding ``marker`` (e.g. ``reader_config.json``): ``root``, ``root/model`` or
    the first one below ``root`` (a downloaded registry artifact nests the model directory).

    Raises
    ------
    FileNotFoundError
        No ``marker`` anywhere under ``root``.
    """
    for cand in (root, root / "model", *sorted(p.parent for p in root.rglob(marker))):
        if (cand / marker).exists():
            return cand
    raise FileNotFoundError(f"{root}: no {marker} found (not a saved model of the expected kind)")
