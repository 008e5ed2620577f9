"""What a user sees of a planner run in the Prefect UI, read back from the API: the run's name and final
message, its artifacts' keys (live and what-if apart), the chart as a PNG, the decision table's cells in full,
the deployment forms' parameter schemas, and the Prometheus recording rules the stack loads."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from connectors.config import LocalConnectorConfig
from flows.config import PlannerRunConfig, ReplayInputs
from flows.report import CELL_WIDTH_CHARS
from planner.config import PlannerConfig, ProfileConfig
from planner.types import LoadHistory, Observation, PodMetrics
from planner.whatif import WhatIf

ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 60.0
NOW_S = 1_700_000_000.0 + 3 * 3600 + 5 * 60  # 2023-11-14 22:13:20 UTC + 3 h 5 min = 01:18 UTC next day


def _observation(requests: float, *, t_end: float, n_hist: int = 60, stale: tuple[str, ...] = ()) -> Observation:
    """An hour of history rising from half of `requests` to it, one interval of `requests` ending at t_end."""
    hist = LoadHistory(
        t_s=tuple(t_end - INTERVAL_S * (n_hist - 1 - i) for i in range(n_hist)),
        num_requests=tuple(requests * (0.5 + 0.5 * i / n_hist) for i in range(n_hist)),
        avg_isl_tokens=(1000.0,) * n_hist,
        avg_osl_tokens=(150.0,) * n_hist,
        interval_s=INTERVAL_S,
    )
    return Observation(
        taken_at_s=t_end, interval_s=INTERVAL_S, num_requests=requests, avg_isl_tokens=1000.0,
        avg_osl_tokens=150.0, avg_ttft_ms=60.0, avg_itl_ms=6.0, history=hist,
        pods=(PodMetrics("worker-prefill-0", "prefill", 0.2, 0.0), PodMetrics("worker-decode-0", "decode", 0.3, 0.0)),
        stale_reasons=stale,
    )


def _config(tmp_path: Path, profile_dir: Path, namespace: str) -> PlannerRunConfig:
    return PlannerRunConfig(
        planner=PlannerConfig(namespace=namespace, profile=ProfileConfig(dir=str(profile_dir))),
        connector=LocalConnectorConfig(state_path=str(tmp_path / f"{namespace}.json")),
    )


def _api(call):
    import anyio
    from prefect.client.orchestration import get_client

    async def run():
        async with get_client() as client:
            return await call(client)

    return anyio.run(run)


def _plan(cfg: PlannerRunConfig, requests: float, *, now_s: float = NOW_S, stale: tuple[str, ...] = (), **kwargs):
    """One planner run on a given observation; its final state."""
    from flows.planner_flow import planner_flow

    return planner_flow(config=cfg, replay=ReplayInputs(observation=_observation(requests, t_end=now_s, stale=stale), now_s=now_s),
                        return_state=True, **kwargs)


def _run_and_artifacts(state) -> tuple[object, dict]:
    """The flow run as the API reports it and its artifacts by key."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    run_id = state.state_details.flow_run_id
    run = _api(lambda c: c.read_flow_run(run_id))
    arts = _api(lambda c: c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
        any_=[run_id]))))
    return run, {a.key: a for a in arts}


def test_run_name_and_final_message_say_what_the_run_did(prefect_harness, tmp_path, h200_profile_dir):
    cfg = _config(tmp_path, h200_profile_dir, "ui-names")
    # 3,000 requests/min of ISL 1000 (~40 ms of H200 prefill each): more prefill than one replica serves in 200 ms.
    state = _plan(cfg, 3000.0)
    out = state.result()
    run, _ = _run_and_artifacts(state)
    p, d = out["decision"]["prefill_replicas"], out["decision"]["decode_replicas"]
    assert p > 1
    decode = f"1→{d}" if d != 1 else "1"
    # NOW_S is 01:18:20 UTC: the interval that ends at 01:18.
    assert run.name == f"01:18 prefill 1→{p} decode {decode}"
    assert run.state.type.value == "COMPLETED"
    # The connector's first run, on an hour of history: a warm start, said in the message.
    assert run.state.message == "scaled up: TTFT forecast" + (", ITL forecast" if d > 1 else "") + " (warm start)"

    held = _plan(cfg, 3000.0, now_s=NOW_S + INTERVAL_S, stale=("prometheus: no frontend samples in the last 180 s",))
    run, _ = _run_and_artifacts(held)
    assert run.state.message == "held: stale data"
    assert run.name == f"01:19 prefill {p} decode {d}"


def test_live_and_what_if_runs_write_their_own_keys(prefect_harness, tmp_path, h200_profile_dir):
    cfg = _config(tmp_path, h200_profile_dir, "ui-keys")
    live, live_arts = _run_and_artifacts(_plan(cfg, 600.0))
    assert set(live_arts) == {"sla-planner-decision-ui-keys", "sla-planner-summary-ui-keys", "sla-planner-chart-ui-keys"}
    what_if_keys = {"sla-planner-what-if-decision-ui-keys", "sla-planner-what-if-summary-ui-keys",
                    "sla-planner-what-if-chart-ui-keys"}
    for kwargs in ({"dry_run": True}, {"what_if": WhatIf(load_multiplier=4.0)}):
        run, arts = _run_and_artifacts(_plan(cfg, 600.0, **kwargs))
        assert set(arts) == what_if_keys, kwargs
        assert run.name.endswith("(what-if)" if "what_if" in kwargs else "(dry run)")
        assert run.state.message.startswith("what-if, " if "what_if" in kwargs else "dry run, ")


def test_chart_is_an_image_artifact_that_decodes_to_a_png(prefect_harness, tmp_path, h200_profile_dir):
    from PIL import Image

    from flows.charts import CHART_SIZE_PX

    cfg = _config(tmp_path, h200_profile_dir, "ui-chart")
    # Two runs: the second has the first's applied decision and recommendation to draw.
    _plan(cfg, 3000.0, now_s=NOW_S - INTERVAL_S)
    _, arts = _run_and_artifacts(_plan(cfg, 3000.0))
    chart = arts["sla-planner-chart-ui-chart"]
    assert chart.type == "image"
    head, _, payload = chart.data.partition(",")
    assert head == "data:image/png;base64"
    png = base64.b64decode(payload)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    image = Image.open(io.BytesIO(png))
    assert image.size == CHART_SIZE_PX
    # Not a blank canvas: the load line and the replica steps put many colours in it.
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or ()) > 50


def test_decision_table_cells_show_every_reason_in_full(prefect_harness, tmp_path, h200_profile_dir):
    cfg = _config(tmp_path, h200_profile_dir, "ui-table")
    state = _plan(cfg, 3000.0)
    out = state.result()
    _, arts = _run_and_artifacts(state)
    rows = json.loads(arts["sla-planner-decision-ui-table"].data)
    # The UI cuts a cell's line at the column edge: every line fits, words unsplit.
    for r in rows:
        for line in r["detail"].split("  \n"):
            assert len(line) <= CELL_WIDTH_CHARS or " " not in line, line
    shown = [(r["item"], r["value"], r["detail"].replace("  \n", " ")) for r in rows]
    long = [r for r in out["decision"]["reasons"] if len(r["message"]) > CELL_WIDTH_CHARS]
    assert long, "no reason longer than a line: the test would not see a cut"
    for reason in out["decision"]["reasons"]:
        assert any(item == f"reason {reason['code']}" and value == (reason["pool"] or "both")
                   and detail.startswith(reason["message"]) for item, value, detail in shown), reason


def _parameter_schema(entrypoint: str) -> dict:
    from prefect.flows import load_flow_from_entrypoint
    from prefect.utilities.callables import parameter_schema

    flow = load_flow_from_entrypoint(str(ROOT / entrypoint))
    return parameter_schema(flow).model_dump()


def test_deployment_forms_describe_every_field_and_hide_internals():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    entrypoints = {d["name"]: d["entrypoint"] for d in spec["deployments"]}
    assert "what-if" in entrypoints
    for name in ("planner", "what-if"):
        schema = _parameter_schema(entrypoints[name])
        props = schema["properties"]
        undescribed = [k for k, v in props.items() if not v.get("description")]
        assert not undescribed, f"{name}: form fields without a description: {undescribed}"
    planner = _parameter_schema(entrypoints["planner"])["properties"]
    assert not {"now_s", "observation"} & set(planner), sorted(planner)
    assert planner["replay"]["description"].startswith("advanced")
    what_if = _parameter_schema(entrypoints["what-if"])["properties"]
    assert {"trace", "profile_dir", "ttft_ms", "itl_ms", "load_multiplier", "jitter_s", "policies"} <= set(what_if)
    assert what_if["jitter_s"]["default"] == 30.0


# -- the stack's Prometheus: planner gauges scraped from a Pushgateway, recording rules ---------------------

RULES = ROOT / "stack" / "prometheus-rules.yml"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")
def test_recording_rules_load_and_compute_the_planner_series(tmp_path):
    check = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    # promtool's rule unit test: the real rule engine on given series.
    labels = 'namespace="dynamo", model="m", job="planner", instance="pg"'
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": f'sla_planner_interval_seconds{{{labels}}}', "values": "60 60 60"},
                {"series": f'sla_planner_observed_requests{{{labels}}}', "values": "600 1200 1800"},
                {"series": f'sla_planner_predicted_requests{{{labels}}}', "values": "900 1500 2100"},
                {"series": f'sla_planner_predicted_requests_p90{{{labels}}}', "values": "1200 1800 2400"},
                {"series": f'sla_planner_desired_replicas{{{labels}, pool="prefill"}}', "values": "1 2 3"},
                {"series": f'sla_planner_current_replicas{{{labels}, pool="prefill"}}', "values": "1 1 2"},
            ],
            "promql_expr_test": [
                {"expr": "sla_planner:observed_requests_per_second", "eval_time": "2m",
                 "exp_samples": [{"labels": f'sla_planner:observed_requests_per_second{{{labels}}}', "value": 30}]},
                {"expr": "sla_planner:predicted_requests_per_second:p90", "eval_time": "2m",
                 "exp_samples": [{"labels": f'sla_planner:predicted_requests_per_second:p90{{{labels}}}',
                                  "value": 40}]},
                {"expr": "sla_planner:replicas_pending", "eval_time": "2m",
                 "exp_samples": [{"labels": f'sla_planner:replicas_pending{{{labels}, pool="prefill"}}',
                                  "value": 1}]},
            ],
        }],
    }
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(yaml.safe_dump(tests))
    run = subprocess.run(["promtool", "test", "rules", str(test_file)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_stack_scrapes_the_planner_gauges_and_loads_the_rules(tmp_path):
    from planner_cli.stack_components import StackOptions, write_planner_config, write_prometheus_config

    opts = StackOptions(state_dir=str(tmp_path), pushgateway_port=19091)
    prom_file = write_prometheus_config(opts, tmp_path)
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "config", str(prom_file)], capture_output=True, text=True)
        assert check.returncode == 0 and "SUCCESS: 8 rules found" in check.stdout, check.stdout + check.stderr
    prom = yaml.safe_load(prom_file.read_text())
    assert prom["rule_files"] == [str(RULES)]
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["planner"]["honor_labels"] is True
    assert jobs["planner"]["static_configs"] == [{"targets": ["127.0.0.1:19091"]}]
    planner = write_planner_config(opts, tmp_path)
    assert planner.planner_metrics.enabled
    assert planner.planner_metrics.pushgateway_url == "http://127.0.0.1:19091"


def test_what_if_deployment_run_shows_the_policy_against_oracle_best_static_and_hindsight(prefect_harness, tmp_path):
    from PIL import Image

    from sim.whatif.flow import what_if_compare_flow

    # Three minutes of the bundled trace at twice its load: the oracle's sweeps stay quick.
    state = what_if_compare_flow(
        trace=str(ROOT / "data" / "traces" / "azure2023_conv.csv.gz"),
        profile_dir=str(ROOT / "data" / "profiles" / "h200_llama8b_fp8_tp1"),
        load_multiplier=2.0, policies=("planner", "static:1x1"), duration_min=3.0, output_dir=str(tmp_path),
        return_state=True)
    out = state.result()
    run, arts = _run_and_artifacts(state)
    assert run.name == "what-if ('planner', 'static:1x1') x2.0 jitter 30.0 s, TTFT 200.0 ms ITL 10.0 ms"
    assert run.state.message.startswith("planner ") and "oracle " in run.state.message
    assert out["oracle_gpu_hours"] > 0
    table = arts["what-if-compare"].data
    for label in ("| planner |", "| static:1x1 |", "| oracle |"):
        assert label in table, table
    assert ("| best static " in table) == (out["best_static"] is not None)
    assert ("| hindsight-reactive " in table) == (out["hindsight_reactive"] is not None)
    assert "Hindsight-reactive: each interval's exact need" in table and "tried: w=1 " in table
    image = arts["what-if-compare-misses"]
    assert image.type == "image"
    png = base64.b64decode(image.data.partition(",")[2])
    assert Image.open(io.BytesIO(png)).size == (1000, 750)


def test_planner_gauges_carry_the_series_the_rules_read():
    from connectors.planner_metrics import PlannerMetrics
    from planner.types import Decision, FleetState, Forecast, PoolState

    metrics = PlannerMetrics(namespace="dynamo", model_id="m")
    metrics.update(now_s=NOW_S, observation=_observation(600.0, t_end=NOW_S), forecast=Forecast(650, 1000, 150, 800, "x"),
                   fleet=FleetState(PoolState(2, 1), PoolState(3, 3)),
                   decision=Decision(3, 3, True, (), recommended_prefill_replicas=4, recommended_decode_replicas=2))
    text = metrics.render().decode()
    # An advisory run (planner.mode advisory) exports its targets on their own gauge, which one rule reads.
    advisory = PlannerMetrics(namespace="dynamo", model_id="m")
    advisory.update(now_s=NOW_S, observation=_observation(600.0, t_end=NOW_S), forecast=Forecast(650, 1000, 150, 800, "x"),
                    fleet=FleetState(PoolState(2, 1), PoolState(3, 3)), decision=Decision(3, 3, True, ()), advisory=True)
    advisory_text = advisory.render().decode()
    assert 'sla_planner_advisory_replicas{model="m",namespace="dynamo",pool="decode"} 3.0' in advisory_text
    assert "\nsla_planner_advisory_replicas{" not in text
    assert 'sla_planner_interval_seconds{model="m",namespace="dynamo"} 60.0' in text
    assert 'sla_planner_recommended_replicas{model="m",namespace="dynamo",pool="prefill"} 4.0' in text
    assert 'sla_planner_recommended_replicas{model="m",namespace="dynamo",pool="decode"} 2.0' in text
    # Every series a recording rule reads is exported.
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    import re

    read = {name for r in rules for name in re.findall(r"\bsla_planner_[a-z_0-9]+", r["expr"])}
    assert read and all(f"\n{name}{{" in text + advisory_text for name in read), sorted(read)


def test_decision_table_shows_the_length_spread_it_sized_on(prefect_harness, tmp_path, h200_profile_dir):
    """The frontend's length histograms in the collect rows, the CVs they gave in predict, 'measured' in sizing."""
    import dataclasses

    import numpy as np

    from flows.planner_flow import planner_flow
    from planner.signals.length_shape import DYNAMO_ISL_BOUNDS_TOKENS, DYNAMO_OSL_BOUNDS_TOKENS, histogram_of

    rng = np.random.default_rng(0)
    obs = dataclasses.replace(
        _observation(3000.0, t_end=NOW_S),
        isl_histogram=histogram_of(rng.gamma(0.25, 4000.0, 3000), DYNAMO_ISL_BOUNDS_TOKENS, window_s=1800.0),
        osl_histogram=histogram_of(rng.gamma(1.0, 150.0, 3000), DYNAMO_OSL_BOUNDS_TOKENS, window_s=1800.0),
    )
    cfg = _config(tmp_path, h200_profile_dir, "ui-lengths")
    state = planner_flow(config=cfg, replay=ReplayInputs(observation=obs, now_s=NOW_S), return_state=True)
    _, arts = _run_and_artifacts(state)
    rows = {r["item"]: r for r in json.loads(arts["sla-planner-decision-ui-lengths"].data)}
    assert rows["length histograms"]["value"] == "3000 prompts in 1800 s"
    isl_cv, ctx_cv = (float(x) for x in rows["length CV (ISL / decode context)"]["value"].split(" / "))
    assert 1.6 < isl_cv < 2.4 and 0 < ctx_cv <= isl_cv  # Gamma shape 0.25: CV 2
    import re

    sized = re.search(r"CV ([0-9.]+) measured", rows["prefill replicas for SLA"]["detail"].replace("  \n", " "))
    assert sized and float(sized.group(1)) == pytest.approx(isl_cv, abs=0.01)
    assert "measured" in rows["decode replicas for SLA"]["detail"].replace("  \n", " ")


def test_length_notes_and_peak_notes_each_in_their_own_row(prefect_harness, tmp_path, h200_profile_dir):
    """Why the histograms were not read goes to the histogram row; the peak rate's notes stay on the peak row."""
    import dataclasses

    from flows.planner_flow import planner_flow

    obs = dataclasses.replace(
        _observation(3000.0, t_end=NOW_S), peak_rps=None,
        notes=("peak_rps: queries.peak_rps is empty; sub-interval bursts not measured",),
        length_notes=("isl_buckets: no bucket series at t=1; configured length CVs used",),
    )
    cfg = _config(tmp_path, h200_profile_dir, "ui-length-notes")
    state = planner_flow(config=cfg, replay=ReplayInputs(observation=obs, now_s=NOW_S), return_state=True)
    _, arts = _run_and_artifacts(state)
    rows = {r["item"]: r for r in json.loads(arts["sla-planner-decision-ui-length-notes"].data)}
    assert rows["length histograms"]["value"] == "not read"
    assert "isl_buckets: no bucket series" in rows["length histograms"]["detail"].replace("  \n", " ")
    peak = rows["peak arrival rate"]["detail"].replace("  \n", " ")
    assert "sub-interval bursts not measured" in peak and "isl_buckets" not in peak
    assert "length CV (ISL / decode context)" not in rows


def test_decision_table_says_how_many_requests_met_the_ttft_target(prefect_harness, tmp_path, h200_profile_dir):
    """The collect rows: the interval's share of first tokens within the run's TTFT target, and where it was read."""
    import dataclasses

    import numpy as np

    from flows.planner_flow import planner_flow
    from planner.signals.slo_attainment import ttft_histogram_of

    ttft_s = np.concatenate([np.full(900, 0.05), np.full(60, 0.15), np.full(40, 0.9)])  # 200 ms: 90-96% by the buckets
    obs = dataclasses.replace(_observation(1000.0, t_end=NOW_S), ttft_histogram=ttft_histogram_of(ttft_s))
    cfg = _config(tmp_path, h200_profile_dir, "ui-ttft-met")
    state = planner_flow(config=cfg, replay=ReplayInputs(observation=obs, now_s=NOW_S), return_state=True)
    _, arts = _run_and_artifacts(state)
    rows = {r["item"]: r for r in json.loads(arts["sla-planner-decision-ui-ttft-met"].data)}
    met = rows["TTFT target met"]
    assert 90.0 < float(met["value"][:-1]) < 96.0, met
    detail = met["detail"].replace("  \n", " ")
    assert "1000 first tokens, TTFT <= 200 ms" in detail and "0.1-0.22 s bucket" in detail
    assert "between 90.0% within 0.1 s and 96.0% within 0.22 s" in detail
    assert rows["ITL target met (token gaps)"]["value"] == "not read"  # this observation has no ITL histogram


def test_itl_row_gives_the_share_of_token_gaps_within_the_target():
    """The frontend's ITL histogram counts token gaps: the row says so, and that the SLA holds each request's mean."""
    import dataclasses

    from flows.report import _itl_met
    from planner.config import SloTarget
    from planner.signals.slo_attainment import DYNAMO_ITL_BOUNDS_S, ttft_histogram_of

    gaps = ttft_histogram_of([0.004] * 900 + [0.008] * 60 + [0.03] * 40, DYNAMO_ITL_BOUNDS_S)
    obs = dataclasses.replace(_observation(100.0, t_end=NOW_S), itl_histogram=gaps)
    value, detail = _itl_met(obs, SloTarget(ttft_ms=200, itl_ms=10))
    assert 90.0 < float(value[:-1]) < 96.0
    assert detail.startswith("1000 token gaps (one per output token after the first), each <= 10 ms")
    assert "between 90.0% within 0.0059 s and 96.0% within 0.011 s" in detail and "mean gap" in detail
    assert _itl_met(dataclasses.replace(obs, itl_histogram=None, itl_note="itl_buckets: query empty"),
                    SloTarget(ttft_ms=200, itl_ms=10)) == ("not read", "itl_buckets: query empty")


def test_window_rows_give_both_shares_over_the_slo_window():
    """The trailing SLO window's rows: named by the window's length, read as the interval's, notes where not read."""
    from flows.report import _window_rows
    from planner.config import SloTarget
    from planner.signals.slo_attainment import ttft_histogram_of
    from planner.types import LatencyWindow

    w = LatencyWindow(1800.0, ttft_histogram_of([0.05] * 99 + [3.0]), None,
                      ("itl_window_buckets: no bucket series at t=100",))
    (t_item, t_value, t_detail), (i_item, i_value, i_detail) = _window_rows(w, SloTarget(ttft_ms=200, itl_ms=10))
    assert (t_item, t_value) == ("TTFT target met, last 30 min", "99.0%")
    assert t_detail.startswith("100 first tokens, TTFT <= 200 ms") and "able to meet" not in t_detail
    t_detail = _window_rows(w, SloTarget(ttft_ms=200, itl_ms=10), reachable=0.5)[0][2]
    assert t_detail.endswith("prefill sizing counts 50.0% of requests able to meet it on any fleet")
    assert (i_item, i_value, i_detail) == ("ITL target met (token gaps), last 30 min", "not read",
                                           "itl_window_buckets: no bucket series at t=100")


def test_ttft_row_says_how_many_requests_could_meet_the_target_at_all():
    """Where prefill sizing counts prompts too long for the target on any fleet, the row says so beside the share."""
    import dataclasses

    from flows.report import _ttft_met
    from planner.config import SloTarget
    from planner.signals.slo_attainment import ttft_histogram_of

    obs = dataclasses.replace(_observation(100.0, t_end=NOW_S), ttft_histogram=ttft_histogram_of([0.05] * 47 + [3.0] * 53))
    value, detail = _ttft_met(obs, SloTarget(ttft_ms=200, itl_ms=10), reachable=0.5623)
    assert value == "47.0%" and detail.endswith("prefill sizing counts 56.2% of requests able to meet it on any fleet")
    assert "able to meet" not in _ttft_met(obs, SloTarget(ttft_ms=200, itl_ms=10), reachable=1.0)[1]
    assert _ttft_met(dataclasses.replace(obs, ttft_histogram=None, ttft_note="ttft_buckets: query empty"),
                     SloTarget(ttft_ms=200, itl_ms=10)) == ("not read", "ttft_buckets: query empty")


@pytest.mark.parametrize("z, value, basis", [
    (None, "n/a", "sized on the p90 forecast: arrival clumping not measured yet"),
    (1.0, "1.00", "sized on the mean forecast: arrivals look independent"),
    (5.0, "25.00", "sized on the p90 forecast: arrivals clump"),
])
def test_decision_table_says_which_forecast_sizing_used_and_why(prefect_harness, tmp_path, h200_profile_dir,
                                                                z, value, basis):
    """The clumping index and the basis it picked in their own row; the run's data names the basis."""
    import dataclasses

    from flows.planner_flow import planner_flow

    obs = _observation(3000.0, t_end=NOW_S)
    if z is not None:
        # The history rises 25 requests a minute: a trend of 25/4 x 3/8 in the last 15 s window; each busiest
        # window z Poisson standard deviations above the mean window and the trend.
        peaks = tuple((n / 4 + 25 * 3 / 32 + z * (n / 4) ** 0.5) / 15.0 for n in obs.history.num_requests)
        obs = dataclasses.replace(obs, peak_rps=peaks[-1], peak_window_s=15.0,
                                  history=dataclasses.replace(obs.history, peak_rps=peaks, peak_window_s=15.0))
    cfg = _config(tmp_path, h200_profile_dir, "ui-clumping")
    state = planner_flow(config=cfg, replay=ReplayInputs(observation=obs, now_s=NOW_S), return_state=True)
    _, arts = _run_and_artifacts(state)
    rows = {r["item"]: r for r in json.loads(arts["sla-planner-decision-ui-clumping"].data)}
    row = rows["arrival clumping (sizing basis)"]
    assert row["value"] == value and basis in row["detail"].replace("  \n", " ")
    assert "clumping" not in rows["requests next interval (mean / p90)"]["detail"]
    assert state.result()["forecast"]["sized_on"] == basis.split(" ")[3]
