"""End to end with real Dynamo 1.6.1 in the loop: the planner scales a live frontend and mocker fleet.

`sla-planner stack up --fleet dynamo` starts the Prefect server and worker with
the planner deployment, etcd, Prometheus, the routing service, Dynamo's own
frontend, the fleet executor (Dynamo's VirtualConnectorClient, mocker workers
timed from the H200 profile at real speed) and the load generator replaying
real Azure conversation requests over HTTP through a clear rise and fall: 30 s
as recorded (~2 req/s at that offset), 60 s with three copies of the next
window superposed (~14 req/s; independent tenants, copies shifted by up to
±30 s), then the recorded rate again. Every prompt is its own (no shared
prefix, so the mocker's prefix cache saves no prefill), and at most 6 workers
per pool run, each a mocker process on this 2-core machine. The planner runs
every 15 s and decides from the frontend's real metrics; scale-down waits 30 s
of stabilization. Everything is asserted through the Prefect API, etcd, the
frontend's own metrics, Dynamo's discovery and the load generator's records.

Then one fault: a decode worker is SIGKILLed under load. Its in-flight requests
fail (the frontend's error count rises), its metrics vanish from Prometheus,
the planner does not scale on the missing data, and the executor restores the
decided count.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from executor.workers import worker_tmp_dir
from planner_cli import stack as stack_cli
from tests.support.fixtures_dynamo import dynamo_python, free_port_ranges  # noqa: F401
from tests.support.fixtures_net import free_port
from tests.support.fixtures_stack import FleetRecords, assert_rise_and_fall, local_stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL_S = 15.0
# The tail outlasts the scale-down the run fixture waits for (up to ~160 s after the fall) by over a minute,
# so the fault test still finds a decode worker holding requests on a busy machine (CI 2026-11-28: with a
# 165 s tail the settle wait outlived the load once).
LOW_S, HIGH_S, TAIL_S = 30.0, 60.0, 240.0
SHAPE = ((LOW_S, 1.0), (HIGH_S, 3.0), (TAIL_S, 1.0))
COUNT_SCRIPT = """
import asyncio, json, sys
from dynamo._core import DistributedRuntime
async def main(endpoints):
    rt = DistributedRuntime(asyncio.get_running_loop(), "etcd", "tcp", event_plane="zmq")
    out = {}
    for ep in endpoints:
        client = await rt.endpoint(ep).client()
        await asyncio.sleep(0.5)
        out[ep] = len(client.instance_ids())
    print(json.dumps(out), flush=True)
    rt.shutdown()
asyncio.run(main(sys.argv[1:]))
"""


def registered_in_dynamo(python: Path, etcd_url: str, namespace: str) -> dict[str, int]:
    """Instances per role as Dynamo's own discovery lists them (how its virtual connector counts)."""
    endpoints = {"prefill": f"{namespace}.prefill.generate", "decode": f"{namespace}.backend.generate"}
    done = subprocess.run([str(python), "-c", COUNT_SCRIPT, *endpoints.values()], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "ETCD_ENDPOINTS": etcd_url}, stdin=subprocess.DEVNULL)
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    return {role: counts[ep] for role, ep in endpoints.items()}


class DynamoStack(FleetRecords):
    """What the tests read beyond RunningStack: the executor's and the load generator's records."""

    def workers(self) -> list[dict]:
        return json.loads((self.dir / "executor" / "workers.json").read_text())

    def registered(self) -> dict[str, int]:
        python = Path(self.stack.state["components"]["executor"]["argv"][0])  # the Dynamo environment's
        return registered_in_dynamo(python, self.stack.urls["etcd"], self.stack.namespace)

    def prom_value(self, promql: str) -> float | None:
        result = self.stack.prom(promql)
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def dyn(tmp_path_factory, dynamo_python):  # noqa: F811
    [worker_base] = free_port_ranges(1, width=200)
    with local_stack(
        tmp_path_factory.mktemp("e2e-dynamo"), fleet="dynamo", frontend_port=free_port(),
        worker_port_base=worker_base, interval_s=INTERVAL_S, shape=SHAPE, trace_start_s=600.0,
        stabilization_s=30.0, retrain_interval_s=3600.0,
    ) as stack:
        yield DynamoStack(stack)


@pytest.fixture(scope="module")
def run(dyn):
    """The rise and fall, then a snapshot of what every component recorded."""
    stack = dyn.stack
    started = stack.wait_for(lambda: dyn.loadgen().get("started_unix_s"), timeout_s=60, what="the load to start")
    rise_s, fall_s = started + LOW_S, started + LOW_S + HIGH_S

    def scaled_down():
        ds = stack.decisions()
        peak = max((d.prefill + d.decode for d in ds), default=0)
        return any(d.decided_at_s > fall_s and d.prefill + d.decode < peak for d in ds)

    # Until the tail has run out and a few runs have seen it: a scale-down the planner makes a little before the
    # fall (it over-shot the rise) leaves the next one to the forecast's p90 band, which narrows only as the
    # tail's intervals come in (CI 2026-11-25: decode 4 -> 3 eight seconds before the fall, 3 -> 2 recommended
    # 126 s after it and held 30 s more by the stabilization window, past the former 240 s wait).
    stack.wait_for(scaled_down, timeout_s=LOW_S + HIGH_S + TAIL_S + 4 * INTERVAL_S,
                   what="a scale-down after the load fell")
    # Runs complete a little after they decide, later still on a busy machine: the snapshot waits for
    # five (CI 2026-11-26: the scale-down came early and the snapshot held 4 completed runs).
    stack.wait_for(lambda: len(stack.runs_in("COMPLETED")) >= 5, timeout_s=8 * INTERVAL_S,
                   what="five completed planner runs")
    newest = stack.decisions()[-1]
    stack.wait_for(lambda: any(e["decision_id"] == newest.decision_id for e in dyn.events("ack")),
                   timeout_s=120, what=f"the executor to carry out decision {newest.decision_id}")
    snap = {
        "rise_s": rise_s, "fall_s": fall_s, "decisions": stack.decisions(), "confirmations": stack.confirmations(),
        "acks": dyn.events("ack"), "drains": dyn.events("drain"), "requests": dyn.requests(),
        "registered": dyn.registered(),
        "runs": stack.flow_runs("planner"), "diagnostics": stack.diagnostics(),
    }
    snap["artifacts"] = {r["id"]: stack.artifacts(r["id"]) for r in snap["runs"] if r["state_type"] == "COMPLETED"}
    return snap


def test_scheduled_planner_runs_completed_with_artifacts(run):
    runs = run["runs"]
    failed = [(r["name"], r["state"]["message"]) for r in runs if r["state_type"] in ("FAILED", "CRASHED")]
    assert not failed, f"planner runs failed: {failed}{run['diagnostics']}"
    assert len(run["artifacts"]) >= 5, f"only {len(run['artifacts'])} completed planner runs"
    for run_id, artifacts in run["artifacts"].items():
        keys = {a["key"] for a in artifacts}
        assert {"sla-planner-decision-dynamo", "sla-planner-summary-dynamo"} <= keys, (run_id, keys)


def test_scaled_up_during_the_rise_and_down_after_it(run):
    assert_rise_and_fall(run["decisions"], rise_s=run["rise_s"], fall_s=run["fall_s"], interval_s=INTERVAL_S,
                         diagnostics=run["diagnostics"])


def test_every_decision_acknowledged_once_with_the_workers_registered(run):
    ds = run["decisions"]
    ids = [d.decision_id for d in ds]
    assert ids == sorted(set(ids)), f"decision ids not increasing: {ids}"
    acked = [a["decision_id"] for a in run["acks"]]
    assert acked == ids, f"executor acks {acked} != decisions {ids}"
    confirmed = [v for _, v in run["confirmations"]]
    assert confirmed == ids, f"scaled_decision_id history {confirmed} != decisions {ids}"
    for d, ack in zip(ds, run["acks"]):
        # Dynamo's discovery listed exactly the decided workers when the executor acknowledged.
        assert ack["registered"] == {"prefill": d.prefill, "decode": d.decode}, (d, ack)
    last = ds[-1]
    assert run["registered"] == {"prefill": last.prefill, "decode": last.decode}, run["registered"]


def test_no_request_failed_while_scaling_down(run):
    assert run["drains"], "no worker was drained"
    failed = [r for r in run["requests"] if not r["ok"]]
    assert not failed, f"{len(failed)} requests failed: {failed[:5]}"
    assert len(run["requests"]) > 1000


def test_killed_worker_is_restored_and_the_planner_does_not_scale_on_the_missing_data(run, dyn):
    stack = dyn.stack
    errors_before = dyn.prom_value('sum(dynamo_frontend_requests_total{status!="success"})') or 0.0
    # The victim: the decode worker holding the most requests (the tail runs at the recorded rate).
    base = stack.state["options"]["worker_port_base"] + 100

    def busiest():
        rows = stack.prom('max by (instance) ({__name__=~"vllm[:_]num_requests_running",role="decode"})')
        rows = [r for r in rows if float(r["value"][1]) > 0]
        return max(rows, key=lambda r: float(r["value"][1]))["metric"]["instance"] if rows else None

    def settled():
        """The busiest decode worker, once the newest decision is carried out (acked, registered as
        decided, its drains over): a kill during a scale-down's drain leaves one worker with the load,
        and the guardrail rightly scales up on that (seen in CI)."""
        if dyn.loadgen().get("done"):
            raise AssertionError("the load generator finished before the fleet settled: no load left to fault")
        ds = stack.decisions()
        newest = ds[-1]
        if not any(e["decision_id"] == newest.decision_id for e in dyn.events("ack")):
            return None
        live = [w for w in dyn.workers() if w["role"] == "decode"]
        if dyn.registered()["decode"] != newest.decode or len(live) != newest.decode:
            return None
        instance = busiest()
        return instance and (ds, live, instance)

    before, decode, instance = stack.wait_for(settled, timeout_s=90,
                                              what="a settled fleet with a decode worker holding requests")
    victim = next(w for w in decode if base + w["slot"] == int(instance.rsplit(":", 1)[1]))
    killed_at = time.time()
    os.kill(victim["pid"], signal.SIGKILL)
    stack.wait_for(lambda: (dyn.prom_value('sum(dynamo_frontend_requests_total{status!="success"})') or 0)
                   > errors_before, timeout_s=60, what="the frontend's error count to rise")
    stack.wait_for(lambda: any(w["role"] == "decode" and w["slot"] == victim["slot"] and w["pid"] != victim["pid"]
                               for w in dyn.workers()), timeout_s=60, what="the executor to restart the worker")
    # Restored to the decided count: the newest decision's, which may since have moved on the frontend's load
    # forecast (CI 2026-11-28: decode 2 -> 3 from SLA sizing 24 s after the kill; checked below that it did).
    restored = stack.wait_for(
        lambda: (r := dyn.registered())["decode"] == stack.decisions()[-1].decode and r,
        timeout_s=60, what="the decode count restored to the decided one in Dynamo's discovery")
    assert restored["decode"] == stack.decisions()[-1].decode
    # Each worker's TMPDIR is its own (the mocker converts the profile there); the victim's went with it.
    tmp = dyn.dir / "executor" / "tmp"

    def tmp_of(w):
        return worker_tmp_dir(dyn.dir / "executor", w["role"], w["slot"], w["started_at_s"])

    stack.wait_for(lambda: not tmp_of(victim).exists(), timeout_s=30, what="the killed worker's TMPDIR removed")
    stack.wait_for(lambda: all(any(tmp_of(w).glob("mocker_perf_data_*")) for w in dyn.workers()), timeout_s=30,
                   what=f"each worker's converted profile in its own TMPDIR ({sorted(tmp.iterdir())})")
    # Two planner intervals after the kill: no decision moved on the missing worker's data. The guardrail is
    # the one step that reads the workers (it freezes a pool with fewer reporting than ready, and never lets
    # absent data shrink it); a change may only come from SLA sizing on the frontend's load forecast, which
    # the kill does not hide (CI 2026-11-26, three times: decode 2 -> 3 from the p90 band five 15 s intervals
    # ahead in the tail, once with the guardrail frozen, once with it steady, the scrape before the kill).
    time.sleep(2 * INTERVAL_S + 5)
    after = [d for d in stack.decisions() if d.decided_at_s > killed_at]
    moved = [d for d in after if (d.prefill, d.decode) != (before[-1].prefill, before[-1].decode)]
    for d in moved:
        def written_by(decision_id=d.decision_id):
            """The decision table of the completed run that wrote the decision (None until it completes)."""
            return next((stack.decision_table(r["id"]) for r in stack.runs_in("COMPLETED")
                         if stack.applied_decision_id(r["id"]) == decision_id), None)

        table = stack.wait_for(written_by, timeout_s=60, what=f"the run that wrote decision {d.decision_id}")
        assert "reason sla_sizing" in table, (before[-1], d, table)
        assert "reason saturation_scale_up" not in table, (before[-1], d, table)
    # What failed: the victim's in-flight streams, then requests the frontend still routed to it until
    # its discovery entry expired with its lease (an HTTP 503); none later.
    failed = [r for r in dyn.requests() if not r["ok"]]
    assert failed, "the kill failed no request: was the victim idle?"
    last_s = max(r["sent_unix_s"] for r in failed) - killed_at
    assert last_s < 45, f"requests still failing {last_s:.1f} s after the kill: {failed[-3:]}"
    statuses = {r["name"]: r["healthy"] for r in stack_cli.status(stack.state_dir)}
    assert statuses["frontend"] and statuses["prometheus"], statuses


def test_the_frontend_counted_every_request_the_load_generator_sent(run, dyn):
    """After the replay (and the fault): the frontend's own counters against the load generator's records."""
    stack = dyn.stack
    summary = stack.wait_for(lambda: (s := dyn.loadgen()).get("done") and s, timeout_s=TAIL_S + 120,
                             what="the load generator to finish the trace")
    rows = dyn.requests()
    assert len(rows) == summary["planned"] == summary["sent"]
    ok = sum(r["ok"] for r in rows)
    # Two calibration requests before the replay; Prometheus scrapes every second. A request the frontend
    # answered with a plain HTTP 503 (routed to the killed worker until its lease expired) may have been
    # refused before its handler accepted it, so it need not count as started.
    rejected = sum(r["status"] == 503 for r in rows)
    low, high = len(rows) + 2 - rejected, len(rows) + 2

    def started_final():
        first = dyn.prom_value("sum(dynamo_frontend_requests_started_total)")
        time.sleep(2.5)
        again = dyn.prom_value("sum(dynamo_frontend_requests_started_total)")
        return first is not None and first == again and low <= again <= high and again

    started = stack.wait_for(started_final, timeout_s=30,
                             what=f"Prometheus to scrape {low}-{high} started requests, steady")
    success = dyn.prom_value('sum(dynamo_frontend_requests_total{status="success"})')
    other = dyn.prom_value('sum(dynamo_frontend_requests_total{status!="success"})') or 0.0
    inflight = dyn.prom_value("sum(dynamo_frontend_inflight_requests)") or 0.0
    failed = len(rows) - ok
    # Every started request was counted as finished or is still in flight at the frontend. Still in
    # flight only where the killed worker cut the stream: the client saw the stream end, the frontend
    # still holds the request it routed to the dead worker (seen: 2 of 6 failed, CI run of 2026-11-24).
    assert success + other + inflight == started, (success, other, inflight, started, rejected)
    assert inflight <= failed, (inflight, failed)
    # The frontend's successes are the load generator's, up to the streams the killed worker cut: the
    # frontend may count a stream it ended with an error event as a success (seen: 1 of the failed ones).
    assert ok + 2 <= success <= ok + 2 + failed, (success, ok, failed)


def test_sizing_read_the_live_frontends_length_histograms(run):
    """Dynamo's own frontend's ISL/OSL histograms, scraped by Prometheus, gave sizing its length spread."""
    import re

    def text(data) -> str:  # a decision table's cells, the UI's line breaks undone
        rows = json.loads(data) if isinstance(data, str) else data
        return " ".join(f"{r['item']}: {r['value']}: {r['detail']}" for r in rows).replace("  \n", " ")

    tables = [text(a.get("data")) for artifacts in run["artifacts"].values() for a in artifacts
              if a["key"] == "sla-planner-decision-dynamo"]
    measured = [t for t in tables if re.search(r"CV [0-9.]+ measured", t)]
    assert measured, f"no run sized on the measured length spread; first table: {tables[:1]}"
    shapes = [re.search(r"length shape over (\d+) prompts in the last 1800 s: ISL CV ([0-9.]+)", t) for t in measured]
    assert all(shapes), f"a run sized on measured CVs without saying what it measured: {measured[0][:3000]}"
    assert all(re.search(r"length histograms: \d+ prompts in 1800 s", t) for t in measured)
    # The load generator's prompts are Azure conversation requests: their spread is not a single length.
    assert all(int(m.group(1)) >= 200 and float(m.group(2)) > 0.1 for m in shapes), [m.group(0) for m in shapes]
    assert re.search(r"context CV [0-9.]+ measured", measured[-1])


_FIRST_TOKENS = r"(\d+) first tokens, TTFT <= (\d+) ms"
_TOKEN_GAPS = r"(\d+) token gaps \(one per output token after the first\), each <= (\d+) ms"


@pytest.mark.parametrize("item, counted", [
    ("TTFT target met", _FIRST_TOKENS),
    ("ITL target met (token gaps)", _TOKEN_GAPS),
    ("TTFT target met, last 30 min", _FIRST_TOKENS),
    ("ITL target met (token gaps), last 30 min", _TOKEN_GAPS),
])
def test_runs_report_the_live_frontends_target_shares(run, item, counted):
    """Dynamo's own frontend's TTFT and ITL histograms, scraped by Prometheus: runs with tokens say how many met,
    over the interval and over the trailing SLO window."""
    import re

    tables = [json.loads(a["data"]) if isinstance(a.get("data"), str) else a.get("data")
              for artifacts in run["artifacts"].values() for a in artifacts if a["key"] == "sla-planner-decision-dynamo"]
    rows = [next((r for r in t if r["item"] == item), None) for t in tables]
    assert rows and all(rows), f"a decision table without the {item!r} row"
    read = [r for r in rows if r["value"].endswith("%")]
    assert read, f"no run read the frontend's histogram: {rows[:2]}"
    for r in read:
        detail = r["detail"].replace("  \n", " ")
        m = re.search(counted, detail)
        assert m and int(m.group(1)) > 0 and 0.0 <= float(r["value"][:-1]) <= 100.0, r
        assert "bucket" in detail, r
