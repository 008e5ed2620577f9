"""Dynamo 1.6.1's own code for tests: its separate environment (scripts/install_dynamo.sh).

`dynamo_python` is the interpreter of that environment (ai-dynamo and
ai-dynamo-runtime 1.6.1, CPU wheels, with the import-only aisimulate stand-in).
It runs the install script, which returns at once when the environment is
current; a failed install fails the test that needs it, naming the script.
Tests run Dynamo's code in a child process of that interpreter: the planner's
environment never imports `dynamo`.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.conftest import PROJECT_ROOT
from tests.fixtures_net import free_port, stop_process, wait_http_ok

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


def free_port_ranges(count: int, *, width: int, low: int = 20000, high: int = 32700) -> list[int]:
    """count bases of `width` consecutive TCP ports on 127.0.0.1, all free a moment ago, below high.

    Dynamo 1.6.1 workers read DYN_SYSTEM_PORT as a signed 16-bit number, so the
    OS's ephemeral ports (32768 and up) cannot be used.
    """
    rng = random.Random()
    bases: list[int] = []
    while len(bases) < count:
        base = rng.randrange(low, high - width)
        if any(abs(base - b) < width for b in bases):
            continue
        if all(_port_free(base + k) for k in range(width)):
            bases.append(base)
    return bases


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class DynamoFleet:
    """A Dynamo 1.6.1 frontend and the fleet executor with mocker workers, in one Dynamo namespace.

    Started on the session etcd (discovery and the planner's decision keys), on
    free ports, with its state under base_dir; `close()` stops the executor,
    drains its workers and stops the frontend, leaving no process behind.
    """

    def __init__(self, *, python: Path, etcd_url: str, base_dir: Path, namespace: str, **fleet_settings):
        from executor.fleets import mocker_fleet

        self.python, self.etcd_url, self.base_dir, self.namespace = python, etcd_url, base_dir, namespace
        self.http_port = free_port()
        # Slot k of a role serves metrics on base + k; Dynamo needs them below 32768.
        bases = free_port_ranges(2, width=16)
        self.config = mocker_fleet(
            namespace=namespace, etcd_url=etcd_url, state_dir=base_dir / "executor",
            system_port_base={"prefill": bases[0], "decode": bases[1]}, **fleet_settings,
        )
        self.config_path = base_dir / "executor.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config.model_dump(mode="json")))
        self.env = {**os.environ, "ETCD_ENDPOINTS": etcd_url, "HF_HUB_OFFLINE": "1",
                    "PYTHONPATH": str(PROJECT_ROOT)}
        self.frontend: subprocess.Popen | None = None
        self.executor: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def events_path(self) -> Path:
        return self.config.state_path / "events.jsonl"

    def events(self, kind: str | None = None) -> list[dict]:
        if not self.events_path.exists():
            return []
        rows = [json.loads(line) for line in self.events_path.read_text().splitlines() if line.strip()]
        return [r for r in rows if kind is None or r["event"] == kind]

    def workers(self) -> list[dict]:
        return json.loads((self.config.state_path / "workers.json").read_text())

    def start_frontend(self) -> None:
        from executor.fleets import frontend_command

        log = (self.base_dir / "frontend.log").open("ab")
        self.frontend = subprocess.Popen(
            frontend_command(self.python, namespace=self.namespace, http_port=self.http_port),
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
        )
        log.close()
        wait_http_ok(f"{self.url}/health", timeout_s=60, proc=self.frontend,
                     log_path=self.base_dir / "frontend.log", what="Dynamo frontend")

    def model_served(self, model: str = "tok") -> bool:
        """The frontend lists the model (its workers registered)."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as resp:
                return any(m.get("id") == model for m in json.load(resp).get("data", []))
        except (OSError, ValueError):
            return False

    def start_executor(self) -> None:
        log = (self.base_dir / "executor.log").open("ab")
        self.executor = subprocess.Popen(
            [str(self.python), "-m", "executor", "--config", str(self.config_path)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
        )
        log.close()

    def stop_executor(self) -> None:
        if self.executor is not None:
            stop_process(self.executor, timeout_s=15)
            self.executor = None

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

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.base_dir / name
        if not path.exists():
            return ""
        return f"\n--- {name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def close(self) -> None:
        self.stop_executor()
        subprocess.run([str(self.python), "-m", "executor", "--config", str(self.config_path), "--stop-workers"],
                       env=self.env, stdin=subprocess.DEVNULL, capture_output=True, timeout=180)
        if self.frontend is not None:
            stop_process(self.frontend, timeout_s=15)
            self.frontend = None
