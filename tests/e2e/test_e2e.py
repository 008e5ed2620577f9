"""End to end: the product as a user runs it, on a real local stack.

`sla-planner stack up` starts a Prefect server, a process worker running the
prefect.yaml deployments, Prometheus, etcd, the routing service and the
simulated fleet replaying real Azure conversation requests through a clear
rise and fall: 30 s as recorded (~5 req/s), 60 s with five copies of the next
window superposed (~27 req/s), 105 s as recorded. The planner runs every 15 s
(wall clock), new workers serve 10 s after they are added and scale-down waits
30 s of stabilization. The simulated engines run 20% slower than profiled (the drift
the planner's correction factors and the retrained predictor exist for; with
engines exactly as profiled the profile estimate is already right and the
retrain gate rightly refuses every candidate). The retrain flow runs every
45 s: it skips until the router holds enough samples (after the rise), then
publishes a model the router routes the tail with. Everything is asserted through the components' own APIs.
"""

from __future__ import annotations

import contextlib

import pytest

from planner_cli import stack as stack_cli
from tests.support.fixtures_stack import assert_rise_and_fall, local_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL_S = 15.0
LOW_S, HIGH_S, TAIL_S = 30.0, 60.0, 105.0
SHAPE = ((LOW_S, 1.0), (HIGH_S, 5.0), (TAIL_S, 1.0))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The stack through the whole trace, then a snapshot of what every component recorded."""
    with local_stack(
        tmp_path_factory.mktemp("e2e"), interval_s=INTERVAL_S, shape=SHAPE, trace_start_s=600.0,
        startup_s=10.0, stabilization_s=30.0, retrain_interval_s=45.0,
        prefill_latency_scale=1.2, decode_latency_scale=1.2,
    ) as stack:
        fleet = stack.wait_for(lambda: (f := stack.fleet())["finished"] and f, timeout_s=LOW_S + HIGH_S + TAIL_S + 120,
                               what="the fleet to replay and finish every request")
        rise_start_s = fleet["started_unix_s"] + LOW_S
        fall_s = rise_start_s + HIGH_S

        def scaled_down():
            ds = stack.decisions()
            peak = max((d.prefill + d.decode for d in ds), default=0)
            return any(d.decided_at_s > fall_s and d.prefill + d.decode < peak for d in ds)

        stack.wait_for(scaled_down, timeout_s=120, what="a scale-down after the load fell")
        # The newest decision carried out, and a completed run after it, so every run we read is settled.
        stack.wait_for(lambda: stack.fleet()["decisions"]["confirmed"] == stack.fleet()["decisions"]["applied"],
                       timeout_s=60, what="the fleet to confirm the newest decision")
        # Give a retrain run that is training right now the time to publish (asserted below).
        with contextlib.suppress(AssertionError):
            stack.wait_for(lambda: stack.router("GET", "/v1/models")["active"], timeout_s=60,
                           what="a published model")
        # Prometheus scrapes every 2 s: wait until a scrape after the last request
        # has the final counts, so the comparison below is not a race with the scraper.
        total = fleet["trace"]["requests"]

        def scraped(query: str):
            result = stack.prom(query)
            return result if result and float(result[0]["value"][1]) >= total else None

        with contextlib.suppress(AssertionError):
            stack.wait_for(lambda: scraped("sum(dynamo_frontend_requests_started_total)"), timeout_s=30,
                           what="Prometheus to scrape the final request count")
            stack.wait_for(lambda: scraped("sum(sla_sim_requests_completed_total)"), timeout_s=30,
                           what="Prometheus to scrape the final completion count")
        snap = {
            "fleet": stack.fleet(),
            "decisions": stack.decisions(),
            "confirmations": stack.confirmations(),
            "runs": stack.flow_runs("planner"),
            "rise_start_s": rise_start_s,
            "fall_s": fall_s,
            "requests_total": stack.prom("sum(dynamo_frontend_requests_started_total)"),
            "completed_total": stack.prom("sum(sla_sim_requests_completed_total)"),
        }
        snap["artifacts"] = {r["id"]: stack.artifacts(r["id"]) for r in snap["runs"] if r["state_type"] == "COMPLETED"}
        snap["decision_of_run"] = {rid: stack.applied_decision_id(rid) for rid in snap["artifacts"]}
        snap["retrain"] = _retrain_snapshot(stack)
        snap["status"] = stack_cli.status(stack.state_dir)
        snap["diagnostics"] = stack.diagnostics()
        yield snap


def _retrain_snapshot(stack) -> dict:
    """The retrain deployment's runs and what the router serves (empty when not deployed)."""
    # Models first, then runs and cards: a run writes its card before it publishes, so every
    # version read here has its card by the time the cards are read (a run still running included).
    models = stack.router("GET", "/v1/models")
    try:
        runs = stack.flow_runs("retrain")
    except Exception as exc:  # noqa: BLE001 - reported by the retrain test
        return {"error": f"{type(exc).__name__}: {exc}"}
    cards = {r["id"]: [a.get("data") or "" for a in stack.artifacts(r["id"])] for r in runs}
    return {"runs": runs, "cards": cards, "models": models, "fleet_router": stack.fleet().get("router")}


def test_scheduled_planner_runs_completed(run):
    runs = run["runs"]
    failed = [(r["name"], r["state"]["message"]) for r in runs if r["state_type"] in ("FAILED", "CRASHED")]
    assert not failed, f"planner runs failed: {failed}{run['diagnostics']}"
    done = [r for r in runs if r["state_type"] == "COMPLETED"]
    # 180 s of trace at one run per 15 s: at least half of them done even on a loaded machine.
    assert len(done) >= 6, f"only {len(done)} completed planner runs: {[r['state_type'] for r in runs]}"
    assert all(r["auto_scheduled"] for r in done), "runs must come from the deployment's schedule"


def test_scaled_up_during_the_rise_and_down_after_it(run):
    # A planner run needs one interval of the new load in Prometheus and some seconds to run.
    assert_rise_and_fall(run["decisions"], rise_s=run["rise_start_s"], fall_s=run["fall_s"], interval_s=INTERVAL_S,
                         diagnostics=run["diagnostics"])


def test_every_run_has_its_decision_artifacts(run):
    for run_id, artifacts in run["artifacts"].items():
        keys = {a["key"] for a in artifacts}
        assert {"sla-planner-decision-dynamo", "sla-planner-summary-dynamo"} <= keys, (run_id, keys)


def test_decision_ids_consecutive_acknowledged_and_each_from_one_run(run):
    ds = run["decisions"]
    ids = [d.decision_id for d in ds]
    assert ids == list(range(len(ids))), f"decision ids not consecutive from 0 (Dynamo's first id): {ids}"
    confirmations = run["confirmations"]
    for d in ds:
        later = [v for rev, v in confirmations if rev > d.revision and v >= d.decision_id]
        assert later, f"decision {d.decision_id} (revision {d.revision}) never confirmed: {confirmations}"
    assert confirmations[-1][1] == ids[-1]
    written = sorted(i for i in run["decision_of_run"].values() if i is not None)
    assert written == ids, f"decisions named by run artifacts {written} != decisions in etcd {ids}"
    # The fleet followed the same decisions, in order, and says it carried each out.
    log = run["fleet"]["decisions"]["log"]
    assert [e["decision_id"] for e in log] == ids
    assert all(e["confirmed_unix_s"] is not None for e in log), log


def test_no_request_was_lost(run):
    fleet = run["fleet"]
    total = fleet["trace"]["requests"]
    assert fleet["arrived"] == fleet["completed"] == total, fleet
    assert fleet["in_flight"] == 0
    # Prometheus scraped the same counts the planner read.
    assert float(run["requests_total"][0]["value"][1]) == total, run["requests_total"]
    assert float(run["completed_total"][0]["value"][1]) == total, run["completed_total"]
    router = fleet["router"]
    assert router["routed"] + sum(router["fallbacks"].values()) == total, router
    assert router["routed"] >= 0.99 * total, f"the routing service routed too few requests: {router}"


def test_retrain_published_a_model_the_router_served(run):
    retrain = run["retrain"]
    assert "error" not in retrain, (
        f"no retrain deployment in the stack ({retrain.get('error')}): prefect.yaml needs a `retrain` deployment "
        f"of flows/retrain.py")
    done = [r for r in retrain["runs"] if r["state_type"] == "COMPLETED"]
    assert done, f"no completed retrain run: {[(r['name'], r['state_type']) for r in retrain['runs']]}"
    published = [v["version"] for v in retrain["models"]["versions"]]
    assert retrain["models"]["active"] in published, f"the router serves no published model: {retrain['models']}"
    cards = [c for run_cards in retrain["cards"].values() for c in run_cards]
    from_retrain = [v for v in published if any(v in c for c in cards)]
    assert from_retrain == published, f"versions {published} not all named by a retrain model card"
    # Later runs may publish again after the trace's last request; the first one routed the tail.
    served = {v: retrain["fleet_router"]["model_versions"].get(v, 0) for v in published}
    assert any(n > 0 for n in served.values()), f"no request was routed with a published model: {served}"


def test_every_component_answered_while_running(run):
    down = [r for r in run["status"] if not r["healthy"]]
    assert not down, f"components not answering: {down}{run['diagnostics']}"
