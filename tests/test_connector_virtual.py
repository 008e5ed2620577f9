"""The virtual (etcd) connector against a real etcd on 127.0.0.1."""

from __future__ import annotations

import json

import pytest
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError

from connectors.base import ConcurrentWriteError, ConnectorError, ConnectorUnavailableError, make_connector
from connectors.config import VirtualConnectorConfig
from connectors.virtual import VirtualConnector
from planner.types import Decision
from tests.fixtures_etcd import EtcdServer, etcd, etcd_namespace, etcd_server  # noqa: F401

T0_S = 1_700_000_000.0


def decide(prefill: int, decode: int, *, apply: bool = True, recommended: tuple[int, int] | None = None) -> Decision:
    rp, rd = recommended if recommended is not None else (None, None)
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=apply, reasons=(),
                    recommended_prefill_replicas=rp, recommended_decode_replicas=rd)


def raw_client(server: EtcdServer) -> Etcd3Client:
    return Etcd3Client(host="127.0.0.1", port=server.client_port, timeout=5)


def raw_keys(server: EtcdServer, namespace: str) -> dict[str, str]:
    prefix = f"/{namespace}/planner/"
    return {
        meta["key"].decode()[len(prefix):]: value.decode()
        for value, meta in raw_client(server).get_prefix(prefix)
    }


def connector(server: EtcdServer, namespace: str, **overrides) -> VirtualConnector:
    cfg = VirtualConnectorConfig(etcd_url=server.url, namespace=namespace, **overrides)
    return VirtualConnector(cfg)


class FlakyClient:
    """A real etcd3gw client with a hook that runs before each transaction."""

    def __init__(self, inner: Etcd3Client, *, before_txn=None, lose_reply: bool = False):
        self._inner = inner
        self._before_txn = before_txn
        self._lose_reply = lose_reply

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def transaction(self, txn):
        if self._before_txn is not None:
            hook, self._before_txn = self._before_txn, None
            hook()
        result = self._inner.transaction(txn)
        if self._lose_reply:
            self._lose_reply = False
            raise ConnectionFailedError("connection reset after the request was sent")
        return result


def test_first_apply_writes_all_keys_in_one_go(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace)
    conn.validate()
    assert conn.read_fleet(now_s=T0_S).last_decision is None
    assert conn.last_decision_done(now_s=T0_S) is True  # nothing to wait for

    record = conn.apply(decide(3, 5), now_s=T0_S)

    assert (record.decision_id, record.prefill_replicas, record.decode_replicas, record.done) == (1, 3, 5, False)
    keys = raw_keys(etcd, etcd_namespace)
    assert keys["num_prefill_workers"] == "3"
    assert keys["num_decode_workers"] == "5"
    assert keys["decision_id"] == "1"
    assert float(keys["decided_at_s"]) == T0_S
    assert json.loads(keys["recent_targets"]) == [{"id": 1, "t_s": T0_S, "prefill": 3, "decode": 5}]
    assert "scaled_decision_id" not in keys  # the environment writes that one


def test_unchanged_targets_and_apply_false_record_only_the_recommendation(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace)
    conn.apply(decide(2, 4), now_s=T0_S)
    prefix = f"/{etcd_namespace}/planner/"
    revisions_before = {m["key"]: m["mod_revision"] for _, m in raw_client(etcd).get_prefix(prefix)}

    assert conn.apply(decide(2, 4), now_s=T0_S + 60) is None
    assert conn.apply(decide(9, 9, apply=False), now_s=T0_S + 120) is None
    # A held run recommends below its targets (stabilization held it): the recommendation is stored.
    assert conn.apply(decide(2, 4, recommended=(1, 3)), now_s=T0_S + 180) is None

    revisions_after = {m["key"]: m["mod_revision"] for _, m in raw_client(etcd).get_prefix(prefix)}
    changed = sorted(k.decode()[len(prefix):] for k in revisions_after if revisions_after[k] != revisions_before[k])
    assert changed == ["recommendations"]
    keys = raw_keys(etcd, etcd_namespace)
    assert (keys["decision_id"], keys["num_prefill_workers"], keys["num_decode_workers"]) == ("1", "2", "4")
    assert json.loads(keys["recommendations"]) == [
        {"t_s": T0_S, "prefill": 2, "decode": 4},
        {"t_s": T0_S + 60, "prefill": 2, "decode": 4},
        {"t_s": T0_S + 120, "prefill": 9, "decode": 9},
        {"t_s": T0_S + 180, "prefill": 1, "decode": 3},
    ]
    assert len(json.loads(keys["recent_targets"])) == 1  # applied decisions: still only decision 1


def test_recommendation_and_decision_land_in_one_transaction(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace)
    conn.apply(decide(3, 5, recommended=(4, 5)), now_s=T0_S)
    conn.apply(decide(3, 3), now_s=T0_S + 60)
    prefix = f"/{etcd_namespace}/planner/"
    revisions = {m["key"].decode()[len(prefix):]: int(m["mod_revision"]) for _, m in raw_client(etcd).get_prefix(prefix)}
    # One transaction is one etcd revision: every key written by the second run carries it.
    assert len(set(revisions.values())) == 1, revisions
    keys = raw_keys(etcd, etcd_namespace)
    assert json.loads(keys["recommendations"]) == [
        {"t_s": T0_S, "prefill": 4, "decode": 5},
        {"t_s": T0_S + 60, "prefill": 3, "decode": 3},
    ]


def test_retried_run_records_its_recommendation_once(etcd, etcd_namespace):
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    conn = VirtualConnector(cfg, client=FlakyClient(raw_client(etcd), lose_reply=True))
    with pytest.raises(ConnectorUnavailableError):
        conn.apply(decide(1, 1, apply=False), now_s=T0_S)  # committed, but the reply was lost
    prefix = f"/{etcd_namespace}/planner/"
    revision_before = [m["mod_revision"] for _, m in raw_client(etcd).get_prefix(prefix)]

    assert conn.apply(decide(1, 1, apply=False), now_s=T0_S) is None  # the task's retry, same run time

    assert [m["mod_revision"] for _, m in raw_client(etcd).get_prefix(prefix)] == revision_before  # no write
    assert connector(etcd, etcd_namespace).read_fleet(now_s=T0_S).recent_targets == ((T0_S, 1, 1),)


def test_concurrent_recording_is_retried_and_nothing_lost(etcd, etcd_namespace):
    other = connector(etcd, etcd_namespace)
    other.apply(decide(2, 2), now_s=T0_S)
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    # Between our read and our write, another run records its recommendation (no new decision).
    flaky = FlakyClient(raw_client(etcd), before_txn=lambda: other.apply(decide(2, 2), now_s=T0_S + 30))
    ours = VirtualConnector(cfg, client=flaky)

    record = ours.apply(decide(3, 3), now_s=T0_S + 31)

    assert record.decision_id == 2
    fleet = connector(etcd, etcd_namespace).read_fleet(now_s=T0_S + 31)
    assert fleet.recent_targets == ((T0_S, 2, 2), (T0_S + 30, 2, 2), (T0_S + 31, 3, 3))


def test_recording_conflicts_beyond_the_retry_budget_raise(etcd, etcd_namespace):
    other = connector(etcd, etcd_namespace)
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace, conflict_retries=1)
    calls = {"n": 0}

    class EveryTxn(FlakyClient):
        def transaction(self, txn):
            calls["n"] += 1
            other.apply(decide(1, 1, apply=False), now_s=T0_S + calls["n"])
            return self._inner.transaction(txn)

    ours = VirtualConnector(cfg, client=EveryTxn(raw_client(etcd)))
    with pytest.raises(ConcurrentWriteError, match=r"recommendations kept changing .*2 attempts, conflict_retries=1"):
        ours.apply(decide(1, 1, apply=False), now_s=T0_S + 100)
    stored = connector(etcd, etcd_namespace).read_fleet(now_s=T0_S + 100).recent_targets
    assert [t for t, _, _ in stored] == [T0_S + 1, T0_S + 2]  # the other run's, not ours


def test_done_when_environment_confirms_and_ready_follows(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace, initial_prefill_replicas=1, initial_decode_replicas=2)
    conn.apply(decide(3, 5), now_s=T0_S)

    fleet = conn.read_fleet(now_s=T0_S + 10)
    # Not confirmed yet: current = targets, ready = the replicas before any decision.
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (3, 5)
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (1, 2)
    assert fleet.last_decision.done is False
    assert conn.last_decision_done(now_s=T0_S + 10) is False

    raw_client(etcd).put(f"/{etcd_namespace}/planner/scaled_decision_id", "1")

    fleet = conn.read_fleet(now_s=T0_S + 20)
    assert fleet.last_decision.done is True
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (3, 5)

    # Second decision: until confirmed, ready stays at decision 1's targets.
    conn.apply(decide(4, 6), now_s=T0_S + 60)
    fleet = conn.read_fleet(now_s=T0_S + 70)
    assert fleet.last_decision.decision_id == 2
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (3, 5)
    assert fleet.recent_targets == ((T0_S, 3, 5), (T0_S + 60, 4, 6))


@pytest.mark.parametrize("timeout_s, elapsed_s, done", [
    pytest.param(1800.0, 1799.0, False, id="default 1800 s: 1799 s after, still waiting"),
    pytest.param(1800.0, 1800.0, True, id="default 1800 s: 1800 s after, timed out"),
    pytest.param(30.0, 31.0, True, id="configured 30 s: 31 s after, timed out"),
])
def test_done_after_timeout_without_confirmation(etcd, etcd_namespace, timeout_s, elapsed_s, done):
    conn = connector(etcd, etcd_namespace, done_timeout_s=timeout_s)
    conn.apply(decide(2, 2), now_s=T0_S)
    assert conn.last_decision_done(now_s=T0_S + elapsed_s) is done
    assert conn.read_fleet(now_s=T0_S + elapsed_s).last_decision.done is done


def test_decision_id_continues_across_planner_restarts(etcd, etcd_namespace):
    connector(etcd, etcd_namespace).apply(decide(1, 1), now_s=T0_S)
    connector(etcd, etcd_namespace).apply(decide(2, 2), now_s=T0_S + 60)
    # A brand-new process: nothing in memory, the id comes back from etcd.
    record = connector(etcd, etcd_namespace).apply(decide(3, 3), now_s=T0_S + 120)
    assert record.decision_id == 3


def test_concurrent_planner_cannot_write_the_same_id(etcd, etcd_namespace):
    other = connector(etcd, etcd_namespace)
    other.apply(decide(1, 1), now_s=T0_S)
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    # Between our read and our write, the other planner writes decision 2.
    flaky = FlakyClient(raw_client(etcd), before_txn=lambda: other.apply(decide(5, 5), now_s=T0_S + 30))
    ours = VirtualConnector(cfg, client=flaky)

    with pytest.raises(ConcurrentWriteError, match=r"decision_id is no longer 1 but 2: another planner"):
        ours.apply(decide(2, 2), now_s=T0_S + 31)

    keys = raw_keys(etcd, etcd_namespace)
    assert (keys["decision_id"], keys["num_prefill_workers"], keys["num_decode_workers"]) == ("2", "5", "5")
    # The retry reads afresh and takes the next id.
    assert ours.apply(decide(2, 2), now_s=T0_S + 32).decision_id == 3


def test_lost_reply_then_retry_neither_skips_nor_reuses_an_id(etcd, etcd_namespace):
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    conn = VirtualConnector(cfg, client=FlakyClient(raw_client(etcd), lose_reply=True))
    with pytest.raises(ConnectorUnavailableError):
        conn.apply(decide(2, 3), now_s=T0_S)  # committed, but the reply was lost
    # The task's retry: the write is already there, so nothing is written again.
    assert conn.apply(decide(2, 3), now_s=T0_S + 1) is None
    assert conn.apply(decide(4, 4), now_s=T0_S + 60).decision_id == 2


def test_etcd_down_raises_clearly_and_ids_stay_consecutive(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace, request_timeout_s=1.0)
    ids = [conn.apply(decide(n, n), now_s=T0_S + 60 * n).decision_id for n in (1, 2)]
    etcd.stop()
    try:
        with pytest.raises(ConnectorUnavailableError, match=rf"etcd {etcd.url}: writing|etcd {etcd.url}: reading"):
            conn.apply(decide(3, 3), now_s=T0_S + 180)
        with pytest.raises(ConnectionError, match=etcd.url):  # the Prefect task retries on this
            conn.read_fleet(now_s=T0_S + 180)
    finally:
        etcd.start()
    ids.append(conn.apply(decide(3, 3), now_s=T0_S + 181).decision_id)
    ids.append(conn.apply(decide(4, 4), now_s=T0_S + 240).decision_id)
    assert ids == [1, 2, 3, 4]


def test_histories_are_bounded_and_rebuild_the_stabilization_window(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace, history_max_entries=3)
    for n in range(1, 6):
        conn.apply(decide(n, 10 - n), now_s=T0_S + 60 * n)
    fleet = connector(etcd, etcd_namespace).read_fleet(now_s=T0_S + 400)
    # 5 runs, 3 recommendations kept: n = 3, 4, 5.
    assert fleet.recent_targets == ((T0_S + 180, 3, 7), (T0_S + 240, 4, 6), (T0_S + 300, 5, 5))
    assert [e["id"] for e in json.loads(raw_keys(etcd, etcd_namespace)["recent_targets"])] == [3, 4, 5]


def test_recommendations_older_than_max_age_are_dropped(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace, history_max_age_s=120.0)
    for t in (0.0, 60.0, 120.0, 180.0):
        conn.apply(decide(2, 2, apply=False), now_s=T0_S + t)
    # At 180 s the cutoff is 180 - 120 = 60 s: entries at 0 and 60 go (60 is not > 60).
    assert connector(etcd, etcd_namespace).read_fleet(now_s=T0_S + 180).recent_targets == (
        (T0_S + 120, 2, 2), (T0_S + 180, 2, 2))


@pytest.mark.parametrize("keys, message", [
    pytest.param({"num_prefill_workers": "1", "num_decode_workers": "1", "decided_at_s": "0", "decision_id": "x1"},
                 r"decision_id: expected a non-negative integer, got 'x1'", id="id not a number"),
    pytest.param({"decision_id": "1", "num_prefill_workers": "2"},
                 r"incomplete, missing .*num_decode_workers", id="targets half written"),
    pytest.param({"recent_targets": "[{\"id\": 1}]"}, r"recent_targets: recent targets history is not", id="bad history"),
    pytest.param({"recommendations": '[{"t_s": 1, "prefill": 2}]'},
                 r"planner/recommendations: recommendation history is not .*'decode'", id="bad recommendations"),
    pytest.param({"recommendations": '{"t_s": 1}'}, r"recommendations: .*expected a list, got dict",
                 id="recommendations not a list"),
])
def test_malformed_keys_are_named(etcd, etcd_namespace, keys, message):
    client = raw_client(etcd)
    for name, value in keys.items():
        client.put(f"/{etcd_namespace}/planner/{name}", value)
    with pytest.raises(ConnectorError, match=message):
        connector(etcd, etcd_namespace).validate()


def test_factory_uses_planner_namespace_when_unset(etcd):
    conn = make_connector(VirtualConnectorConfig(etcd_url=etcd.url), default_namespace="ns-from-planner")
    assert isinstance(conn, VirtualConnector)
    assert conn.prefix == "/ns-from-planner/planner/"


def test_config_rejects_bad_url():
    with pytest.raises(ValueError, match=r"etcd_url must look like http://host:port, got 'etcd:2379'"):
        VirtualConnectorConfig(etcd_url="etcd:2379")
