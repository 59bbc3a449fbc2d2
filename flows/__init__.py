"""Prefect flows: thin wiring of the stages in tasks/.

Importing this package gives our loggers (:data:`RUN_LOGGERS`) level INFO where nothing set one,
so that a flow run started by a worker (no CLI: Prefect's root logger stays at WARNING) keeps its
stage and progress lines; ``PREFECT_LOGGING_EXTRA_LOGGERS`` (the CLI sets it, and so does the work
pool's environment in ``prefect.yaml``) sends them to the run logs. A level set before (the CLI's
``--verbose``, a test) is kept.
"""
import logging

RUN_LOGGERS = ("funnelrag", "flows", "tasks", "models")
"""Our module loggers: their lines (progress included) also go to the Prefect run logs (the UI)."""

for _name in RUN_LOGGERS:
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.INFO)
