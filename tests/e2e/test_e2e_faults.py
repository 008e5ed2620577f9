"""Faults during a live run of the whole stack: Prometheus down, etcd restarted,
the routing service restarted, the planner's worker killed mid-run.

One stack serves the four tests (in file order: those that need traffic first), replaying real Azure requests
as a square wave (40 s as recorded, 40 s with five copies superposed, six
times), so the planner keeps deciding: every fault lands on a fleet that is
scaling. The engines run 20% slower than profiled, so the retrain flow has
something to learn and publishes (see test_e2e). After each fault the test checks what a user would: the planner held
and said why, then resumed; no decision id was lost, reused or left
unconfirmed; the fleet lost no request.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime

import pytest

from planner_cli import stack as stack_cli
from planner_cli import stack_processes
from tests.support.fixtures_stack import RunningStack, local_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL_S = 15.0
SHAPE = ((40.0, 1.0), (40.0, 5.0)) * 6


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with local_stack(
        tmp_path_factory.mktemp("faults"), interval_s=INTERVAL_S, shape=SHAPE, trace_start_s=600.0,
        startup_s=10.0, stabilization_s=30.0, prefill_latency_scale=1.2, decode_latency_scale=1.2,
    ) as s:
        s.wait_for(lambda: any(r["state_type"] == "COMPLETED" for r in s.flow_runs()), timeout_s=120,
                   what="a first completed planner run")
        yield s


def _unix(ts: str | None) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() if ts else float("nan")


def _assert_decisions_consistent(stack: RunningStack) -> None:
    """Ids 1..N in etcd, each confirmed by the fleet, each written by exactly one completed run."""
    ds = stack.decisions()
    ids = [d.decision_id for d in ds]
    assert ids == list(range(len(ids))), f"decision ids not consecutive from 0: {ids}"
    confirmations = stack.confirmations()
    for d in ds[:-1]:
        assert any(rev > d.revision and v >= d.decision_id for rev, v in confirmations), (
            f"decision {d.decision_id} never confirmed: {confirmations}")
    from_runs = [stack.applied_decision_id(r["id"]) for r in stack.runs_in("COMPLETED")]
    from_runs = sorted(i for i in from_runs if i is not None)
    assert len(from_runs) == len(set(from_runs)), f"a decision id was written by two runs: {from_runs}"
    assert set(from_runs) <= set(ids), f"runs name decisions etcd does not hold: {from_runs} vs {ids}"
    # Read after etcd's ids: a decision written in between may already be in the fleet's log.
    log_ids = [e["decision_id"] for e in stack.fleet()["decisions"]["log"]]
    assert log_ids[: len(ids)] == ids[: len(log_ids)] and len(log_ids) >= len(ids) - 1, (log_ids, ids)


def _wait_new_confirmed_decision(stack: RunningStack, *, after_s: float, timeout_s: float, what: str):
    def found():
        fleet = stack.fleet()["decisions"]
        new = [d for d in stack.decisions() if d.decided_at_s > after_s]
        return new and fleet["confirmed"] is not None and fleet["confirmed"] >= new[0].decision_id and new
    return stack.wait_for(found, timeout_s=timeout_s, what=what)


def test_prometheus_down_two_intervals_planner_holds_says_why_then_resumes(stack):
    stack.wait_for(lambda: stack.fleet()["decisions"]["confirmed"], timeout_s=150,
                   what="a first confirmed decision before the outage")
    stopped_s = time.time()
    stack.stop("prometheus")
    time.sleep(2 * INTERVAL_S)
    stack.start("prometheus")
    restarted_s = time.time()

    def failed_saying_why():
        runs = [r for r in stack.runs_in("FAILED") if _unix(r["start_time"]) >= stopped_s - INTERVAL_S]
        return [r for r in runs if stack.urls["prometheus"] in (r["state"]["message"] or "")]
    failed = stack.wait_for(failed_saying_why, timeout_s=90,
                            what="a planner run that failed naming the unreachable Prometheus")
    assert "Prometheus" in failed[0]["state"]["message"], failed[0]["state"]["message"]
    # A run that read metrics just before the stop may still apply; none decided later during the outage.
    during = [d for d in stack.decisions() if stopped_s + 5 < d.decided_at_s < restarted_s]
    assert not during, f"decisions written while Prometheus was down: {during}"
    assert not [r for r in failed if stack.decision_table(r["id"])], "a failed run left a decision artifact"

    _wait_new_confirmed_decision(stack, after_s=restarted_s, timeout_s=180,
                                 what="a confirmed decision after Prometheus came back")
    resumed = [r for r in stack.runs_in("COMPLETED") if _unix(r["start_time"]) > restarted_s]
    assert resumed, "no planner run completed after Prometheus came back"
    _assert_decisions_consistent(stack)


def test_etcd_restart_loses_or_duplicates_no_decision(stack):
    before = stack.decisions()
    stopped_s = time.time()
    stack.stop("etcd")
    time.sleep(5.0)
    stack.start("etcd")
    restarted_s = time.time()
    # What was written before the restart is still there, unchanged.
    after_restart = stack.decisions()
    assert after_restart[: len(before)] == before
    _wait_new_confirmed_decision(stack, after_s=restarted_s, timeout_s=180,
                                 what="a confirmed decision after etcd restarted")
    for r in stack.runs_in("FAILED", "CRASHED"):
        if _unix(r["start_time"]) >= stopped_s - INTERVAL_S:
            message = r["state"]["message"] or ""
            assert "etcd" in message or "Prometheus" in message, f"run failed without naming etcd: {message}"
    fleet = stack.fleet()["decisions"]
    assert fleet["etcd_errors"] > 0, "the fleet should have seen etcd go away"
    _assert_decisions_consistent(stack)


def test_router_restart_keeps_serving_the_published_model_and_the_samples(stack):
    version = _publish_model(stack)
    stack.wait_for(lambda: stack.fleet()["router"]["model_versions"].get(version, 0) > 0, timeout_s=30,
                   what=f"requests routed with model {version}")
    samples_before = stack.router("GET", "/v1/samples?limit=1", admin=True)["stats"]
    assert samples_before["stored"] > 0, samples_before
    stack.stop("router")
    time.sleep(3.0)
    fallbacks_down = sum(stack.fleet()["router"]["fallbacks"].values())
    stack.start("router")
    assert stack.router("GET", "/v1/models")["active"] == version, "the restarted router lost the published model"
    # The training samples persist too (samples.path in the stack's state folder).
    samples_after = stack.router("GET", "/v1/samples?limit=1", admin=True)["stats"]
    assert samples_after["last_seq"] >= samples_before["last_seq"], (samples_before, samples_after)
    assert samples_after["stored"] >= samples_before["stored"], (samples_before, samples_after)
    served_at_restart = stack.fleet()["router"]["model_versions"].get(version, 0)
    stack.wait_for(lambda: stack.fleet()["router"]["model_versions"].get(version, 0) > served_at_restart + 20,
                   timeout_s=60, what=f"requests routed with model {version} after the restart")
    assert fallbacks_down > 0, "requests arriving while the router was down should have been routed locally"
    registered = {e["id"] for e in stack.router("GET", "/v1/endpoints")}
    fleet = stack.fleet()
    ready = fleet["workers"]["prefill"]["ready"] + fleet["workers"]["decode"]["ready"]
    assert len(registered) == ready, (registered, fleet["workers"])


def test_worker_killed_mid_run_next_scheduled_run_is_correct(stack):
    def running():
        return [r for r in stack.runs_in("RUNNING")]
    victim = stack.wait_for(running, timeout_s=120, what="a planner run in progress", poll_s=0.2)[0]
    killed_s = time.time()
    # The machine running the worker dies: the worker and the flow run it started go together.
    flow_run_pids = [p for p in stack_processes.marked_processes(stack.state["marker"])
                     if f"PREFECT__FLOW_RUN_ID={victim['id']}".encode() in stack_processes._environ(p)]
    stack.stop("prefect-worker", sig=signal.SIGKILL, grace_s=0.0)
    for pid in flow_run_pids:
        stack_processes._signal_pid(pid, signal.SIGKILL)
    stack.start("prefect-worker")

    def completed_after_kill():
        return [r for r in stack.runs_in("COMPLETED") if _unix(r["start_time"]) > killed_s]
    # The killed run holds the deployment's single concurrency slot until its lease lapses
    # (the flow engine renews it for SLOT_LEASE_S); meanwhile scheduled runs wait, and the
    # planner holds at the last decision it applied.
    nxt = stack.wait_for(completed_after_kill, timeout_s=stack_cli.SLOT_LEASE_S + 150,
                         what="a scheduled planner run completed after the worker was killed", poll_s=3.0)[0]
    assert nxt["auto_scheduled"]
    table = stack.decision_table(nxt["id"])
    assert table is not None, "the run after the kill has no decision artifact"
    # It started from the fleet etcd held (stateless runs rebuild everything).
    known = [d for d in stack.decisions() if d.decided_at_s < _unix(nxt["start_time"])]
    if known:
        current_prefill = int(table["prefill replicas"].split("→")[0])
        current_decode = int(table["decode replicas"].split("→")[0])
        assert (current_prefill, current_decode) == (known[-1].prefill, known[-1].decode), (table, known[-1])
    # The zombie automation marks it Crashed, but Prefect may hold its Running event up to
    # 15 minutes first (see planner_cli.stack._create_zombie_automation): no wait for that here.
    victim_state = stack.prefect("GET", f"/flow_runs/{victim['id']}")
    assert victim_state["state_type"] in ("RUNNING", "CRASHED"), (
        f"the killed run {victim['name']} is {victim_state['state_type']}")
    if stack.decision_table(victim["id"]) is not None:
        # The kill landed after the run published its artifacts, which follow applying the decision (seen once in
        # CI): then the decision the artifact names must be the one etcd holds, never a half-applied one.
        applied = stack.applied_decision_id(victim["id"])
        assert applied is None or applied in {d.decision_id for d in stack.decisions()}, (
            f"the killed run's artifact names decision {applied}, which etcd does not hold")
    _assert_decisions_consistent(stack)


def test_no_request_lost_through_the_faults(stack):
    fleet = stack.wait_for(lambda: (f := stack.fleet())["finished"] and f, timeout_s=sum(d for d, _ in SHAPE) + 120,
                           what="the fleet to finish the trace")
    total = fleet["trace"]["requests"]
    assert fleet["arrived"] == fleet["completed"] == total, fleet
    counted = stack.prom("sum(dynamo_frontend_requests_started_total)")
    assert float(counted[0]["value"][1]) == total, counted
    _assert_decisions_consistent(stack)


def _publish_model(stack: RunningStack) -> str:
    """A model the router serves: the retrain flow's when it is deployed, else a trained one published directly."""
    try:
        retrain_id = stack.deployment_id("retrain")
    except Exception:  # noqa: BLE001 - no retrain deployment yet
        retrain_id = None
    if retrain_id is not None:
        # The samples so far may be too few for the default minimums (the test is about the restart, not the
        # gate): smaller minimums, and another run while the last one skipped or refused, as the schedule would.
        params = {"training": {"min_train_samples": 300, "min_holdout_samples": 60}}
        outcomes = []
        deadline = time.time() + 300.0
        while time.time() < deadline:
            started = stack.prefect("POST", f"/deployments/{retrain_id}/create_flow_run",
                                    {"parameters": params, "idempotency_key": f"faults-retrain-{len(outcomes)}"})
            run = stack.wait_for(lambda: (r := stack.prefect("GET", f"/flow_runs/{started['id']}"))["state_type"]
                                 in ("COMPLETED", "FAILED", "CRASHED") and r,
                                 timeout_s=240, what="the retrain run to finish")
            assert run["state_type"] == "COMPLETED", f"retrain run {run['name']}: {run['state']['message']}"
            active = stack.router("GET", "/v1/models")["active"]
            if active:
                return active
            outcomes.append(_card_verdict(stack, started["id"]))
            time.sleep(10.0)
        raise AssertionError(f"no retrain run published a model; their model cards said: {outcomes}")
    from tests.support.fixtures_routing import trained_document

    version = f"faults-{int(time.time())}"
    stack.router("POST", "/v1/models", trained_document(version), admin=True)
    return version


def _card_verdict(stack: RunningStack, flow_run_id: str) -> str:
    """The decision line of a retrain run's model card (why it did not publish)."""
    for artifact in stack.artifacts(flow_run_id):
        for line in (artifact.get("data") or "").splitlines():
            if line.startswith("**Decision**"):
                return line.strip()
    return "(no model card verdict found)"
