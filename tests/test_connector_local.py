"""The local connector: in memory and as a JSON state file, with an apply delay."""

from __future__ import annotations

import json

import pytest

from connectors.base import Connector, ConnectorError, make_connector
from connectors.config import LocalConnectorConfig
from connectors.local import LocalConnector
from planner.types import Decision

T0_S = 1_000.0


def decide(prefill: int, decode: int, *, apply: bool = True) -> Decision:
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=apply, reasons=())


def test_in_memory_applies_at_once():
    conn = make_connector(LocalConnectorConfig(initial_prefill_replicas=2, initial_decode_replicas=3))
    assert isinstance(conn, Connector)
    conn.validate()
    fleet = conn.read_fleet(now_s=T0_S)
    assert (fleet.prefill.current_replicas, fleet.decode.ready_replicas, fleet.last_decision) == (2, 3, None)

    record = conn.apply(decide(4, 5), now_s=T0_S)

    assert (record.decision_id, record.done) == (1, True)
    fleet = conn.read_fleet(now_s=T0_S)
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (4, 5)
    assert conn.apply(decide(4, 5), now_s=T0_S + 60) is None  # unchanged
    assert conn.apply(decide(1, 1, apply=False), now_s=T0_S + 60) is None
    assert conn.apply(decide(1, 1), now_s=T0_S + 120).decision_id == 2


@pytest.mark.parametrize("elapsed_s, ready, done", [
    pytest.param(0.0, (1, 1), False, id="delay 30 s: at 0 s still the old replicas"),
    pytest.param(29.9, (1, 1), False, id="delay 30 s: at 29.9 s still the old replicas"),
    pytest.param(30.0, (3, 4), True, id="delay 30 s: at 30 s the targets"),
])
def test_apply_delay(elapsed_s, ready, done):
    conn = LocalConnector(LocalConnectorConfig(apply_delay_s=30.0))
    conn.apply(decide(3, 4), now_s=T0_S)
    fleet = conn.read_fleet(now_s=T0_S + elapsed_s)
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (3, 4)
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == ready
    assert fleet.last_decision.done is done
    assert conn.last_decision_done(now_s=T0_S + elapsed_s) is done


def test_state_file_survives_the_process(tmp_path):
    path = tmp_path / "state" / "fleet.json"
    cfg = LocalConnectorConfig(state_path=str(path), history_max_entries=2, gpus_per_decode_replica=2)
    for n in (2, 3, 4):
        LocalConnector(cfg).apply(decide(n, n + 1), now_s=T0_S + 60 * n)

    fleet = LocalConnector(cfg).read_fleet(now_s=T0_S + 300)

    assert fleet.last_decision.decision_id == 3
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas, fleet.decode.gpus_per_replica) == (4, 5, 2)
    assert fleet.recent_targets == ((T0_S + 180, 3, 4), (T0_S + 240, 4, 5))  # 3 decisions, 2 kept
    assert [p.name for p in path.parent.iterdir()] == ["fleet.json"]  # no temp files left behind
    assert json.loads(path.read_text())["decision_id"] == 3


@pytest.mark.parametrize("content, message", [
    pytest.param("{not json", r"fleet.json: Expecting property name", id="not JSON"),
    pytest.param('{"prefill": -1, "decode": 1, "decision_id": 0}', r"prefill must be a non-negative integer, got -1",
                 id="negative replicas"),
])
def test_corrupt_state_file_is_named(tmp_path, content, message):
    path = tmp_path / "fleet.json"
    path.write_text(content)
    with pytest.raises(ConnectorError, match=message):
        LocalConnector(LocalConnectorConfig(state_path=str(path))).validate()
