"""The planner flow end to end under Prefect's test harness: artifacts and the applied result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from connectors.config import LocalConnectorConfig
from flows.config import PlannerRunConfig, ReplayInputs, load_run_config
from flows.report import artifact_key
from planner.config import PlannerConfig, ProfileConfig
from planner.types import LoadHistory, Observation, PodMetrics
from planner.whatif import WhatIf

INTERVAL_S = 60.0


ONE_POD_EACH = (
    PodMetrics("worker-prefill-0", "prefill", 0.2, 0.0),
    PodMetrics("worker-decode-0", "decode", 0.3, 0.0),
)


def _observation(*, requests: float, n_hist: int = 30, pods=ONE_POD_EACH) -> Observation:
    hist = LoadHistory(
        t_s=tuple(INTERVAL_S * i for i in range(n_hist)),
        num_requests=(requests,) * n_hist,
        avg_isl_tokens=(1000.0,) * n_hist,
        avg_osl_tokens=(150.0,) * n_hist,
        interval_s=INTERVAL_S,
    )
    return Observation(
        taken_at_s=INTERVAL_S * n_hist,
        interval_s=INTERVAL_S,
        num_requests=requests,
        avg_isl_tokens=1000.0,
        avg_osl_tokens=150.0,
        avg_ttft_ms=60.0,
        avg_itl_ms=6.0,
        history=hist,
        pods=pods,
    )


@pytest.fixture
def run_config(tmp_path: Path, h200_profile_dir: Path) -> PlannerRunConfig:
    return PlannerRunConfig(
        planner=PlannerConfig(
            namespace="test-ns",
            profile=ProfileConfig(dir=str(h200_profile_dir)),
        ),
        connector=LocalConnectorConfig(state_path=str(tmp_path / "fleet.json")),
    )


def _artifact(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    import anyio

    async def read():
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
            )

    return anyio.run(read)


def test_flow_applies_scale_up_and_publishes_artifacts(prefect_harness, run_config, tmp_path):
    from flows.planner_flow import planner_flow

    # 3,000 requests/min of ISL 1000 is 50 rps at ~40 ms of H200 prefill each: two
    # replicas busy on average, so one replica cannot keep a 200 ms TTFT.
    out = planner_flow(config=run_config, replay=ReplayInputs(observation=_observation(requests=3000.0), now_s=1800.0))
    assert out["applied"] is True
    assert out["decision"]["prefill_replicas"] > 1
    state = json.loads((tmp_path / "fleet.json").read_text())
    assert json.dumps(state).count(str(out["decision"]["prefill_replicas"])) >= 1

    table = _artifact(artifact_key("decision", "test-ns"))
    assert table, "decision table artifact missing"
    rows = json.loads(table[0].data)
    items = {r["item"]: r for r in rows}
    assert items["prefill replicas"]["value"] == f"1 → {out['decision']['prefill_replicas']}"
    assert "requests next interval (mean / p90)" in items
    assert any(r["item"].startswith("reason ") for r in rows)
    summary = _artifact(artifact_key("summary", "test-ns"))
    assert "Planner decision" in summary[0].data


def test_dry_run_and_what_if_apply_nothing(prefect_harness, run_config, tmp_path):
    from flows.planner_flow import planner_flow

    out = planner_flow(
        config=run_config,
        replay=ReplayInputs(observation=_observation(requests=600.0), now_s=1800.0),
        what_if=WhatIf(load_multiplier=8.0, ttft_ms=150.0),
    )
    assert out["dry_run"] is True and out["applied"] is False
    # x8 load: 80 rps at ISL 1000 (~40 ms of prefill each, 3.2 replicas busy) needs
    # more prefill replicas than 10 rps does (2 for 99% of requests within 200 ms);
    # nothing is written either way.
    base = planner_flow(config=run_config, replay=ReplayInputs(observation=_observation(requests=600.0), now_s=1800.0),
                        dry_run=True)
    assert base["dry_run"] is True and base["applied"] is False
    assert out["decision"]["prefill_replicas"] >= 2
    assert base["decision"]["prefill_replicas"] < out["decision"]["prefill_replicas"]
    assert not (tmp_path / "fleet.json").exists() or "decision" not in (tmp_path / "fleet.json").read_text()


def test_missing_metrics_hold(prefect_harness, run_config):
    from flows.planner_flow import planner_flow

    obs = Observation(
        taken_at_s=1800.0, interval_s=INTERVAL_S, num_requests=None, avg_isl_tokens=None,
        avg_osl_tokens=None, avg_ttft_ms=None, avg_itl_ms=None,
        stale_reasons=("prometheus: no frontend samples in the last 180 s",),
    )
    out = planner_flow(config=run_config, replay=ReplayInputs(observation=obs, now_s=1800.0))
    assert out["decision"]["prefill_replicas"] == 1 and out["decision"]["decode_replicas"] == 1
    codes = [r["code"] for r in out["decision"]["reasons"]]
    assert any(c.startswith("hold_") for c in codes), codes


def test_repo_config_loads_and_bad_field_is_named(tmp_path):
    cfg = load_run_config(Path(__file__).resolve().parents[2] / "configs" / "planner.yaml")
    assert Path(cfg.planner.profile.dir).is_dir()
    bad = tmp_path / "bad.yaml"
    bad.write_text("planner:\n  profile: {dir: x}\n  slo: {ttft_ms: -5}\n  adjustmnet_interval_s: 3\n")
    with pytest.raises(ValueError) as err:
        load_run_config(bad)
    text = str(err.value)
    assert "planner.slo.ttft_ms" in text and "-5" in text
    assert "adjustmnet_interval_s" in text


def test_prometheus_unreachable_fails_visibly_and_applies_nothing(prefect_harness, run_config, tmp_path):
    from prefect.states import State

    from connectors.config import MetricsConfig
    from flows.planner_flow import planner_flow
    from tests.support.fixtures_net import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg = run_config.model_copy(update={"metrics": MetricsConfig(prometheus_url=dead)})
    state: State = planner_flow(config=cfg, replay=ReplayInputs(now_s=1800.0), return_state=True)
    assert state.is_failed()
    with pytest.raises(ConnectionError) as err:
        state.result()
    assert dead in str(err.value)
    # Nothing applied: the local fleet file holds no decision.
    fleet = tmp_path / "fleet.json"
    assert not fleet.exists() or '"decision_id": null' in fleet.read_text() or "decision_id" not in fleet.read_text()


def test_decision_table_shows_the_burst_signal(prefect_harness, run_config):
    import dataclasses

    from flows.planner_flow import planner_flow

    # 600 requests in 60 s is 10 req/s on average; the busiest 15 s ran at 30 req/s.
    obs = _observation(requests=600.0)
    hist = dataclasses.replace(obs.history, peak_rps=(10.0,) * (len(obs.history.t_s) - 1) + (30.0,),
                               peak_window_s=15.0)
    obs = dataclasses.replace(obs, history=hist, peak_rps=30.0, peak_window_s=15.0)
    planner_flow(config=run_config, replay=ReplayInputs(observation=obs, now_s=1800.0), dry_run=True)
    newest = max(_artifact(artifact_key("decision", "test-ns", what_if=True)), key=lambda a: a.created)
    rows = {r["item"]: r for r in json.loads(newest.data)}
    assert rows["peak arrival rate"]["value"] == "30.00 req/s"
    assert "busiest 15 s window" in rows["peak arrival rate"]["detail"]
    assert float(rows["burst ratio next interval"]["value"]) > 1.0


def test_another_writer_between_read_and_apply_makes_the_run_decide_again(prefect_harness, run_config, tmp_path,
                                                                             monkeypatch):
    """Another writer sets (3, 4) after the run read (1, 1): the run never writes the decision it made
    from (1, 1); it reads the fleet again, decides from (3, 4) and writes that."""
    from connectors.local import LocalConnector
    from flows.planner_flow import planner_flow
    from planner.types import Decision

    real_read = LocalConnector.read_fleet
    reads = []

    def read_then_another_writer_scales(self, *, now_s):
        fleet = real_read(self, now_s=now_s)
        reads.append((fleet.prefill.current_replicas, fleet.decode.current_replicas))
        if len(reads) == 1:
            LocalConnector(run_config.connector).apply(
                Decision(prefill_replicas=3, decode_replicas=4, apply=True, reasons=()), now_s=now_s)
        return fleet

    monkeypatch.setattr(LocalConnector, "read_fleet", read_then_another_writer_scales)
    out = planner_flow(config=run_config, replay=ReplayInputs(observation=_observation(requests=3000.0), now_s=1800.0))

    assert reads == [(1, 1), (3, 4)]
    assert out["current"] == {"prefill": 3, "decode": 4}
    assert out["decision"]["based_on"] == [3, 4]
    state = json.loads((tmp_path / "fleet.json").read_text())
    assert state["decision_id"] == 1  # the other writer's 0, then ours, decided from the fleet it left
    assert (state["prefill"], state["decode"]) == (out["decision"]["prefill_replicas"], out["decision"]["decode_replicas"])


# -- partial scrapes: a real Prometheus, the whole run ----------------------------------------------------------

FLOW_END_S = 1_700_006_400.0 + 3600.0  # an hour after the fixtures' fixed anchor


@pytest.fixture(scope="module")
def partial_scrape_data(prometheus_server):
    """Two frontends (100 requests each per minute) and 3 + 3 idle workers over ten intervals, per namespace.

    flow-partial: frontend fe-b's scrapes fail in the last interval (up 0, its counters stop).
    flow-whole: both frontends up throughout.
    """
    from tests.support.fixtures_prometheus import (
        FrontendInterval,
        OpenMetricsWriter,
        write_frontend_intervals,
        write_gauge,
        write_up,
    )

    w = OpenMetricsWriter()
    start_s = FLOW_END_S - 10 * INTERVAL_S
    every_15s = [start_s + 15 * j for j in range(41)]
    for ns in ("flow-partial", "flow-whole"):
        for frontend in ("fe-a", "fe-b"):
            down_from_s = FLOW_END_S - INTERVAL_S if (ns, frontend) == ("flow-partial", "fe-b") else math.inf
            labels = {"namespace": ns, "instance": frontend}
            served = 9 if down_from_s < math.inf else 10
            write_frontend_intervals(w, labels=labels, start_s=start_s, interval_s=INTERVAL_S,
                                     intervals=[FrontendInterval(100, 0.05, 0.005, 500, 100)] * served)
            write_up(w, labels=labels, points=[(t_s, 0.0 if t_s > down_from_s else 1.0) for t_s in every_15s])
        for pool in ("prefill", "decode"):
            for i in range(3):
                pod = {"namespace": ns, "pod": f"worker-{pool}-{i}"}
                write_gauge(w, name="vllm:kv_cache_usage_perc", labels=pod, points=[(t, 0.05) for t in every_15s])
                write_gauge(w, name="vllm:num_requests_waiting", labels=pod, points=[(t, 0.0) for t in every_15s])
    prometheus_server.backfill(w.render())
    return prometheus_server


def _prometheus_run_config(tmp_path: Path, profile_dir: Path, server, namespace: str) -> PlannerRunConfig:
    from connectors.config import MetricsConfig

    selector = f'namespace="{namespace}"'
    return PlannerRunConfig(
        planner=PlannerConfig(namespace=namespace, profile=ProfileConfig(dir=str(profile_dir))),
        metrics=MetricsConfig(prometheus_url=server.url, frontend_selector=selector, worker_selector=selector,
                              frontend_targets_selector=selector),
        connector=LocalConnectorConfig(state_path=str(tmp_path / f"{namespace}.json"),
                                       initial_prefill_replicas=3, initial_decode_replicas=3),
    )


def test_a_frontend_down_holds_the_run_and_the_artifact_says_so(prefect_harness, partial_scrape_data, tmp_path,
                                                                  h200_profile_dir):
    """200 requests a minute on 3 + 3 idle replicas: with both frontends scraped the run scales down; with
    fe-b down only 100 are counted, and the run holds 3 + 3 with the reason and its numbers."""
    from flows.planner_flow import planner_flow

    whole = planner_flow(config=_prometheus_run_config(tmp_path, h200_profile_dir, partial_scrape_data, "flow-whole"),
                         replay=ReplayInputs(now_s=FLOW_END_S))
    assert whole["applied"] and whole["decision"]["decode_replicas"] < 3, whole["decision"]["reasons"]
    assert "hold_partial_metrics" not in [r["code"] for r in whole["decision"]["reasons"]]

    out = planner_flow(config=_prometheus_run_config(tmp_path, h200_profile_dir, partial_scrape_data, "flow-partial"),
                       replay=ReplayInputs(now_s=FLOW_END_S))
    d = out["decision"]
    assert (d["prefill_replicas"], d["decode_replicas"], out["applied"]) == (3, 3, False)
    (held,) = [r for r in d["reasons"] if r["code"] == "hold_partial_metrics"]
    assert "1 of 2 frontend targets missing (down: fe-b)" in held["message"]
    assert held["numbers"]["frontend_targets_expected"] == 2 and held["numbers"]["frontend_targets_present"] == 1

    newest = max(_artifact(artifact_key("decision", "flow-partial")), key=lambda a: a.created)
    rows = {r["item"]: r for r in json.loads(newest.data)}
    assert rows["frontend targets reporting"]["value"] == "1 of 2"
    assert rows["frontend targets reporting"]["detail"] == "down: fe-b"
    assert rows["decode workers reporting"]["value"] == "3 of 3"
    assert "1 of 2 frontend targets missing" in rows["reason hold_partial_metrics"]["detail"]


def test_each_flow_task_wraps_the_pipelines_step_of_the_same_name():
    """The flow runs the pipeline's steps, not its own: each of its step tasks is the planner.steps function the
    pipeline runs by default, under that function's name."""
    import dataclasses

    from prefect import Task

    from flows.planner_flow import STEP_TASKS
    from planner import steps
    from planner.pipeline import Steps

    wrapped = {}
    for field in dataclasses.fields(Steps):
        default, flow_task = field.default, getattr(STEP_TASKS, field.name)
        assert isinstance(flow_task, Task), f"the flow's {field.name} step is not a Prefect task"
        assert default is getattr(steps, default.__name__), f"the pipeline's {field.name} is not in planner.steps"
        wrapped[field.name] = (flow_task.name, flow_task.fn)
    assert wrapped == {f.name: (f.default.__name__, f.default) for f in dataclasses.fields(Steps)}
    assert list(wrapped) == ["correct", "predict", "warmup_floor", "interpolate", "analyze_saturation", "decide"]
