"""Model registry on MLflow: log a trained model directory as a model version, gate promotion.

Generic over models (pre-ranker, FiD reader, DR-RAG classifier, R²-Former): a model is a
directory of files. :func:`register_model` logs it as artifacts of the active MLflow run
(``model/``) with its config and data version, creates a version of the registered model
``name`` (``MlflowClient.create_model_version``, no ``pyfunc`` flavour needed), gives it the
alias ``challenger`` and promotes it to ``champion`` only if its gate metric is not worse than
the champion's. The gate's numbers are logged to the run and stored as version tags.

Load with :func:`download_model` from ``models:/<name>@champion``, ``models:/<name>@challenger``
or ``models:/<name>/<version>``.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping

from funnelrag.config import config_hash, to_jsonable

log = logging.getLogger(__name__)

CHAMPION = "champion"
CHALLENGER = "challenger"
MODEL_ARTIFACT = "model"
METRIC_TAG = "metric."
EVAL_SET_TAG = "eval_set_digest"


@dataclass(frozen=True)
class GateDecision:
    """Outcome of the champion/challenger gate.

    name, version : registered model and the new (challenger) version.
    metric : gate metric name; higher_is_better : its direction.
    challenger_value : the new version's value.
    champion_version, champion_value : the champion before the gate (None if there was none).
    promoted : the new version is now the champion.
    reason : ``no_champion`` | ``not_worse`` | ``worse``.
    eval_set : sha256 of the held-out question set both values were measured on (None if not given).
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


def is_not_worse(challenger: float, champion: float, higher_is_better: bool = True) -> bool:
    """The promotion rule: the challenger's metric is at least as good as the champion's."""
    return challenger >= champion if higher_is_better else challenger <= champion


def register_model(model_dir: Path, name: str, *, config: Any, data_version: str, metrics: Mapping[str, float],
                   gate_metric: str, higher_is_better: bool = True, champion_value: float | None = None,
                   tags: Mapping[str, str] | None = None, eval_set: str | None = None) -> GateDecision:
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

    Returns
    -------
    GateDecision
        Also logged to the run as metrics ``gate.challenger``, ``gate.champion``, ``gate.promoted``.

    Raises
    ------
    RuntimeError
        No active MLflow run.
    KeyError
        ``gate_metric`` is not in ``metrics``.
    ValueError
        ``eval_set`` differs from the champion's and no ``champion_value`` was given.
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
    if (champion is not None and eval_set is not None and champion_value is None
            and champion.tags.get(EVAL_SET_TAG) != eval_set):
        raise ValueError(f"{name} champion v{champion.version} was measured on question set "
                         f"{champion.tags.get(EVAL_SET_TAG)}, not {eval_set}: re-measure it (champion_value)")
    client = _client()
    mlflow.log_artifacts(str(model_dir), artifact_path=MODEL_ARTIFACT)
    cfg_json = to_jsonable(config)
    mlflow.log_dict({"config": cfg_json, "data_version": data_version, "metrics": dict(metrics)},
                    f"{MODEL_ARTIFACT}/registry_config.json")
    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    version_tags = {**({EVAL_SET_TAG: eval_set} if eval_set else {}),"data_version": data_version, "config_sha256": config_hash(cfg_json),
                    **{METRIC_TAG + k: repr(float(v)) for k, v in metrics.items()}, **dict(tags or {})}
    mv = client.create_model_version(name, source=f"runs:/{run.info.run_id}/{MODEL_ARTIFACT}",
                                     run_id=run.info.run_id, tags=version_tags)
    client.set_registered_model_alias(name, CHALLENGER, mv.version)
    value = float(metrics[gate_metric])
    if champion is None:
        decision = GateDecision(name, str(mv.version), gate_metric, higher_is_better, value, None, None, True,
                                "no_champion", eval_set)
    else:
        best = champion_value if champion_value is not None else version_metric(champion, gate_metric)
        if best is None:
            raise KeyError(f"champion {name} v{champion.version} has no recorded {gate_metric!r}; pass champion_value")
        ok = is_not_worse(value, best, higher_is_better)
        decision = GateDecision(name, str(mv.version), gate_metric, higher_is_better, value, str(champion.version),
                                float(best), ok, "not_worse" if ok else "worse", eval_set)
    if decision.promoted:
        client.set_registered_model_alias(name, CHAMPION, mv.version)
    client.set_model_version_tag(name, mv.version, "gate", json.dumps(asdict(decision), sort_keys=True))
    mlflow.log_metrics({"gate.challenger": value, "gate.promoted": float(decision.promoted),
                        **({"gate.champion": decision.champion_value} if decision.champion_value is not None else {})})
    mlflow.set_tags({"registry.name": name, "registry.version": str(mv.version), "registry.gate": decision.reason})
    log.info("registry %s v%s: %s=%.4f vs champion %s (%s) -> %s", name, mv.version, gate_metric, value,
             decision.champion_version, decision.champion_value, decision.reason)
    return decision


def model_uri(name: str, ref: str | int = CHAMPION) -> str:
    """``models:/<name>@<alias>`` for an alias, ``models:/<name>/<version>`` for a version number."""
    ref = str(ref)
    return f"models:/{name}/{ref}" if ref.isdigit() else f"models:/{name}@{ref}"


def download_model(uri: str, dst: Path) -> Path:
    """Download the model directory of ``uri`` (``models:/name@champion``, ``models:/name/3``)
    into ``dst``; returns the local directory.

    Raises
    ------
    mlflow.exceptions.MlflowException
        No such model, version or alias.
    """
    import mlflow  # noqa: PLC0415  (heavy: mlflow, only when a run is logged or read)

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst)))


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
