"""A real Prefect server and process worker on 127.0.0.1, as a user runs them.

`PrefectStack` starts `prefect server start` (SQLite in a temp PREFECT_HOME,
free port), runs Prefect CLI commands against it, and starts/stops process
workers. Everything is killed at teardown. A process worker ignores its first
SIGTERM, so `stop_process` escalates to SIGKILL after a short wait.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support.fixtures_net import free_port, stop_process, wait_http_ok

ROOT = Path(__file__).resolve().parents[2]
PREFECT_BIN = Path(sys.executable).with_name("prefect")


class PrefectStack:
    def __init__(self, base_dir: Path):
        self.base_dir = base_dir
        self.port = free_port()
        self.home = base_dir / "prefect-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self._server: subprocess.Popen | None = None
        self._workers: list[subprocess.Popen] = []

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            PREFECT_HOME=str(self.home),
            PREFECT_API_URL=self.api_url,
            DO_NOT_TRACK="1",
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="2",
            PREFECT_WORKER_QUERY_SECONDS="1",
            PREFECT_WORKER_PREFETCH_SECONDS="5",
            PREFECT_UI_ENABLED="true",
        )
        env.update(extra)
        return env

    def start_server(self, *, timeout_s: float = 120.0) -> None:
        log = (self.base_dir / "server.log").open("ab")
        env = self.env()
        env.pop("PREFECT_API_URL")
        # The UI calls the API at this address; without it the UI tries the default port 4200.
        env["PREFECT_UI_API_URL"] = self.api_url
        self._server = subprocess.Popen(
            [str(PREFECT_BIN), "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.base_dir,
        )
        log.close()
        wait_http_ok(f"{self.api_url}/health", timeout_s=timeout_s, proc=self._server,
                     log_path=self.base_dir / "server.log", what="prefect server")

    def cli(self, *args: str, cwd: Path = ROOT, timeout_s: float = 180.0, **env: str) -> str:
        proc = subprocess.run(
            [str(PREFECT_BIN), *args], env=self.env(**env), cwd=cwd, capture_output=True, text=True,
            timeout=timeout_s, stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"prefect {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def start_worker(self, pool: str, *, name: str = "worker", cwd: Path = ROOT, **env: str) -> subprocess.Popen:
        log = (self.base_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen(
            [str(PREFECT_BIN), "worker", "start", "--pool", pool, "--name", name],
            env=self.env(**env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self._workers.append(proc)
        return proc

    def api(self, method: str, path: str, body: dict | None = None) -> object:
        req = urllib.request.Request(
            f"{self.api_url}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read() or b"null")

    def flow_runs(self, *, deployment_id: str | None = None) -> list[dict]:
        body: dict = {"limit": 200, "sort": "EXPECTED_START_TIME_ASC"}
        if deployment_id:
            body["deployments"] = {"id": {"any_": [deployment_id]}}
        return self.api("POST", "/flow_runs/filter", body)

    def wait_for(self, predicate, *, timeout_s: float, what: str, poll_s: float = 1.0):
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            last = predicate()
            if last:
                return last
            time.sleep(poll_s)
        logs = "".join(
            f"\n--- {p.name} ---\n" + "\n".join(p.read_text(errors="replace").splitlines()[-40:])
            for p in sorted(self.base_dir.glob("*.log"))
        )
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; last: {last!r}{logs}")

    def stop(self) -> None:
        for proc in self._workers:
            _kill_group(proc)
        self._workers.clear()
        if self._server is not None:
            stop_process(self._server, timeout_s=10.0)
            self._server = None


def _kill_group(proc: subprocess.Popen) -> None:
    """A worker and the flow-run processes it started: SIGTERM, then SIGKILL the group."""
    import signal

    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=5)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)
