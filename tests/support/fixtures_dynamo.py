"""Dynamo 1.6.1's own code for tests: its separate environment (scripts/install_dynamo.sh).

`dynamo_python` is the interpreter of that environment (ai-dynamo and
ai-dynamo-runtime 1.6.1, CPU wheels, with the import-only aisimulate stand-in).
It runs the install script, which returns at once when the environment is
current; a failed install fails the test that needs it, naming the script.
Tests run Dynamo's code in a child process of that interpreter: the planner's
environment never imports `dynamo`.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from executor.localfleet import LocalFleet, free_port_ranges  # noqa: F401 - tests import it from here
from tests.conftest import PROJECT_ROOT
from tests.support.fixtures_net import free_port

SHARED_DYNAMO = PROJECT_ROOT.parent / "shared" / "dynamo"


@pytest.fixture(scope="session")
def dynamo_python() -> Path:
    """Path of the Dynamo 1.6.1 environment's python (installed on first use)."""
    script = PROJECT_ROOT / "scripts" / "install_dynamo.sh"
    proc = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
        env={**os.environ, "UV_COMPILE_BYTECODE": "1"},
    )
    if proc.returncode != 0:
        pytest.fail(f"{script} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    python = Path(proc.stdout.strip().splitlines()[-1])
    if not python.is_file():
        pytest.fail(f"{script} printed {python}, which is not a file")
    return python


@pytest.fixture(scope="session")
def shared_dynamo() -> Path:
    """What was read from Dynamo 1.6.1 itself (CRDs, recorded requests, metrics); fails loudly if absent."""
    if not (SHARED_DYNAMO / "README.md").is_file():
        pytest.fail(f"Dynamo kit not found at {SHARED_DYNAMO}: tests need ../shared/dynamo beside the project")
    return SHARED_DYNAMO


class DynamoFleet(LocalFleet):
    """executor.localfleet.LocalFleet on free ports, with waits that fail with the fleet's records."""

    def __init__(self, *, python: Path, etcd_url: str, base_dir: Path, namespace: str, **fleet_settings):
        super().__init__(python=python, etcd_url=etcd_url, base_dir=base_dir, namespace=namespace,
                         http_port=free_port(), **fleet_settings)

    def wait_for(self, predicate, *, timeout_s: float, what: str):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.executor is not None and self.executor.poll() is not None:
                raise AssertionError(f"executor exited with {self.executor.returncode} while waiting for {what}"
                                     f"{self.log_tail('executor.log')}")
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; events: {self.events()[-8:]}"
                             f"{self.log_tail('executor.log')}")

    def start_frontend(self) -> None:
        super().start_frontend(timeout_s=60)
