"""A real etcd (Debian etcd-server, /usr/bin/etcd) on 127.0.0.1 for tests.

`etcd_server` is session-scoped: one etcd for the whole run, in a temp data
dir, on free ports, killed at teardown. Tests isolate themselves by key prefix
(a unique namespace each), and may stop/start it to simulate an outage; the
data dir and ports are kept across a restart, as for a real member.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.fixtures_net import free_port, stop_process, wait_http_ok

ETCD_BIN = Path("/usr/bin/etcd")


class EtcdServer:
    """One single-member etcd process; start/stop/restart keep its data."""

    def __init__(self, *, base_dir: Path):
        self.base_dir = base_dir
        self.data_dir = base_dir / "data"
        self.log_path = base_dir / "etcd.log"
        self.client_port = free_port()
        self.peer_port = free_port()
        self._proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, *, timeout_s: float = 15.0) -> None:
        if self.running:
            return
        if not ETCD_BIN.is_file():
            pytest.fail(f"{ETCD_BIN} not found: install the Debian package etcd-server")
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            str(ETCD_BIN), "--name", "test", "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}",
            # A one-member cluster elects itself in ~0.05 s with these.
            "--heartbeat-interval", "10", "--election-timeout", "50",
            "--logger", "zap", "--log-level", "warn",
        ]
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        wait_http_ok(f"{self.url}/health", timeout_s=timeout_s, proc=self._proc,
                     log_path=self.log_path, what="etcd")

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory) -> EtcdServer:
    """A running etcd for the session (check `.running`; tests that stop it restart it)."""
    base = tmp_path_factory.mktemp("etcd")
    server = EtcdServer(base_dir=base)
    server.start()
    yield server
    server.stop()
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> EtcdServer:
    """The session etcd, restarted first if an earlier test left it stopped."""
    if not etcd_server.running:
        etcd_server.start()
    return etcd_server


@pytest.fixture
def etcd_namespace() -> str:
    """A key namespace no other test uses (keys go under v1/{namespace}/planner/ and sla-planner/{namespace}/planner/)."""
    return f"test-{uuid.uuid4().hex[:10]}"
