"""`prefect deploy --all` with the repo's prefect.yaml: a process worker runs the scheduled planner.

Real components only: a Prefect server, a process worker, Prometheus scraping
live Dynamo-frontend metrics, and the local connector's state file. The test
deploys the repo's prefect.yaml with two values changed for speed and
isolation: the schedule (10 s instead of 60 s) and the config path.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.support.fixtures_frontend import FrontendFeeder
from tests.support.fixtures_prefect_server import ROOT, PrefectStack

pytestmark = pytest.mark.integration


@pytest.fixture
def prefect_stack(tmp_path):
    stack = PrefectStack(tmp_path)
    stack.start_server()
    yield stack
    stack.stop()


def test_scheduled_deployment_runs_and_leaves_artifacts(tmp_path, prefect_stack, prometheus_server, live_exporter,
                                                        h200_profile_dir):
    # 30 req/s of ISL 2000: 60 k prefill tokens/s, more than one H200 prefill replica serves within 200 ms.
    feeder = FrontendFeeder(live_exporter.registry, rps=30, isl_tokens=2000, osl_tokens=200,
                            ttft_s=0.12, itl_s=0.008).start()
    try:
        prometheus_server.wait_for_series("dynamo_frontend_requests_started_total", timeout_s=30)
        state = tmp_path / "fleet.json"
        config = yaml.safe_load((ROOT / "configs" / "planner.yaml").read_text())
        config["planner"]["profile"] = {"dir": str(h200_profile_dir)}
        config["planner"]["adjustment_interval_s"] = 10
        config["metrics"] = {"prometheus_url": prometheus_server.url, "stale_after_s": 60}
        config["connector"] = {"kind": "local", "state_path": str(state)}
        config_path = tmp_path / "planner.yaml"
        config_path.write_text(yaml.safe_dump(config))

        deploy_file = yaml.safe_load((ROOT / "prefect.yaml").read_text())
        planner = next(d for d in deploy_file["deployments"] if d["name"] == "planner")
        planner["schedules"] = [{"interval": 10}]
        planner["parameters"] = {"config_path": str(config_path)}
        deploy_file["deployments"] = [planner]
        prefect_file = tmp_path / "prefect.yaml"
        prefect_file.write_text(yaml.safe_dump(deploy_file))

        pool = planner["work_pool"]["name"]
        prefect_stack.cli("work-pool", "create", pool, "--type", "process")
        out = prefect_stack.cli("deploy", "--all", "--prefect-file", str(prefect_file))
        assert "sla-planner/planner" in out, out
        deployment = prefect_stack.api("GET", "/deployments/name/sla-planner/planner")
        assert deployment["schedules"] and deployment["schedules"][0]["schedule"]["interval"] == 10.0

        prefect_stack.start_worker(pool)

        def completed():
            runs = prefect_stack.flow_runs(deployment_id=deployment["id"])
            failed = [r for r in runs if r["state_type"] in ("FAILED", "CRASHED")]
            assert not failed, f"flow run failed: {failed[0]['state']}"
            done = [r for r in runs if r["state_type"] == "COMPLETED"]
            return done if len(done) >= 2 else None

        runs = prefect_stack.wait_for(completed, timeout_s=240, what="two completed scheduled planner runs")
        assert all(r["auto_scheduled"] for r in runs[:2])
        for run in runs[:2]:
            artifacts = prefect_stack.api("POST", "/artifacts/filter",
                                          {"artifacts": {"flow_run_id": {"any_": [run["id"]]}}})
            keys = {a["key"] for a in artifacts}
            assert {"sla-planner-decision-dynamo", "sla-planner-summary-dynamo", "sla-planner-chart-dynamo"} <= keys, keys
            # The worker's run renamed itself after its interval and targets, and says why in its state.
            assert re.fullmatch(r"\d\d:\d\d prefill \d+(→\d+)? decode \d+(→\d+)?", run["name"]), run["name"]
            assert re.match(r"(scaled up|scaled down|rebalanced|held|unchanged)", run["state"]["message"]), run["state"]
            table = next(a for a in artifacts if a["key"] == "sla-planner-decision-dynamo")
            rows = json.loads(table["data"]) if isinstance(table["data"], str) else table["data"]
            items = {r["item"]: r["value"] for r in rows}
            # The collector read the live traffic: ~30 req/s over a 10 s interval.
            assert 200 <= float(items["requests in interval"]) <= 400, items["requests in interval"]
            assert re.match(r"\d+ → \d+", items["prefill replicas"])
        fleet = json.loads(state.read_text())
        assert "history" in fleet and fleet["history"], fleet
        assert fleet["prefill"] > 1, fleet
    finally:
        feeder.stop()
