"""Our virtual connector against Dynamo 1.6.1's own code: its VirtualConnectorClient and VirtualConnectorCoordinator.

Both run in Dynamo's environment (tests/support/dynamo_drivers, real `dynamo._core`
from ai-dynamo-runtime 1.6.1) against a real etcd. The client receives every
decision our connector writes and acknowledges it; our planner sees the ack
and waits while it is missing (at most done_timeout_s); writes that change no
decision never wake the client; and our connector continues where Dynamo's
own coordinator left off, alive or gone.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path

import pytest
from etcd3gw.client import Etcd3Client

from connectors.config import VirtualConnectorConfig
from connectors.virtual import VirtualConnector
from planner.types import Decision
from tests.support.fixtures_dynamo import dynamo_python  # noqa: F401
from tests.support.fixtures_etcd import etcd, etcd_namespace, etcd_server  # noqa: F401

pytestmark = [pytest.mark.integration]
DRIVERS = Path(__file__).resolve().parents[1] / "support" / "dynamo_drivers"


def decide(prefill: int, decode: int, *, apply: bool = True) -> Decision:
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=apply, reasons=())


class Driver:
    """A driver script in Dynamo's environment; its JSON lines arrive on a queue."""

    def __init__(self, python: Path, script: str, *args: str, etcd_url: str):
        self.proc = subprocess.Popen(
            [str(python), str(DRIVERS / script), *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True, env={**os.environ, "ETCD_ENDPOINTS": etcd_url},
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.expect("ready", timeout_s=30)

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))

    def expect(self, event: str, *, timeout_s: float = 15.0, **fields) -> dict:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                row = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(row)
            if row["event"] == event and all(row.get(k) == v for k, v in fields.items()):
                return row
        raise AssertionError(f"no {event} {fields} within {timeout_s} s; saw {self.seen[-10:]}")

    def quiet(self, seconds: float) -> list[dict]:
        """What it printed in the next `seconds`."""
        out = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                out.append(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))
            except queue.Empty:
                pass
        return out

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@pytest.fixture
def drivers(dynamo_python, etcd):  # noqa: F811
    started: list[Driver] = []

    def start(script: str, *args: str) -> Driver:
        started.append(Driver(dynamo_python, script, *args, etcd_url=etcd.url))
        return started[-1]

    yield start
    for driver in started:
        driver.stop()


def wait_until(predicate, *, timeout_s: float = 15.0, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def coordinator_decides(coordinator: Driver, decision_id: int, prefill: int, decode: int) -> None:
    """Have Dynamo's coordinator publish a decision once it sees the previous one acknowledged.

    It skips a decision while its view of the previous one is unacknowledged, and that view can lag the
    client's ack on a loaded machine: ask for its state until it reports ready, then decide.
    """
    deadline = time.monotonic() + 30.0
    while decision_id > 0:
        coordinator.send("state")
        if coordinator.expect("state")["ready"]:
            break
        assert time.monotonic() < deadline, f"Dynamo's coordinator never saw decision {decision_id - 1} acknowledged"
        time.sleep(0.2)
    coordinator.send(f"decide {prefill} {decode}")
    coordinator.expect("state", decision_id=decision_id, prefill=prefill, decode=decode)


def test_dynamos_client_receives_and_acknowledges_every_decision(etcd, etcd_namespace, drivers):  # noqa: F811
    ours = VirtualConnector(VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace))
    client = drivers("vc_client.py", etcd_namespace, "auto")
    now = time.time()

    first = ours.apply(decide(2, 3), now_s=now)
    assert first.decision_id == 0
    client.expect("decision", decision_id=0, prefill=2, decode=3)
    client.expect("acked", decision_id=0)
    wait_until(lambda: ours.last_decision_done(now_s=time.time()), what="our planner to see the ack")
    fleet = ours.read_fleet(now_s=time.time())
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (2, 3)

    # Runs that change nothing record their recommendation outside the client's prefix: no wake-up.
    for k in range(3):
        assert ours.apply(decide(2, 3, apply=False), now_s=now + 10 + k) is None
    assert [r for r in client.quiet(2.0) if r["event"] == "decision"] == []

    second = ours.apply(decide(1, 1), now_s=now + 60)
    assert second.decision_id == 1
    row = client.expect("decision", decision_id=1, prefill=1, decode=1)
    assert row["wakes"] == 2  # one wake-up per decision, none for the bookkeeping writes
    client.expect("acked", decision_id=1)
    wait_until(lambda: ours.last_decision_done(now_s=time.time()), what="the second ack")


def test_our_planner_waits_for_a_missing_ack_with_dynamos_max_wait(etcd, etcd_namespace, drivers):  # noqa: F811
    ours = VirtualConnector(VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace,
                                                   done_timeout_s=600.0))
    client = drivers("vc_client.py", etcd_namespace, "manual")
    now = time.time()
    ours.apply(decide(4, 4), now_s=now)
    client.expect("decision", decision_id=0, prefill=4, decode=4)
    time.sleep(1.0)
    assert ours.last_decision_done(now_s=time.time()) is False  # not acknowledged: the planner holds
    assert ours.last_decision_done(now_s=now + 600) is True  # ... at most done_timeout_s
    client.send("ack")
    client.expect("acked", decision_id=0)
    wait_until(lambda: ours.last_decision_done(now_s=time.time()), what="the ack")
    # The ack is leased to the client process: it vanishes when the client exits.
    client.stop()
    wait_until(lambda: not ours.last_decision_done(now_s=time.time()), timeout_s=40,
               what="the ack to vanish with the client's lease")


def test_we_continue_where_dynamos_coordinator_left_off(etcd, etcd_namespace, drivers):  # noqa: F811
    raw = Etcd3Client(host="127.0.0.1", port=etcd.client_port, timeout=5)
    prefix = f"v1/{etcd_namespace}/planner/"
    client = drivers("vc_client.py", etcd_namespace, "auto")
    coordinator = drivers("vc_coordinator.py", etcd_namespace)
    for n, (p, d) in enumerate(((2, 2), (3, 3))):
        coordinator_decides(coordinator, n, p, d)
        client.expect("acked", decision_id=n)

    # Dynamo's planner still runs: we read its keyset (leased to it) and write the next decision.
    ours = VirtualConnector(VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace))
    fleet = ours.read_fleet(now_s=time.time())
    assert (fleet.last_decision.decision_id, fleet.prefill.current_replicas, fleet.decode.current_replicas) == (1, 3, 3)
    assert fleet.last_decision.done
    assert ours.apply(decide(5, 4), now_s=time.time()).decision_id == 2
    client.expect("acked", decision_id=2)

    # Dynamo's planner exits and revokes its lease: our decision, written without one, stays.
    coordinator.send("exit")
    coordinator.proc.wait(timeout=15)
    time.sleep(1.0)
    assert {m["key"].decode()[len(prefix):]: v.decode() for v, m in raw.get_prefix(prefix)} == {
        "num_prefill_workers": "5", "num_decode_workers": "4", "decision_id": "2", "scaled_decision_id": "2"}


def test_after_dynamos_planner_is_gone_our_ids_exceed_the_surviving_ack(etcd, etcd_namespace, drivers):  # noqa: F811
    raw = Etcd3Client(host="127.0.0.1", port=etcd.client_port, timeout=5)
    client = drivers("vc_client.py", etcd_namespace, "auto")
    coordinator = drivers("vc_coordinator.py", etcd_namespace)
    for n in range(3):
        coordinator_decides(coordinator, n, n + 1, 1)
        client.expect("acked", decision_id=n)
    coordinator.send("exit")
    coordinator.proc.wait(timeout=15)
    # Its three keys went with its lease; the client's ack of 2 survives while the client runs.
    wait_until(lambda: not raw.get(f"v1/{etcd_namespace}/planner/decision_id"), what="the leased keys to go")
    assert raw.get(f"v1/{etcd_namespace}/planner/scaled_decision_id") == [b"2"]

    # A restarted Dynamo planner would start again at 0, below the ack; we start above it.
    ours = VirtualConnector(VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace))
    record = ours.apply(decide(2, 2), now_s=time.time())
    assert record.decision_id == 3
    client.expect("decision", decision_id=3, prefill=2, decode=2)
    client.expect("acked", decision_id=3)
    wait_until(lambda: ours.last_decision_done(now_s=time.time()), what="the ack of our first decision")
