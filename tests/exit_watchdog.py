"""A test run that would hang after its last test fails instead, with every thread's traceback.

Something the tests leave behind that the interpreter waits for at exit (a non-daemon thread, a
``multiprocessing`` queue whose feeder thread is blocked, a child process it joins) makes
``pytest`` print its summary and then never end: CI sees only its own time limit. After pytest
is done, this plugin arms ``faulthandler``: if the process is still alive ``FUNNELRAG_TEST_EXIT_LIMIT_S``
seconds later (default 180), every thread's traceback goes to stderr and the process exits with 1.
Loaded by ``tests/conftest.py``.
"""
from __future__ import annotations

import faulthandler
import os
import sys

import pytest


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config) -> None:
    limit = float(os.environ.get("FUNNELRAG_TEST_EXIT_LIMIT_S", "180"))
    if limit > 0:
        sys.__stderr__.write(f"(exit watchdog: this process must end within {limit:g} s)\n")
        sys.__stderr__.flush()
        faulthandler.dump_traceback_later(limit, exit=True, file=sys.__stderr__)
