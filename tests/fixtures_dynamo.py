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
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

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
