"""``funnelrag schedule DEPLOYMENT``: turn a deployment's schedule on, with its overrides kept.

A deployment's schedule in ``prefect.yaml`` runs it with the deployment's parameters (a config
file, the home, overrides). The full-dump nightlies ship with their schedules off, and the mirror a
site uses is an override that the deployment cannot know. This command gives the deployment one
schedule of ours (slug :data:`SLUG`) whose runs carry the deployment's parameters plus the
``--set`` overrides (and ``--config``), activates it and pauses the deployment's other schedules,
so exactly one schedule runs it. Run it again to change the time or the overrides; ``--off``
pauses it. The parameters are resolved against the flow's configuration model first, so a
misspelt key fails now, not at 01:00. Example::

    funnelrag schedule nightly-corpus-build-enwiki-box --cron "0 1 * * *" \\
        --set source.mirror=https://dumps.example.org --set runner.workers=32

Prefect keeps the schedule in its database: ``prefect deploy --all`` replaces a deployment's
schedules with those of ``prefect.yaml``, so run this command again after a re-deploy.
"""
from __future__ import annotations

import argparse
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Sequence

from funnelrag.config import parse_overrides, resolve_flow_config

SLUG = "funnelrag-schedule"
"""The slug of the schedule this command manages on a deployment."""


class ScheduleError(ValueError):
    """A deployment that does not exist, or parameters its flow cannot take (the message says which)."""


@dataclass(frozen=True)
class ScheduleResult:
    """What :func:`set_schedule` did."""

    deployment: str           # flow/deployment
    cron: str
    timezone: str
    active: bool
    parameters: dict[str, Any]
    paused: list[str]         # the deployment's other schedules it paused (their cron strings)
    created: bool             # a new schedule (False: ours was updated)


def _find_deployment(client, name: str):
    """The deployment ``flow/deployment`` or, for a bare ``deployment``, the one of that name."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName  # noqa: PLC0415  (heavy: prefect)
    from prefect.exceptions import ObjectNotFound  # noqa: PLC0415  (heavy: prefect)

    if "/" in name:
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise ScheduleError(f"no deployment {name!r} on the Prefect API (run `prefect deploy --all` first)") from None
    found = client.read_deployments(deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[name])))
    if len(found) != 1:
        raise ScheduleError(f"{len(found)} deployments are named {name!r}: give it as FLOW/DEPLOYMENT"
                            if found else f"no deployment {name!r} on the Prefect API (run `prefect deploy --all` first)")
    return found[0]


def check_parameters(entrypoint: str, parameters: dict[str, Any]) -> None:
    """Resolve ``parameters`` (``config_file``, ``overrides``, ``home``) against the configuration
    model of the flow at ``entrypoint`` (``path/to/file.py:function``, relative to the working
    directory, as a worker loads it).

    Raises
    ------
    ScheduleError
        The flow cannot be loaded, or the parameters do not resolve (unknown key, wrong type,
        missing config file), naming the reason.
    """
    from prefect.flows import load_flow_from_entrypoint  # noqa: PLC0415  (heavy: prefect, and the flow's module)

    try:
        fn = load_flow_from_entrypoint(entrypoint).fn
    except Exception as exc:  # noqa: BLE001  (any import failure: reported with the entrypoint)
        raise ScheduleError(f"cannot load the flow {entrypoint!r} (run from the repository checkout): {exc}") from exc
    first = next(iter(inspect.signature(fn).parameters))
    model = inspect.get_annotations(fn, eval_str=True)[first].__args__[0]
    try:
        resolve_flow_config(model, None, parameters.get("config_file"), parameters.get("overrides"),
                            parameters.get("home"))
    except Exception as exc:  # noqa: BLE001  (pydantic, YAML and file errors alike)
        raise ScheduleError(f"the schedule's parameters do not resolve for {entrypoint}: {exc}") from exc


def set_schedule(name: str, cron: str, timezone: str = "UTC", overrides: Sequence[str] = (),
                 config_file: str | None = None, active: bool = True, client=None) -> ScheduleResult:
    """Create or update the deployment's schedule :data:`SLUG` with the deployment's parameters
    plus ``overrides`` (appended to its own) and ``config_file`` (replacing its own), and pause
    its other schedules when ``active``.

    Parameters
    ----------
    name : ``flow/deployment`` or a deployment name that is unique on the API.
    cron : a cron expression (5 fields), read in ``timezone``.
    overrides : dotted ``key=value`` settings (as ``--set``).
    config_file : a config file replacing the deployment's (None: keep it).
    active : False pauses the schedule (``--off``).
    client : a sync Prefect client (default: one for the configured API).

    Raises
    ------
    ScheduleError
        No such deployment, or parameters its flow cannot take (:func:`check_parameters`).
    """
    from prefect.client.orchestration import get_client  # noqa: PLC0415  (heavy: prefect)
    from prefect.client.schemas.schedules import CronSchedule  # noqa: PLC0415  (heavy: prefect)

    if client is None:
        with get_client(sync_client=True) as own:
            return set_schedule(name, cron, timezone, overrides, config_file, active, own)
    parse_overrides(list(overrides))   # a malformed KEY=VALUE fails before the API is asked
    dep = _find_deployment(client, name)
    params = dict(dep.parameters or {})
    params["overrides"] = [*(params.get("overrides") or []), *overrides]
    if config_file is not None:
        params["config_file"] = config_file
    check_parameters(dep.entrypoint, params)
    schedule = CronSchedule(cron=cron, timezone=timezone)
    ours = next((s for s in dep.schedules if s.slug == SLUG), None)
    if ours is None:
        client.create_deployment_schedules(dep.id, [(schedule, active)], parameters=params, slug=SLUG)
    else:
        client.update_deployment_schedule(dep.id, ours.id, active=active, schedule=schedule, parameters=params)
    paused = []
    if active:
        for other in dep.schedules:
            if other.slug != SLUG and other.active:
                client.update_deployment_schedule(dep.id, other.id, active=False)
                paused.append(getattr(other.schedule, "cron", str(other.schedule)))
    flow = client.read_flow(dep.flow_id).name
    return ScheduleResult(f"{flow}/{dep.name}", cron, timezone, active, params, paused, ours is None)


def schedule_main(argv: Sequence[str]) -> int:
    """``funnelrag schedule`` (module docstring). Exit 0, or 2 with one line naming the problem."""
    p = argparse.ArgumentParser(prog="funnelrag schedule", description=__doc__.split("\n")[0])
    p.add_argument("deployment", help="FLOW/DEPLOYMENT, or a deployment name unique on the API")
    p.add_argument("--cron", required=True, help='cron expression, e.g. "0 1 * * *" (01:00 every day)')
    p.add_argument("--timezone", default="UTC", help="time zone of the cron expression (default UTC)")
    p.add_argument("--config", default=None, help="config file replacing the deployment's (a path the worker sees)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override kept with the schedule, e.g. source.mirror=https://... (repeatable)")
    p.add_argument("--off", action="store_true", help="pause this schedule instead")
    args = p.parse_args(list(argv))
    try:
        done = set_schedule(args.deployment, args.cron, args.timezone, args.overrides, args.config, not args.off)
    except (ScheduleError, ValueError) as exc:
        print(f"funnelrag schedule: {exc}", file=sys.stderr)
        return 2
    state = "on" if done.active else "paused"
    print(f"{done.deployment}: schedule {SLUG} {'created' if done.created else 'updated'}, {state}: "
          f"{done.cron} ({done.timezone})")
    print(f"  parameters: {done.parameters}")
    if done.paused:
        print(f"  paused the deployment's other schedules: {', '.join(done.paused)}")
    return 0
