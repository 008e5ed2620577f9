"""The fast path under Prefect: prefect.yaml's trigger, the watcher's event, the scale-up-only flow run.

Real components: Prefect's test harness (a server with its event and automation
services), a real Prometheus scraping a live exporter, the local connector's file.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from prometheus_client import Counter, Gauge

from connectors.config import LocalConnectorConfig, MetricsConfig
from connectors.prefect_events import NAMESPACE_LABEL, SATURATION_EVENT, emit_saturation
from connectors.prometheus import PrometheusCollector
from flows.config import PlannerRunConfig, ReplayInputs, load_run_config
from planner.config import FastPathConfig, PlannerConfig, ProfileConfig
from planner.saturation.fast_path import SaturationSignal
from planner.types import PodMetrics
from planner_cli.watch import SaturationWatcher
from tests.flows.test_flow_planner import _observation

ROOT = Path(__file__).resolve().parents[2]
NOW_S = 1800.0
# The local fleet's 3 + 3 replicas, all reporting, idle.
THREE_EACH = tuple(PodMetrics(f"worker-{pool}-{i}", pool, 0.2, 0.0) for pool in ("prefill", "decode") for i in range(3))


def _planner_triggers() -> dict[str, list[dict]]:
    deployments = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    return {d["name"]: d.get("triggers", []) for d in deployments}


# ---------------------------------------------------------------- prefect.yaml


def test_prefect_yaml_triggers_load_into_prefects_models():
    from prefect.events.actions import RunDeployment
    from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger, DeploymentTriggerTypes
    from pydantic import TypeAdapter

    from flows.planner_flow import planner_flow

    repo_cfg = load_run_config(ROOT / "configs" / "planner.yaml").planner
    k8s_docs = yaml.safe_load_all((ROOT / "deploy" / "kubernetes" / "base" / "config.yaml").read_text())
    k8s_planner = next(d for d in k8s_docs if d and "planner.yaml" in d.get("data", {}))["data"]["planner.yaml"]
    adapter = TypeAdapter(DeploymentTriggerTypes)
    triggers = _planner_triggers()
    assert triggers["retrain"] == []
    for name in ("planner", "planner-k8s"):
        (spec,) = triggers[name]
        trigger = adapter.validate_python(spec)
        assert isinstance(trigger, DeploymentEventTrigger)
        assert trigger.expect == {SATURATION_EVENT}
        # Matches the namespace the planner runs for (configs/planner.yaml; the k8s ConfigMap says the same).
        assert trigger.match.model_dump() == {NAMESPACE_LABEL: repo_cfg.namespace}
        assert yaml.safe_load(k8s_planner)["planner"]["namespace"] == repo_cfg.namespace
        # At most one run per cooldown: Prefect's reactive bucket waits `within` before firing again.
        assert trigger.threshold == 1 and trigger.within == timedelta(seconds=FastPathConfig().cooldown_s)
        trigger.set_deployment_id(uuid.uuid4())
        automation = trigger.as_automation()
        (action,) = automation.actions
        assert isinstance(action, RunDeployment) and action.parameters == {"fast_path": True}
    # The parameter the trigger passes is one the flow takes.
    assert planner_flow.parameters.properties["fast_path"]["default"] is False


# ---------------------------------------------------------------- the flow


@pytest.fixture
def run_config(tmp_path: Path, h200_profile_dir: Path) -> PlannerRunConfig:
    return PlannerRunConfig(
        planner=PlannerConfig(
            namespace="fast-ns",
            profile=ProfileConfig(dir=str(h200_profile_dir)),
            fast_path=FastPathConfig(enabled=True, cooldown_s=30.0),
        ),
        # The first scale-up stays pending (its replicas take an hour to be ready).
        connector=LocalConnectorConfig(state_path=str(tmp_path / "fleet.json"), initial_prefill_replicas=3,
                                       initial_decode_replicas=3, apply_delay_s=3600.0),
    )


def _codes(out: dict) -> list[str]:
    return [r["code"] for r in out["decision"]["reasons"]]


def test_a_fast_path_run_never_scales_down(prefect_harness, run_config):
    from flows.planner_flow import planner_flow

    # 60 requests/min needs one prefill and one decode replica: a scheduled run scales down.
    quiet = ReplayInputs(observation=_observation(requests=60.0, pods=THREE_EACH), now_s=NOW_S)
    scheduled = planner_flow(config=run_config, replay=quiet, dry_run=True)
    assert scheduled["decision"]["prefill_replicas"] < 3 or scheduled["decision"]["decode_replicas"] < 3
    out = planner_flow(config=run_config, replay=quiet, fast_path=True)
    assert (out["decision"]["prefill_replicas"], out["decision"]["decode_replicas"]) == (3, 3)
    assert out["applied"] is False and _codes(out)[0] == "fast_path_nothing_to_add"


def test_fast_path_runs_scale_up_past_a_pending_one_and_cool_down(prefect_harness, run_config, tmp_path):
    from flows.planner_flow import planner_flow

    messages = []

    def run(requests: float, now_s: float) -> dict:
        state = planner_flow(config=run_config, fast_path=True, return_state=True,
                             replay=ReplayInputs(observation=_observation(requests=requests, pods=THREE_EACH),
                                                 now_s=now_s))
        messages.append(state.message)
        return state.result()

    # 9,000 requests/min of ISL 1000 (150 rps, ~40 ms of H200 prefill each: 6 busy) needs more than 3.
    first = run(9000.0, NOW_S)
    assert first["applied"] is True and _codes(first)[0] == "fast_path_scale_up"
    p1 = first["decision"]["prefill_replicas"]
    assert p1 > 3
    # 10 s later, more load: the decision 10 s old is inside the 30 s cooldown.
    cooled = run(18000.0, NOW_S + 10)
    assert cooled["applied"] is False and _codes(cooled)[0] == "fast_path_cooldown"
    assert cooled["decision"]["prefill_replicas"] == p1
    # 40 s later: the first is still pending (ready after an hour), the larger scale-up goes past it.
    second = run(18000.0, NOW_S + 40)
    assert second["applied"] is True and _codes(second)[0] == "fast_path_scale_up"
    assert second["decision"]["prefill_replicas"] > p1
    assert "hold_previous_not_done" not in _codes(second)
    # The runs' final states say so in the UI's run list.
    assert messages[0].startswith("scaled up: fast path") and messages[1] == "held: fast-path cooldown"
    state = json.loads((tmp_path / "fleet.json").read_text())
    assert json.dumps(state).count(str(second["decision"]["prefill_replicas"])) >= 1


# ---------------------------------------------------------------- the watcher


@pytest.fixture
def events_to_this_harness(prefect_harness):
    """Prefect's events worker is a process-wide singleton that keeps the API URL it was first made with;
    a test module's harness is a server of its own, so stop the worker and let the next event make one."""
    from prefect.events.worker import EventsWorker

    EventsWorker.drain_all(timeout=10)
    yield
    EventsWorker.drain_all(timeout=10)


def _wait(what: str, check, *, timeout_s: float = 30.0, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every_s)
    pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")


def _saturation_events(namespace: str) -> list:
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    with get_client(sync_client=True) as client:
        page = client.read_events(EventFilter(
            event=EventNameFilter(name=[SATURATION_EVENT]),
            resource=EventResourceFilter(labels={NAMESPACE_LABEL: [namespace]}),
        ), limit=50)  # the client's default, 100, is above the server's maximum
    return page.events


def test_the_watcher_sends_the_event_when_the_guardrail_fires(events_to_this_harness, prometheus_server, live_exporter,
                                                               run_config):
    tag = f"fp-{uuid.uuid4().hex[:8]}"
    registry = live_exporter.registry
    kv = Gauge("vllm:kv_cache_usage_perc", "kv", ["pod", "fp_test"], registry=registry)
    waiting = Gauge("vllm:num_requests_waiting", "waiting", ["pod", "fp_test"], registry=registry)
    routed = Counter("router_requests", "route calls", ["outcome", "fp_test"], registry=registry)
    for pod in ("worker-prefill-0", "worker-decode-0"):
        kv.labels(pod, tag).set(0.3)
        waiting.labels(pod, tag).set(0)
    routed.labels("shed", tag)
    queries = MetricsConfig().queries.model_copy(
        update={"shed_requests": f'sum(increase(router_requests_total{{outcome="shed",fp_test="{tag}"}}[1m]))'})
    metrics = MetricsConfig(prometheus_url=prometheus_server.url, worker_selector=f'fp_test="{tag}"',
                            queries=queries)
    cfg = run_config.model_copy(update={
        "metrics": metrics,
        "planner": run_config.planner.model_copy(update={"namespace": tag}),
    })
    # The scrape stores the name as vllm_num_requests_waiting; the queries match both spellings.
    waiting_series = f'{{__name__=~"vllm[:_]num_requests_waiting",fp_test="{tag}",pod="worker-prefill-0"}}'
    prometheus_server.wait_for_series(waiting_series, timeout_s=30)
    with PrometheusCollector(metrics) as collector:
        watcher = SaturationWatcher(cfg, collector)
        signal, event, line = watcher.poll(now_s=time.time())
        assert not signal.fire and event is None and "quiet: 2 pods reporting" in line

        # Prefill queue 4: spare queue 5 - 4 = 1 < 3, the guardrail calls for a scale-up.
        waiting.labels("worker-prefill-0", tag).set(4)
        _wait("queue 4 scraped", lambda: prometheus_server.query(f"{waiting_series} == 4"))
        signal, event, line = watcher.poll(now_s=time.time())
        assert signal.fire and signal.pools == ("prefill",)
        assert event is not None and f"-> event {SATURATION_EVENT}" in line
        sent = _wait("the event in Prefect's API", lambda: _saturation_events(tag))
        assert len(sent) == 1 and sent[0].id == event.id
        assert sent[0].resource.id == f"sla-planner.fleet.{tag}.default"
        assert sent[0].payload["pools"] == ["prefill"]
        assert sent[0].payload["numbers"]["prefill_avg_spare_queue"] == 1.0

        # Still saturated a moment later: inside the cooldown, no second event.
        signal, again, line = watcher.poll(now_s=time.time())
        assert signal.fire and again is None and "cooldown 30 s" in line

        # Queue back to 0, the router sheds 3 requests: the shed counter alone fires (cooldown over).
        waiting.labels("worker-prefill-0", tag).set(0)
        routed.labels("shed", tag).inc(3)
        _wait("shedding scraped",
              lambda: (collector.saturation_inputs(now_s=time.time(), interval_s=60.0)[1] or 0.0) >= 1.0)
        _wait("queue 0 scraped", lambda: prometheus_server.query(f"{waiting_series} == 0"))
        watcher.last_sent_s -= 30.0  # as if the first event were sent 30 s earlier: the cooldown is over
        signal, event, line = watcher.poll(now_s=time.time())
        assert signal.fire and signal.shed and signal.pools == () and event is not None
        assert "router shed" in line


def test_the_watcher_refuses_to_start_without_the_switch(tmp_path, h200_profile_dir, capsys):
    from planner_cli.main import main

    config = tmp_path / "planner.yaml"
    config.write_text(yaml.safe_dump({"planner": {"profile": {"dir": str(h200_profile_dir)}}}))
    assert main(["watch", "--config", str(config), "--polls", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "allow_scale_to_zero are both false: nothing to watch" in err and str(config) in err


# ---------------------------------------------------------------- event -> deployment run


def test_the_event_starts_a_fast_path_run_of_the_deployment(events_to_this_harness):
    """prefect.yaml's trigger as an automation on the harness: the watcher's event makes a scheduled run."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter
    from prefect.events.schemas.deployment_triggers import DeploymentTriggerTypes
    from prefect.utilities.callables import parameter_schema
    from pydantic import TypeAdapter

    from flows.planner_flow import planner_flow

    (spec,) = _planner_triggers()["planner"]
    namespace = spec["match"][NAMESPACE_LABEL]
    trigger = TypeAdapter(DeploymentTriggerTypes).validate_python(spec)
    with get_client(sync_client=True) as client:
        flow_id = client.create_flow(planner_flow)
        deployment_id = client.create_deployment(
            flow_id=flow_id, name=f"planner-{uuid.uuid4().hex[:6]}", entrypoint="flows/planner_flow.py:planner_flow",
            parameters={"config_path": "configs/planner.yaml"}, parameter_openapi_schema=parameter_schema(planner_flow).model_dump_for_openapi(),
            enforce_parameter_schema=True,
        )
        trigger.set_deployment_id(deployment_id)
        automation_id = client.create_automation(trigger.as_automation())
        try:
            signal = SaturationSignal(fire=True, pools=("decode",), shed=False, message="decode scale up",
                                      numbers={"decode_avg_spare_kv_frac": 0.05})
            # The automation service loads the new automation before the event arrives.
            time.sleep(1.0)
            assert emit_saturation(signal, namespace=namespace, model_id="llama", now_s=time.time()) is not None

            def runs():
                return client.read_flow_runs(deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[deployment_id])), flow_run_filter=FlowRunFilter())

            (run,) = _wait("the deployment's fast-path run", runs, timeout_s=25.0)
            assert run.parameters == {"config_path": "configs/planner.yaml", "fast_path": True}
            # A second event at once falls inside the trigger's `within`: no second run.
            emit_saturation(signal, namespace=namespace, model_id="llama", now_s=time.time())
            time.sleep(3.0)
            assert len(runs()) == 1
        finally:
            client.delete_automation(automation_id)
