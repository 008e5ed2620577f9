"""The virtual (etcd) connector against a real etcd on 127.0.0.1."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from etcd3gw.client import Etcd3Client
from etcd3gw.exceptions import ConnectionFailedError

from connectors.base import (
    ConcurrentWriteError,
    ConnectorError,
    ConnectorUnavailableError,
    FleetChangedError,
)
from connectors.config import VirtualConnectorConfig
from connectors.factory import make_connector
from connectors.virtual import VirtualConnector
from planner.types import Decision
from tests.support.fixtures_etcd import EtcdServer

T0_S = 1_700_000_000.0


def decide(prefill: int, decode: int, *, apply: bool = True, recommended: tuple[int, int] | None = None) -> Decision:
    rp, rd = recommended if recommended is not None else (None, None)
    return Decision(prefill_replicas=prefill, decode_replicas=decode, apply=apply, reasons=(),
                    recommended_prefill_replicas=rp, recommended_decode_replicas=rd)


def raw_client(server: EtcdServer) -> Etcd3Client:
    return Etcd3Client(host="127.0.0.1", port=server.client_port, timeout=5)


def decision_prefix(namespace: str) -> str:
    return f"v1/{namespace}/planner/"  # Dynamo 1.6.1's


def bookkeeping_prefix(namespace: str) -> str:
    return f"sla-planner/{namespace}/planner/"


def key(namespace: str, name: str) -> str:
    """The full etcd key of one of the connector's keys (decision or bookkeeping)."""
    bookkeeping = name in ("decided_at_s", "recent_targets", "recommendations")
    return (bookkeeping_prefix if bookkeeping else decision_prefix)(namespace) + name


def raw_keys(server: EtcdServer, namespace: str) -> dict[str, str]:
    """Every key under both prefixes, by name."""
    out = {}
    for prefix in (decision_prefix(namespace), bookkeeping_prefix(namespace)):
        out.update({meta["key"].decode()[len(prefix):]: value.decode()
                    for value, meta in raw_client(server).get_prefix(prefix)})
    return out


def raw_revisions(server: EtcdServer, namespace: str) -> dict[str, int]:
    out = {}
    for prefix in (decision_prefix(namespace), bookkeeping_prefix(namespace)):
        out.update({meta["key"].decode()[len(prefix):]: int(meta["mod_revision"])
                    for _, meta in raw_client(server).get_prefix(prefix)})
    return out


def connector(server: EtcdServer, namespace: str, **overrides) -> VirtualConnector:
    cfg = VirtualConnectorConfig(etcd_url=server.url, namespace=namespace, **overrides)
    return VirtualConnector(cfg)


def _writes(txn: dict) -> bool:
    return any("request_put" in op for op in txn.get("success", []))


class FlakyClient:
    """A real etcd3gw client with a hook that runs before each transaction."""

    def __init__(self, inner: Etcd3Client, *, before_txn=None, lose_reply: bool = False):
        self._inner = inner
        self._before_txn = before_txn
        self._lose_reply = lose_reply

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def transaction(self, txn):
        if not _writes(txn):  # the connector's consistent read is a transaction too
            return self._inner.transaction(txn)
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

    # Dynamo's first decision id is 0, and so is ours.
    assert (record.decision_id, record.prefill_replicas, record.decode_replicas, record.done) == (0, 3, 5, False)
    keys = raw_keys(etcd, etcd_namespace)
    assert keys["num_prefill_workers"] == "3"
    assert keys["num_decode_workers"] == "5"
    assert keys["decision_id"] == "0"
    assert json.loads(keys["decided_at_s"]) == {"id": 0, "t_s": T0_S}
    assert json.loads(keys["recent_targets"]) == [{"id": 0, "t_s": T0_S, "prefill": 3, "decode": 5}]
    assert "scaled_decision_id" not in keys  # the environment writes that one
    # Under Dynamo's prefix only Dynamo's three keys, without a lease (they outlive the run).
    dynamo = {meta["key"].decode(): meta.get("lease") for _, meta in
              raw_client(etcd).get_prefix(decision_prefix(etcd_namespace))}
    assert sorted(dynamo) == [decision_prefix(etcd_namespace) + n
                              for n in ("decision_id", "num_decode_workers", "num_prefill_workers")]
    assert all(not lease or lease == "0" for lease in dynamo.values()), dynamo


def test_unchanged_targets_and_apply_false_record_only_the_recommendation(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace)
    conn.apply(decide(2, 4), now_s=T0_S)
    revisions_before = raw_revisions(etcd, etcd_namespace)

    assert conn.apply(decide(2, 4), now_s=T0_S + 60) is None
    assert conn.apply(decide(9, 9, apply=False), now_s=T0_S + 120) is None
    # A held run recommends below its targets (stabilization held it): the recommendation is stored.
    assert conn.apply(decide(2, 4, recommended=(1, 3)), now_s=T0_S + 180) is None

    revisions_after = raw_revisions(etcd, etcd_namespace)
    changed = sorted(k for k in revisions_after if revisions_after[k] != revisions_before[k])
    assert changed == ["recommendations"]  # nothing under the prefix Dynamo's client watches
    keys = raw_keys(etcd, etcd_namespace)
    assert (keys["decision_id"], keys["num_prefill_workers"], keys["num_decode_workers"]) == ("0", "2", "4")
    assert json.loads(keys["recommendations"]) == [
        {"t_s": T0_S, "prefill": 2, "decode": 4},
        {"t_s": T0_S + 60, "prefill": 2, "decode": 4},
        {"t_s": T0_S + 120, "prefill": 9, "decode": 9},
        {"t_s": T0_S + 180, "prefill": 1, "decode": 3},
    ]
    assert len(json.loads(keys["recent_targets"])) == 1  # applied decisions: still only decision 0


def test_recommendation_and_decision_land_in_one_transaction(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace)
    conn.apply(decide(3, 5, recommended=(4, 5)), now_s=T0_S)
    conn.apply(decide(3, 3), now_s=T0_S + 60)
    revisions = raw_revisions(etcd, etcd_namespace)
    # One transaction is one etcd revision: every key written by the second run, under both prefixes, carries it.
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
    revision_before = raw_revisions(etcd, etcd_namespace)

    assert conn.apply(decide(1, 1, apply=False), now_s=T0_S) is None  # the task's retry, same run time

    assert raw_revisions(etcd, etcd_namespace) == revision_before  # no write
    assert connector(etcd, etcd_namespace).read_fleet(now_s=T0_S).recent_targets == ((T0_S, 1, 1),)


def test_concurrent_recording_is_retried_and_nothing_lost(etcd, etcd_namespace):
    other = connector(etcd, etcd_namespace)
    other.apply(decide(2, 2), now_s=T0_S)
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    # Between our read and our write, another run records its recommendation (no new decision).
    flaky = FlakyClient(raw_client(etcd), before_txn=lambda: other.apply(decide(2, 2), now_s=T0_S + 30))
    ours = VirtualConnector(cfg, client=flaky)

    record = ours.apply(decide(3, 3), now_s=T0_S + 31)

    assert record.decision_id == 1
    fleet = connector(etcd, etcd_namespace).read_fleet(now_s=T0_S + 31)
    assert fleet.recent_targets == ((T0_S, 2, 2), (T0_S + 30, 2, 2), (T0_S + 31, 3, 3))


def test_recording_conflicts_beyond_the_retry_budget_raise(etcd, etcd_namespace):
    other = connector(etcd, etcd_namespace)
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace, conflict_retries=1)
    calls = {"n": 0}

    class EveryTxn(FlakyClient):
        def transaction(self, txn):
            if not _writes(txn):
                return self._inner.transaction(txn)
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

    raw_client(etcd).put(key(etcd_namespace, "scaled_decision_id"), "0")

    fleet = conn.read_fleet(now_s=T0_S + 20)
    assert fleet.last_decision.done is True
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (3, 5)

    # Second decision: until confirmed, ready stays at decision 1's targets.
    conn.apply(decide(4, 6), now_s=T0_S + 60)
    fleet = conn.read_fleet(now_s=T0_S + 70)
    assert fleet.last_decision.decision_id == 1
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
    assert record.decision_id == 2


def test_concurrent_planner_cannot_write_the_same_id(etcd, etcd_namespace):
    other = connector(etcd, etcd_namespace)
    other.apply(decide(1, 1), now_s=T0_S)
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    # Between our read and our write, the other planner writes decision 2.
    flaky = FlakyClient(raw_client(etcd), before_txn=lambda: other.apply(decide(5, 5), now_s=T0_S + 30))
    ours = VirtualConnector(cfg, client=flaky)

    with pytest.raises(ConcurrentWriteError, match=r"decision_id is no longer 0 but 1: another planner"):
        ours.apply(decide(2, 2), now_s=T0_S + 31)

    keys = raw_keys(etcd, etcd_namespace)
    assert (keys["decision_id"], keys["num_prefill_workers"], keys["num_decode_workers"]) == ("1", "5", "5")
    # A decision made without a fleet basis: the retry reads afresh and takes the next id.
    assert ours.apply(decide(2, 2), now_s=T0_S + 32).decision_id == 2


def test_a_retry_never_writes_a_decision_made_from_the_old_fleet(etcd, etcd_namespace):
    """The Prefect task retries apply after a conflict: the decision was made from (1, 1), the other
    planner has set (5, 5) since; the retry must not put (2, 2) over it (the flow decides again)."""
    other = connector(etcd, etcd_namespace)
    other.apply(decide(1, 1), now_s=T0_S)
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    flaky = FlakyClient(raw_client(etcd), before_txn=lambda: other.apply(decide(5, 5), now_s=T0_S + 30))
    ours = VirtualConnector(cfg, client=flaky)
    fleet = ours.read_fleet(now_s=T0_S + 31)
    stale = replace(decide(2, 2), based_on=(fleet.prefill.current_replicas, fleet.decode.current_replicas))

    with pytest.raises(ConcurrentWriteError):
        ours.apply(stale, now_s=T0_S + 31)
    with pytest.raises(FleetChangedError, match=r"prefill 1 -> 5, decode 1 -> 5\); the decision \(prefill 2, decode 2\)"):
        ours.apply(stale, now_s=T0_S + 32)  # the task's retry

    keys = raw_keys(etcd, etcd_namespace)
    assert (keys["decision_id"], keys["num_prefill_workers"], keys["num_decode_workers"]) == ("1", "5", "5")
    # Decided again from what is in effect, it is written.
    fresh = ours.read_fleet(now_s=T0_S + 33)
    assert ours.apply(replace(decide(6, 6), based_on=(fresh.prefill.current_replicas,
                                                      fresh.decode.current_replicas)), now_s=T0_S + 33).decision_id == 2


def test_lost_reply_then_retry_neither_skips_nor_reuses_an_id(etcd, etcd_namespace):
    cfg = VirtualConnectorConfig(etcd_url=etcd.url, namespace=etcd_namespace)
    conn = VirtualConnector(cfg, client=FlakyClient(raw_client(etcd), lose_reply=True))
    with pytest.raises(ConnectorUnavailableError):
        conn.apply(decide(2, 3), now_s=T0_S)  # committed, but the reply was lost
    # The task's retry: the write is already there, so nothing is written again.
    assert conn.apply(decide(2, 3), now_s=T0_S + 1) is None
    assert conn.apply(decide(4, 4), now_s=T0_S + 60).decision_id == 1


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
    assert ids == [0, 1, 2, 3]


def test_histories_are_bounded_and_rebuild_the_stabilization_window(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace, history_max_entries=3)
    for n in range(1, 6):
        conn.apply(decide(n, 10 - n), now_s=T0_S + 60 * n)
    fleet = connector(etcd, etcd_namespace).read_fleet(now_s=T0_S + 400)
    # 5 runs, 3 recommendations kept: n = 3, 4, 5.
    assert fleet.recent_targets == ((T0_S + 180, 3, 7), (T0_S + 240, 4, 6), (T0_S + 300, 5, 5))
    assert [e["id"] for e in json.loads(raw_keys(etcd, etcd_namespace)["recent_targets"])] == [2, 3, 4]


def test_recommendations_older_than_max_age_are_dropped(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace, history_max_age_s=120.0)
    for t in (0.0, 60.0, 120.0, 180.0):
        conn.apply(decide(2, 2, apply=False), now_s=T0_S + t)
    # At 180 s the cutoff is 180 - 120 = 60 s: entries at 0 and 60 go (60 is not > 60).
    assert connector(etcd, etcd_namespace).read_fleet(now_s=T0_S + 180).recent_targets == (
        (T0_S + 120, 2, 2), (T0_S + 180, 2, 2))


@pytest.mark.parametrize("keys, message", [
    pytest.param({"num_prefill_workers": "1", "num_decode_workers": "1", "decision_id": "x1"},
                 r"^etcd v1/.*/planner/decision_id: expected a non-negative integer, got 'x1'$", id="id not a number"),
    pytest.param({"num_prefill_workers": "two", "num_decode_workers": "1", "decision_id": "0"},
                 r"^etcd v1/.*/planner/num_prefill_workers: expected a non-negative integer, got 'two'$",
                 id="targets not a number"),
    pytest.param({"num_prefill_workers": "1", "num_decode_workers": "1", "decision_id": "0", "scaled_decision_id": "-3"},
                 r"scaled_decision_id: expected a non-negative integer, got -3", id="ack negative"),
    pytest.param({"num_prefill_workers": "1", "num_decode_workers": "1", "decision_id": "0", "decided_at_s": "12.5"},
                 r"^etcd sla-planner/.*/planner/decided_at_s: expected \{\"id\": n, \"t_s\": seconds\}",
                 id="old decided_at_s format"),
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
        client.put(key(etcd_namespace, name), value)
    with pytest.raises(ConnectorError, match=message) as info:
        connector(etcd, etcd_namespace).validate()
    assert "\n" not in str(info.value)


def test_factory_uses_planner_namespace_when_unset(etcd):
    conn = make_connector(VirtualConnectorConfig(etcd_url=etcd.url), default_namespace="ns-from-planner")
    assert isinstance(conn, VirtualConnector)
    assert conn.prefix == "v1/ns-from-planner/planner/"
    assert conn.bookkeeping_prefix == "sla-planner/ns-from-planner/planner/"


def test_config_rejects_bad_url():
    with pytest.raises(ValueError, match=r"etcd_url must look like http://host:port, got 'etcd:2379'"):
        VirtualConnectorConfig(etcd_url="etcd:2379")


def test_a_keyset_dynamos_planner_wrote_is_read_and_continued(etcd, etcd_namespace):
    # What Dynamo 1.6.1's coordinator leaves: three decimal keys, no bookkeeping; its client acked 1.
    client = raw_client(etcd)
    for name, value in (("num_prefill_workers", "2"), ("num_decode_workers", "3"), ("decision_id", "1"),
                        ("scaled_decision_id", "1")):
        client.put(key(etcd_namespace, name), value)
    conn = connector(etcd, etcd_namespace)
    conn.validate()
    fleet = conn.read_fleet(now_s=T0_S)
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == (2, 3)
    assert (fleet.prefill.ready_replicas, fleet.decode.ready_replicas) == (2, 3)  # acknowledged
    assert fleet.last_decision.decision_id == 1 and fleet.last_decision.done

    record = conn.apply(decide(4, 3), now_s=T0_S + 60)
    assert record.decision_id == 2
    keys = raw_keys(etcd, etcd_namespace)
    assert (keys["decision_id"], keys["num_prefill_workers"], keys["num_decode_workers"]) == ("2", "4", "3")


def test_waiting_for_a_foreign_unacknowledged_decision_is_bounded_from_first_seen(etcd, etcd_namespace):
    client = raw_client(etcd)
    for name, value in (("num_prefill_workers", "2"), ("num_decode_workers", "3"), ("decision_id", "4")):
        client.put(key(etcd_namespace, name), value)
    conn = connector(etcd, etcd_namespace, done_timeout_s=600.0)
    # Never seen before: it counts from now, and the run that acts records when it first saw it.
    assert conn.read_fleet(now_s=T0_S).last_decision.decided_at_s == T0_S
    assert conn.apply(decide(2, 3, apply=False), now_s=T0_S) is None
    assert json.loads(raw_keys(etcd, etcd_namespace)["decided_at_s"]) == {"id": 4, "t_s": T0_S}
    assert conn.last_decision_done(now_s=T0_S + 599) is False
    assert conn.last_decision_done(now_s=T0_S + 600) is True


def test_new_ids_exceed_the_environments_acknowledged_id(etcd, etcd_namespace):
    # A client acknowledged 7 (a Dynamo planner before a restart had counted that far); the stored id is 2.
    client = raw_client(etcd)
    for name, value in (("num_prefill_workers", "1"), ("num_decode_workers", "1"), ("decision_id", "2"),
                        ("scaled_decision_id", "7")):
        client.put(key(etcd_namespace, name), value)
    record = connector(etcd, etcd_namespace).apply(decide(2, 2), now_s=T0_S)
    assert record.decision_id == 8
    assert raw_keys(etcd, etcd_namespace)["decision_id"] == "8"


def test_dynamo_reads_absent_keys_as_minus_one_and_so_do_we(etcd, etcd_namespace):
    client = raw_client(etcd)
    for name, value in (("num_prefill_workers", "1"), ("num_decode_workers", "1"), ("decision_id", "0"),
                        ("scaled_decision_id", "-1"), ("some_unknown_key", "hello")):
        client.put(key(etcd_namespace, name), value)
    fleet = connector(etcd, etcd_namespace).read_fleet(now_s=T0_S)
    assert fleet.last_decision.decision_id == 0 and not fleet.last_decision.done


def test_the_documented_prefix_stays_an_option(etcd, etcd_namespace):
    conn = connector(etcd, etcd_namespace, key_prefix="/{namespace}/planner/",
                     bookkeeping_prefix="/{namespace}/planner/")
    conn.apply(decide(2, 5), now_s=T0_S)
    stored = {meta["key"].decode(): value.decode()
              for value, meta in raw_client(etcd).get_prefix(f"/{etcd_namespace}/planner/")}
    assert stored[f"/{etcd_namespace}/planner/num_decode_workers"] == "5"
    assert f"/{etcd_namespace}/planner/recommendations" in stored
    raw_client(etcd).put(f"/{etcd_namespace}/planner/scaled_decision_id", "0")
    assert conn.last_decision_done(now_s=T0_S + 1) is True
    assert not raw_keys(etcd, etcd_namespace)  # nothing under the default prefixes


@pytest.mark.parametrize("field, value, message", [
    ("key_prefix", "v1/{ns}/planner/", r"only \{namespace\} may be filled in"),
    ("key_prefix", "v1/{namespace}/planner", r"must end with '/'"),
    ("bookkeeping_prefix", "v1/{namespace}/planner/x/", r"nest: use the same prefix or two apart"),
])
def test_config_rejects_bad_prefixes(field, value, message):
    with pytest.raises(ValueError, match=message):
        VirtualConnectorConfig(**{field: value})
