"""A Dynamo 1.6.1 frontend and a fleet executor with mocker workers, as local processes.

Used by the tests and the simulator-vs-mocker benchmark: everything on
127.0.0.1 in one Dynamo namespace, on a given etcd (discovery and the
planner's decision keys), with its state, logs and the executor's records
under `base_dir`. `close()` stops the executor, drains its workers and stops
the frontend, leaving no process behind. The planner side (decisions) is
whoever writes the virtual connector's keys.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from executor.fleets import frontend_command, mocker_fleet

PROJECT_ROOT = Path(__file__).resolve().parents[1]


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


class LocalFleet:
    """Frontend + executor + mocker workers; start_*() in order, close() always."""

    def __init__(self, *, python: str | Path, etcd_url: str, base_dir: Path, namespace: str, http_port: int,
                 **fleet_settings):
        self.python, self.etcd_url, self.base_dir, self.namespace = Path(python), etcd_url, base_dir, namespace
        self.http_port = http_port
        if "system_port_base" not in fleet_settings:
            bases = free_port_ranges(2, width=32)
            fleet_settings["system_port_base"] = {"prefill": bases[0], "decode": bases[1]}
        self.config = mocker_fleet(namespace=namespace, etcd_url=etcd_url, state_dir=base_dir / "executor",
                                   **fleet_settings)
        base_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = base_dir / "executor.yaml"
        self.config_path.write_text(yaml.safe_dump(self.config.model_dump(mode="json")))
        self.env = {**os.environ, "ETCD_ENDPOINTS": etcd_url, "HF_HUB_OFFLINE": "1",
                    "PYTHONPATH": str(PROJECT_ROOT)}
        self.frontend: subprocess.Popen | None = None
        self.executor: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    # -- records ---------------------------------------------------------------

    def events(self, kind: str | None = None) -> list[dict]:
        path = self.config.state_path / "events.jsonl"
        if not path.exists():
            return []
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in rows if kind is None or r["event"] == kind]

    def workers(self) -> list[dict]:
        return json.loads((self.config.state_path / "workers.json").read_text())

    def model_served(self, model: str | None = None) -> bool:
        """The frontend lists the model (its workers registered)."""
        model = model or self.config.roles["decode"].command[self.config.roles["decode"].command.index(
            "--model-name") + 1]
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as resp:
                return any(m.get("id") == model for m in json.load(resp).get("data", []))
        except (OSError, ValueError):
            return False

    def log_tail(self, name: str, lines: int = 15) -> str:
        path = self.base_dir / name
        if not path.exists():
            return ""
        return f"\n--- {name} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    # -- processes -------------------------------------------------------------

    def start_frontend(self, *, timeout_s: float = 60.0) -> None:
        self.frontend = self._spawn("frontend", frontend_command(self.python, namespace=self.namespace,
                                                                 http_port=self.http_port))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.frontend.poll() is not None:
                raise RuntimeError(f"Dynamo frontend exited with {self.frontend.returncode}"
                                   f"{self.log_tail('frontend.log')}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=1.0) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"Dynamo frontend not healthy at {self.url} after {timeout_s:g} s"
                           f"{self.log_tail('frontend.log')}")

    def start_executor(self) -> None:
        self.executor = self._spawn("executor", [str(self.python), "-m", "executor", "--config",
                                                 str(self.config_path)])

    def wait_served(self, *, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.model_served():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no worker registered within {timeout_s:g} s{self.log_tail('executor.log')}")
            if self.executor is not None and self.executor.poll() is not None:
                raise RuntimeError(f"executor exited with {self.executor.returncode}{self.log_tail('executor.log')}")
            time.sleep(0.2)

    def stop_executor(self) -> None:
        if self.executor is not None:
            stop_process(self.executor, timeout_s=15)
            self.executor = None

    def close(self) -> None:
        self.stop_executor()
        subprocess.run([str(self.python), "-m", "executor", "--config", str(self.config_path), "--stop-workers"],
                       env=self.env, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
        if self.frontend is not None:
            stop_process(self.frontend, timeout_s=15)
            self.frontend = None

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        with (self.base_dir / f"{name}.log").open("ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.env)


def stop_process(proc: subprocess.Popen, *, timeout_s: float = 5.0) -> None:
    """SIGTERM, wait, then SIGKILL if it did not exit; always reaps the process."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)
