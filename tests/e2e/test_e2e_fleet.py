"""Two deployments sharing one GPU budget, planned by the fleet deployment a process worker runs.

Real components: a Prefect server and a process worker (as the local stack runs them), the repo's
prefect.yaml `fleet` deployment deployed with `prefect deploy`, a real Prometheus holding both
deployments' Dynamo frontend series (backfilled), local connectors' state files. The fleet wants more
GPUs than the budget: the run decides both, the arbitration holds one, both deployments' runs are on
the server, named after their decisions and explaining them, and what was applied fits the budget.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.support.fixtures_prefect_server import ROOT, PrefectStack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

INTERVAL_S = 60.0
END_S = 1_700_006_400.0 + 7200.0  # 2 h after the fixtures' anchor, a fixed time
# requests per minute of 2000-token prompts, priority. What each wants is read from the planner itself
# (its sizing moves with the planner), and the budget set so that chat's priority share (its floor 2 + 10/10.5
# of what the floors leave) covers its wants and batch gets 3 GPUs, fewer than it wants.
DEPLOYMENTS = {"chat": (6000.0, 10.0), "batch": (3000.0, 0.5)}


@pytest.fixture
def fleet_series(prometheus_server):
    from tests.support.fixtures_prometheus import FrontendInterval, OpenMetricsWriter, write_frontend_intervals, \
        write_gauge

    w = OpenMetricsWriter()
    start_s = END_S - 10 * INTERVAL_S
    for name, (per_min, _) in DEPLOYMENTS.items():
        labels = {"namespace": f"fleet-e2e-{name}"}
        write_frontend_intervals(w, labels=labels, start_s=start_s, interval_s=INTERVAL_S,
                                 intervals=[FrontendInterval(per_min, 0.08, 0.006, 2000, 200)] * 10)
        for pool in ("prefill", "decode"):
            pod = {**labels, "pod": f"worker-{pool}-0"}
            every_15s = [start_s + 15 * j for j in range(41)]
            write_gauge(w, name="vllm:kv_cache_usage_perc", labels=pod, points=[(t, 0.3) for t in every_15s])
            write_gauge(w, name="vllm:num_requests_waiting", labels=pod, points=[(t, 0.0) for t in every_15s])
    prometheus_server.backfill(w.render())
    return prometheus_server


def wanted_gpus(tmp_path, prometheus_url: str, profile_dir) -> dict[str, int]:
    """What each deployment's planner wants at END_S from a fresh fleet (one GPU per replica on this profile)."""
    from connectors.config import LatencyModelConfig, LocalConnectorConfig, MetricsConfig
    from connectors.profiles import load_profile
    from planner.config import PlannerConfig, ProfileConfig
    from tasks.fleet import plan_deployment

    out = {}
    for name in DEPLOYMENTS:
        ns, selector = f"fleet-e2e-{name}", f'namespace="fleet-e2e-{name}"'
        cfg = PlannerConfig(namespace=ns, model_id=f"llama-{name}", profile=ProfileConfig(dir=str(profile_dir)))
        plan = plan_deployment(name, cfg, load_profile(cfg.profile), now_s=END_S, latency_model=LatencyModelConfig(),
                               metrics=MetricsConfig(prometheus_url=prometheus_url, frontend_selector=selector,
                                                     worker_selector=selector, frontend_targets_selector=""),
                               connector=LocalConnectorConfig(state_path=str(tmp_path / f"probe-{name}.json")))
        out[name] = sum(plan.wanted.values())
    return out


def write_fleet(tmp_path, prometheus_url: str, profile_dir, *, budget_gpus: int) -> tuple:
    """The fleet file and each deployment's run configuration (local connector, its own state file)."""
    states = {}
    deployments = []
    for name, (_, priority) in DEPLOYMENTS.items():
        ns = f"fleet-e2e-{name}"
        selector = f'namespace="{ns}"'
        states[name] = tmp_path / f"{name}-fleet.json"
        config = {
            "planner": {"namespace": ns, "model_id": f"llama-{name}", "profile": {"dir": str(profile_dir)},
                        "predictor": {"cache_dir": str(tmp_path / "predictor-cache")}},
            "metrics": {"prometheus_url": prometheus_url, "frontend_selector": selector,
                        "worker_selector": selector, "frontend_targets_selector": ""},
            "connector": {"kind": "local", "state_path": str(states[name])},
        }
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(config))
        deployments.append({"name": name, "priority": priority, "config": f"{name}.yaml"})
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text(yaml.safe_dump({"budget": {"gpus": budget_gpus}, "deployments": deployments}))
    return fleet_path, states


def test_fleet_run_arbitrates_two_deployments_and_each_explains_itself(tmp_path, fleet_series, h200_profile_dir):
    wants = wanted_gpus(tmp_path, fleet_series.url, h200_profile_dir)
    assert wants["batch"] > 3, wants  # else nothing would be held
    budget = wants["chat"] + 3
    fleet_path, states = write_fleet(tmp_path, fleet_series.url, h200_profile_dir, budget_gpus=budget)
    deploy_file = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    fleet = next(d for d in deploy_file["deployments"] if d["name"] == "fleet")
    fleet.pop("schedules")  # one run, started below at the series' time
    deploy_file["deployments"] = [fleet]
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump(deploy_file))

    stack = PrefectStack(tmp_path)
    try:
        stack.start_server()
        pool = fleet["work_pool"]["name"]
        stack.cli("work-pool", "create", pool, "--type", "process")
        out = stack.cli("deploy", "--all", "--prefect-file", str(prefect_file))
        assert "sla-planner-fleet/fleet" in out, out
        deployment = stack.api("GET", "/deployments/name/sla-planner-fleet/fleet")
        run = stack.api("POST", f"/deployments/{deployment['id']}/create_flow_run",
                        {"parameters": {"fleet_path": str(fleet_path), "now_s": END_S}})
        stack.start_worker(pool)

        def finished():
            r = stack.api("GET", f"/flow_runs/{run['id']}")
            return r if r["state_type"] in ("COMPLETED", "FAILED", "CRASHED") else None

        done = stack.wait_for(finished, timeout_s=180, what="the fleet run")
        assert done["state_type"] == "COMPLETED", done["state"]
        message = done["state"]["message"]
        # e.g. "2 deployments, 11 GPUs wanted, 10 granted of 10; held by the budget: batch"
        wanted, granted = (int(x) for x in re.search(rf"(\d+) GPUs wanted, (\d+) granted of {budget}",
                                                     message).groups())
        assert wanted == sum(wants.values()) > budget >= granted, (message, wants)
        held = re.search(r"held by the budget: ([\w, -]+)", message).group(1).split(", ")
        fleet_table = stack.api("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run["id"]]},
                                                                            "key": {"any_": ["sla-planner-fleet-fleet"]}}})
        assert held == ["batch"], (message, fleet_table and fleet_table[0]["data"])

        # Each deployment's decision is its own run on the server (a task run of the fleet run), named after
        # its interval and targets, its state message saying why, its decision table among its artifacts.
        task_runs = stack.api("POST", "/task_runs/filter",
                              {"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 50})
        explained = {t["name"].split(" ")[0]: t for t in task_runs
                     if re.match(rf"({'|'.join(DEPLOYMENTS)}) \d\d:\d\d prefill", t["name"])}
        assert set(explained) == set(DEPLOYMENTS), [t["name"] for t in task_runs]
        applied_gpus = 0
        for name, t in explained.items():
            assert t["state_type"] == "COMPLETED", t["state"]
            assert re.fullmatch(rf"{name} \d\d:\d\d prefill \d+(→\d+)? decode \d+(→\d+)?", t["name"]), t["name"]
            assert re.match(r"(scaled up|scaled down|rebalanced|held|unchanged)", t["state"]["message"]), t["state"]
            artifacts = stack.api("POST", "/artifacts/filter", {"artifacts": {"task_run_id": {"any_": [t["id"]]}}})
            keys = {a["key"] for a in artifacts}
            assert {f"sla-planner-decision-fleet-e2e-{name}", f"sla-planner-summary-fleet-e2e-{name}"} <= keys, keys
            table = next(a for a in artifacts if a["key"] == f"sla-planner-decision-fleet-e2e-{name}")
            rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
            budget_rows = [r for r in rows if "fleet_budget" in r["item"]]
            assert budget_rows, [r["item"] for r in rows]
            if name in held:
                # The held deployment's own table names who the GPUs went to.
                assert any("held at" in r["detail"] and "budget given to" in r["detail"] for r in budget_rows), rows
            state = json.loads(states[name].read_text())
            applied_gpus += state["prefill"] + state["decode"]
            assert [state["prefill"], state["decode"]] != [1, 1], state  # both scaled up, within the grant
        assert applied_gpus <= budget
    finally:
        stack.stop()
