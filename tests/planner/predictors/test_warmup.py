"""predictor.warmup_trace_path (Dynamo's load_predictor_warmup_trace): a trace's load seeds a short history."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from connectors.config import LocalConnectorConfig
from flows.config import PlannerRunConfig, ReplayInputs, load_run_config
from planner.config import PlannerConfig, PredictorConfig, ProfileConfig
from planner.signals.clumping import sizing_basis
from planner.steps import needs_warmup, predict_load
from planner.predict import prime_history
from planner.types import LoadHistory, Observation
from workloads.traces import load_warmup_history

INTERVAL_S = 60.0


def history(counts, *, start_s: float = 600.0, peaks=None) -> LoadHistory:
    n = len(counts)
    return LoadHistory(
        t_s=tuple(start_s + INTERVAL_S * i for i in range(n)),
        num_requests=tuple(float(c) for c in counts),
        avg_isl_tokens=(1000.0,) * n,
        avg_osl_tokens=(150.0,) * n,
        interval_s=INTERVAL_S,
        peak_rps=None if peaks is None else tuple(peaks),
        peak_window_s=None if peaks is None else 15.0,
    )


def observation(hist: LoadHistory) -> Observation:
    return Observation(taken_at_s=hist.t_s[-1], interval_s=INTERVAL_S, num_requests=hist.num_requests[-1],
                       avg_isl_tokens=1000.0, avg_osl_tokens=150.0, avg_ttft_ms=60.0, avg_itl_ms=6.0,
                       history=hist)


def mooncake_trace(path: Path, counts: list[int]) -> Path:
    """A Mooncake JSONL trace with counts[i] requests in minute i (timestamps in ms)."""
    lines = [json.dumps({"timestamp": int(60_000 * i + 1000 * k), "input_length": 1000, "output_length": 150,
                         "hash_ids": [k]})
             for i, n in enumerate(counts) for k in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("warm, live, max_intervals, counts, t_s", [
    pytest.param([1, 2, 3], [10, 11], None, (1, 2, 3, 10, 11), (420, 480, 540, 600, 660),
                 id="all warm intervals, re-timed to end 60 s before the first live one"),
    pytest.param([1, 2, 3], [10, 11], 4, (2, 3, 10, 11), (480, 540, 600, 660),
                 id="max 4: the 2 newest warm + 2 live"),
    pytest.param([1, 2, 3], [10, 11], 2, (10, 11), (600, 660), id="max 2: live only"),
])
def test_prime_history_keeps_the_newest(warm, live, max_intervals, counts, t_s):
    primed = prime_history(history(warm, start_s=0.0), history(live), max_intervals=max_intervals)
    assert primed.num_requests == counts and primed.t_s == t_s


def test_prime_history_keeps_the_live_peak_rates():
    primed = prime_history(history([1, 2]), history([10, 11], peaks=[0.5, 0.7]))
    assert [None if math.isnan(p) else p for p in primed.peak_rps] == [None, None, 0.5, 0.7]
    assert primed.peak_window_s == 15.0


@pytest.mark.parametrize("warm_peaks, warm_window_s, expected", [
    pytest.param([2.0, 3.0], 15.0, [2.0, 3.0, 0.5, 0.7], id="read over the live window: kept"),
    pytest.param([2.0, 3.0], 30.0, [None, None, 0.5, 0.7], id="another window: unknown"),
    pytest.param(None, None, [None, None, 0.5, 0.7], id="none read: unknown"),
])
def test_prime_history_takes_the_warm_peak_rates_read_over_the_live_window(warm_peaks, warm_window_s, expected):
    warm = history([1, 2], start_s=0.0, peaks=warm_peaks)
    if warm_peaks is not None:
        warm = dataclasses.replace(warm, peak_window_s=warm_window_s)
    primed = prime_history(warm, history([10, 11], peaks=[0.5, 0.7]))
    assert [None if math.isnan(p) else p for p in primed.peak_rps] == expected
    assert primed.peak_window_s == 15.0


def spread_trace(path: Path, minutes: int, per_minute: int, *, burst_s: float | None) -> Path:
    """per_minute requests a minute, evenly spread over it or, with burst_s, all in its first burst_s seconds."""
    span_ms = 60_000 if burst_s is None else 1000 * burst_s
    lines = [json.dumps({"timestamp": int(60_000 * i + span_ms * k / per_minute), "input_length": 1000,
                         "output_length": 150}) for i in range(minutes) for k in range(per_minute)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("burst_s, sized_on", [
    pytest.param(None, "mean", id="evenly spread: independent, the mean"),
    pytest.param(2.0, "p90", id="each minute in 2 s: clumped, the p90"),
])
def test_a_warm_start_reads_the_arrival_clumping_from_the_trace(tmp_path, burst_s, sized_on):
    # Two collected intervals cannot tell how clumped arrivals are (the index needs 4), so a cold run sizes
    # on the p90. The warm-up's arrivals carry their peak rates over the live window: the first run reads
    # the index from them.
    cfg = PredictorConfig(name="constant", warmup_trace_path="w.jsonl")
    obs = observation(history([600, 600], peaks=[11.0, 11.0]))
    cold = predict_load(obs, cfg)
    assert cold.clumping_index is None
    trace = spread_trace(tmp_path / "w.jsonl", 12, 600, burst_s=burst_s)
    warm = predict_load(obs, cfg, warmup=load_warmup_history(str(trace), interval_s=INTERVAL_S, peak_window_s=15.0))
    assert warm.clumping_index is not None
    assert sizing_basis(cfg.size_on, warm.clumping_index, max_index=cfg.clumping_max_index)[0] == sized_on


def test_a_short_history_forecasts_with_the_model_once_warmed():
    cfg = PredictorConfig(name="kalman", min_history_points=5, burst_lookback_intervals=0,
                          warmup_trace_path="trace.jsonl")
    obs = observation(history([100, 110]))
    cold = predict_load(obs, cfg)
    assert cold.predictor == "constant"  # 2 points < min_history_points 5
    warm = predict_load(obs, cfg, warmup=history([100 + 5 * i for i in range(20)], start_s=0.0))
    assert warm.predictor == "kalman"
    assert warm.notes[0] == "warm-up trace: 20 intervals before the 2 collected"


@pytest.mark.parametrize("n_live, history_intervals, trace, expected", [
    pytest.param(2, 288, "t.jsonl", True, id="2 collected < 288"),
    pytest.param(288, 288, "t.jsonl", False, id="history full: Prometheus alone"),
    pytest.param(2, 288, None, False, id="no trace configured"),
])
def test_needs_warmup(n_live, history_intervals, trace, expected):
    cfg = PredictorConfig(history_intervals=history_intervals, warmup_trace_path=trace)
    assert needs_warmup(observation(history([5] * n_live)), cfg) is expected


def test_no_metrics_still_hold_with_a_warmup():
    nan = float("nan")
    obs = observation(history([nan, nan]))
    assert predict_load(obs, PredictorConfig(), warmup=history([5] * 10, start_s=0.0)) is None


def test_relative_trace_path_is_resolved_against_the_config_file(tmp_path, h200_profile_dir):
    (tmp_path / "cfg").mkdir()
    path = tmp_path / "cfg" / "planner.yaml"
    path.write_text(f"planner:\n  profile: {{dir: {h200_profile_dir}}}\n  predictor: {{warmup_trace_path: w.jsonl}}\n")
    assert load_run_config(path).planner.predictor.warmup_trace_path == str(tmp_path / "cfg" / "w.jsonl")


@pytest.fixture
def run_config(tmp_path: Path, h200_profile_dir: Path):
    def make(trace: Path | None) -> PlannerRunConfig:
        return PlannerRunConfig(
            planner=PlannerConfig(
                namespace="warm-ns",
                profile=ProfileConfig(dir=str(h200_profile_dir)),
                predictor=PredictorConfig(name="kalman", warmup_trace_path=None if trace is None else str(trace)),
            ),
            connector=LocalConnectorConfig(state_path=str(tmp_path / "fleet.json")),
        )

    return make


def test_the_flow_reads_the_trace_and_forecasts_from_it(prefect_harness, run_config, tmp_path):
    from flows.planner_flow import planner_flow

    obs = observation(history([3000, 3100]))
    cold = planner_flow(config=run_config(None), replay=ReplayInputs(observation=obs, now_s=720.0), dry_run=True)
    assert cold["forecast"]["predictor"] == "constant"
    trace = mooncake_trace(tmp_path / "warm.jsonl", [20 + i for i in range(12)])
    warm = planner_flow(config=run_config(trace), replay=ReplayInputs(observation=obs, now_s=720.0), dry_run=True)
    assert warm["forecast"]["predictor"] == "kalman"


def test_a_missing_trace_fails_the_run_naming_the_field(prefect_harness, run_config, tmp_path):
    from flows.planner_flow import planner_flow

    with pytest.raises(ValueError, match=r"predictor\.warmup_trace_path: .*missing\.jsonl: trace file not found"):
        planner_flow(config=run_config(tmp_path / "missing.jsonl"),
                     replay=ReplayInputs(observation=observation(history([5, 6])), now_s=720.0), dry_run=True)


def test_the_simulator_warms_the_predictor_from_the_trace_as_the_flow_does(prefect_harness, run_config, tmp_path,
                                                                          h200_profile_dir):
    # A what-if of a configuration with a warm-up trace must plan as the deployment would: the simulator's
    # planner policy reads the same trace and its first runs forecast with the model, not last value, giving
    # the forecast the flow gives for the same observation.
    from flows.planner_flow import planner_flow
    from connectors.profiles import load_profile_dir
    from planner.types import FleetState, PoolState
    from sim.policies import PlannerPolicy
    from sim.replay import PolicyInput

    trace = mooncake_trace(tmp_path / "warm.jsonl", [20 + i for i in range(12)])
    obs = observation(history([3000, 3100], peaks=[60.0, 62.0]))
    flow = planner_flow(config=run_config(trace), replay=ReplayInputs(observation=obs, now_s=720.0), dry_run=True)
    fleet = FleetState(prefill=PoolState(1, 1), decode=PoolState(1, 1))
    forecasts = {}
    for name, path in (("cold", None), ("warm", trace)):
        policy = PlannerPolicy(run_config(path).planner, load_profile_dir(h200_profile_dir))
        policy.decide(PolicyInput(now_s=720.0, observation=obs, fleet=fleet, interval_index=0))
        forecasts[name] = policy.last_plan.forecast
    assert forecasts["cold"].predictor == "constant"
    assert forecasts["warm"].predictor == flow["forecast"]["predictor"] == "kalman"
    assert forecasts["warm"].num_requests == pytest.approx(flow["forecast"]["num_requests"])
    # Both read the warm-up's peak rates over the live 15 s window: the clumping index from the first run.
    assert forecasts["cold"].clumping_index is None
    assert forecasts["warm"].clumping_index == pytest.approx(flow["forecast"]["clumping_index"])
    assert flow["forecast"]["clumping_index"] is not None
    assert any(note.startswith("warm-up trace: 12 intervals before the 2 collected") for note in forecasts["warm"].notes)


def test_a_what_if_with_a_missing_warmup_trace_fails_naming_the_field(run_config, tmp_path, h200_profile_dir):
    from connectors.profiles import load_profile_dir
    from sim.policies import PlannerPolicy

    with pytest.raises(ValueError, match=r"predictor\.warmup_trace_path: .*missing\.jsonl: trace file not found"):
        PlannerPolicy(run_config(tmp_path / "missing.jsonl").planner, load_profile_dir(h200_profile_dir))


def test_a_fresh_fleet_starts_where_the_warmups_last_window_held_it(prefect_harness, run_config, tmp_path,
                                                                   h200_profile_dir):
    # The warm-up's last minutes hold a burst; the first live minute is quiet, and sized on the mean forecast
    # without the burst sizing the planner would keep one prefill replica. One that had run through the
    # warm-up would hold the burst's replicas: the flow scales the fresh fleet (1, 1) up to them, says why,
    # and the simulator's planner decides the same.
    from connectors.profiles import load_profile_dir
    from flows.planner_flow import planner_flow
    from planner.types import FleetState, PoolState
    from planner.steps import size_warmup_floor
    from sim.policies import PlannerPolicy
    from sim.replay import PolicyInput

    counts = [300] * 10 + [3000, 300]
    lines = [json.dumps({"timestamp": int(60_000 * i + k * 60_000 / n), "input_length": 1000, "output_length": 150,
                         "hash_ids": [k]}) for i, n in enumerate(counts) for k in range(n)]
    trace = tmp_path / "burst.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    obs = observation(history([300]))

    def config(path):
        c = run_config(path)
        p = c.planner
        flat = p.model_copy(update={"predictor": p.predictor.model_copy(update={"size_on": "mean"}),
                                    "sizing": p.sizing.model_copy(update={"burst_basis": "off"})})
        return c.model_copy(update={"planner": flat})

    decisions = {}
    for name, path in (("cold", None), ("warm", trace)):
        out = planner_flow(config=config(path), replay=ReplayInputs(observation=obs, now_s=720.0), dry_run=True)
        decisions[name] = out["decision"]
    warm, cold = decisions["warm"], decisions["cold"]
    assert ("warmup_start_floor", "prefill") in [(r["code"], r["pool"]) for r in warm["reasons"]]
    assert "warmup_start_floor" not in [r["code"] for r in cold["reasons"]]
    assert warm["prefill_replicas"] > max(cold["prefill_replicas"], warm["recommended_prefill_replicas"])
    # The recommendation the window stores stays the sizing's: the floor is the warm-up's, not the planner's own.

    policy = PlannerPolicy(config(trace).planner, load_profile_dir(h200_profile_dir))
    fleet = FleetState(prefill=PoolState(1, 1), decode=PoolState(1, 1))
    out = policy.decide(PolicyInput(now_s=720.0, observation=obs, fleet=fleet, interval_index=0))
    assert (out.prefill_replicas, out.decode_replicas) == (warm["prefill_replicas"], warm["decode_replicas"])
    floor = policy.last_plan.start_floor
    # The default's hour-long scale-down floor counts the whole warm-up (its last 300 s in full, the rest at half).
    assert (floor.intervals, floor.window_s, floor.floor_frac) == (len(counts), 3600.0, 0.5)
    assert floor.targets["prefill"] == warm["prefill_replicas"]
    assert floor == size_warmup_floor(obs, policy._warmup_for(obs), policy.cfg, policy.profile)
