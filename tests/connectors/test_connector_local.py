"""The local connector: in memory and as a JSON state file, with an apply delay."""

from __future__ import annotations

import json

import pytest

from connectors.base import Connector, ConnectorError
from connectors.config import LocalConnectorConfig
from connectors.factory import make_connector
from connectors.local import LocalConnector
from planner.types import Decision

T0_S = 1_000.0


def decide(prefill: int, decode: int, *, apply: bool = True, recommended: tuple[int, int] | None = None) -> Decision:
    rp, rd = recommended if recommended is not None else (None, None)
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=apply, reasons=(),
                    recommended_prefill_replicas=rp, recommended_decode_replicas=rd)


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


def test_every_run_records_its_recommendation_in_the_same_file_write(tmp_path):
    path = tmp_path / "fleet.json"
    cfg = LocalConnectorConfig(state_path=str(path))
    assert LocalConnector(cfg).apply(decide(4, 5, recommended=(6, 5)), now_s=T0_S).decision_id == 1
    writes = []
    for t_s, decision in [
        (T0_S + 60, decide(4, 5)),                           # unchanged targets
        (T0_S + 120, decide(4, 5, recommended=(2, 3))),      # held by stabilization
        (T0_S + 180, decide(1, 1, apply=False)),             # a hold
    ]:
        before = path.stat().st_ino
        assert LocalConnector(cfg).apply(decision, now_s=t_s) is None
        writes.append(path.stat().st_ino != before)  # write-then-rename: a new inode per write

    assert writes == [True, True, True]
    state = json.loads(path.read_text())
    assert (state["decision_id"], state["prefill"], state["decode"]) == (1, 4, 5)
    assert [e["id"] for e in state["history"]] == [1]
    fleet = LocalConnector(cfg).read_fleet(now_s=T0_S + 200)  # a new instance reads it all back
    assert fleet.recent_targets == ((T0_S, 6, 5), (T0_S + 60, 4, 5), (T0_S + 120, 2, 3), (T0_S + 180, 1, 1))


def test_retried_run_records_once(tmp_path):
    path = tmp_path / "fleet.json"
    conn = LocalConnector(LocalConnectorConfig(state_path=str(path)))
    conn.apply(decide(1, 1, apply=False), now_s=T0_S)
    written = path.read_text()
    inode = path.stat().st_ino
    assert conn.apply(decide(1, 1, apply=False), now_s=T0_S) is None
    assert (path.stat().st_ino, path.read_text()) == (inode, written)  # nothing rewritten
    # Same run time, another recommendation (a rerun that decided differently): replaced, not added.
    conn.apply(decide(1, 1, apply=False, recommended=(2, 1)), now_s=T0_S)
    assert conn.read_fleet(now_s=T0_S).recent_targets == ((T0_S, 2, 1),)


@pytest.mark.parametrize("max_entries, max_age_s, expected_t_s", [
    pytest.param(32, 3600.0, [0, 60, 120, 180, 240], id="within both bounds: all 5 kept"),
    pytest.param(3, 3600.0, [120, 180, 240], id="max 3 entries: newest 3"),
    pytest.param(32, 120.0, [180, 240], id="max age 120 s at 240 s: cutoff 120, 120 is not > 120"),
    pytest.param(1, 120.0, [240], id="both: the newest only"),
])
def test_recommendation_history_is_bounded(max_entries, max_age_s, expected_t_s):
    conn = LocalConnector(LocalConnectorConfig(history_max_entries=max_entries, history_max_age_s=max_age_s))
    for t in (0, 60, 120, 180, 240):
        conn.apply(decide(2, 2, apply=False), now_s=T0_S + t)
    assert [t - T0_S for t, _, _ in conn.read_fleet(now_s=T0_S + 240).recent_targets] == expected_t_s


def test_state_file_without_recommendations_reads_as_empty(tmp_path):
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"version": 1, "prefill": 2, "decode": 2, "decision_id": 0, "decided_at_s": None,
                                "ready_before": [2, 2], "history": []}))
    conn = LocalConnector(LocalConnectorConfig(state_path=str(path)))
    assert conn.read_fleet(now_s=T0_S).recent_targets == ()
    conn.apply(decide(2, 2, apply=False), now_s=T0_S)
    assert conn.read_fleet(now_s=T0_S).recent_targets == ((T0_S, 2, 2),)


@pytest.mark.parametrize("content, message", [
    pytest.param("{not json", r"fleet.json: Expecting property name", id="not JSON"),
    pytest.param('{"prefill": -1, "decode": 1, "decision_id": 0}', r"prefill must be a non-negative integer, got -1",
                 id="negative replicas"),
    pytest.param("[1, 2]", r"fleet.json: expected a JSON object, got list", id="not an object"),
    pytest.param('{"prefill": 1, "decode": 1, "decision_id": 0, "ready_before": [1, 1], '
                 '"recommendations": [{"t_s": 5, "prefill": -2, "decode": 1}]}',
                 r"fleet.json: recommendation history is not .*replicas must be >= 0, got prefill -2",
                 id="negative recommendation"),
])
def test_corrupt_state_file_is_named(tmp_path, content, message):
    path = tmp_path / "fleet.json"
    path.write_text(content)
    with pytest.raises(ConnectorError, match=message):
        LocalConnector(LocalConnectorConfig(state_path=str(path))).validate()
