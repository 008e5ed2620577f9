"""One Prefect test harness (a temporary API server with SQLite) per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prefect_harness():
    """Start Prefect's test harness once (~5 s) and share it across tests."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
