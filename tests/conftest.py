"""Shared fixtures: one Prefect test harness per session, real data mirror, temp workspaces."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

# A throwaway PREFECT_HOME before prefect is imported anywhere (its settings read it once).
_PREFECT_HOME = tempfile.mkdtemp(prefix="funnelrag-prefect-home-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from funnelrag.datasets import default_mirror  # noqa: E402

pytest_plugins = ["tests.exit_watchdog"]   # a run that hangs after its last test fails, with tracebacks

# Property tests draw the same examples on every run (CI cannot fail on an example no local run
# saw); HYPOTHESIS_PROFILE=explore draws fresh random examples, for hunting new counterexamples.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def prefect_harness():
    """One ephemeral Prefect API for the whole session (it takes 6–14 s to start)."""
    from prefect.testing.utilities import prefect_test_harness  # noqa: PLC0415

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def data_mirror() -> Path:
    """The real data sets (../shared/data); tests needing them skip only if it is absent."""
    mirror = default_mirror(Path(__file__).parent)
    if mirror is None:
        pytest.skip("real data mirror ../shared/data not found")
    return mirror


@pytest.fixture
def workspace_home(tmp_path) -> Path:
    """A fresh funnelrag home (artifact store, cache, MLflow SQLite) for one test."""
    home = tmp_path / "home"
    home.mkdir()
    return home


@pytest.fixture
def one_torch_thread():
    """2 shared cores: intra-op threads only add contention for tiny models. Restores the count."""
    import torch  # noqa: PLC0415

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Fixtures whose setup alone takes seconds (a server start): every test that uses one, directly or
# through another fixture, is marked slow, so ``-m "not slow"`` never starts them.
SLOW_FIXTURES = {"prefect_harness"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
