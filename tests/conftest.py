"""Session-wide test settings shared by every area.

Area-specific fixtures for real components live in tests/support/fixtures_*.py; the fixtures of shared
components (etcd, Prefect, Prometheus, the fake Kubernetes API) are registered below, their helpers
are imported by the tests that need them.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytest_plugins = [
    "tests.support.fixtures_etcd",
    "tests.support.fixtures_prefect",
    "tests.support.fixtures_prometheus",
    "tests.support.k8s_fake_server",
]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"

# Prefect must never touch a user's ~/.prefect or phone home from tests.
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# Each xdist worker its own (they inherit the controller's environment).
if "PREFECT_HOME" not in os.environ or os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="sla-planner-prefect-home-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], ignore_errors=True)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data beside the project (profiles, traces); fails loudly if absent."""
    if not (SHARED_DATA / "README.md").is_file():
        pytest.fail(f"shared data not found at {SHARED_DATA}: tests need ../shared/data beside the project")
    return SHARED_DATA


@pytest.fixture(scope="session")
def h200_profile_dir(shared_data: Path) -> Path:
    """Measured Dynamo profile: Llama-3.1-8B-FP8 on H200, TP1 prefill and decode."""
    return shared_data / "profiles" / "dynamo" / "profiler" / "H200_TP1P_TP1D"
