"""The warm-up's floor: what the warm-up trace's last window needed holds a just-started planner's fleet."""

from __future__ import annotations

import math

import pytest

from connectors.profiles import load_profile_dir
from planner.config import DecisionConfig, PlannerConfig, PredictorConfig, ProfileConfig
from planner.types import LoadHistory, Observation, ReasonCode
from planner.pipeline import plan_interval
from planner.decision.stabilization import start_from_warmup
from planner.steps import interval_load, size_for_load, size_warmup_floor
from planner.types import FleetState, PoolState

INTERVAL_S = 60.0
# A quiet warm-up whose third-newest interval is a burst: 300 requests/minute around a 3,000 one.
WARM = [300] * 7 + [3000, 300, 300]
HPA_ONLY = DecisionConfig(scale_down_floor_s=None)


def history(counts, *, start_s: float = 0.0) -> LoadHistory:
    n = len(counts)
    return LoadHistory(
        t_s=tuple(start_s + INTERVAL_S * (i + 1) for i in range(n)), num_requests=tuple(float(c) for c in counts),
        avg_isl_tokens=(2000.0,) * n, avg_osl_tokens=(200.0,) * n, interval_s=INTERVAL_S,
        peak_rps=tuple(c / INTERVAL_S for c in counts), peak_window_s=15.0,
    )


def live(counts) -> Observation:
    h = history(counts, start_s=3600.0)
    return Observation(taken_at_s=h.t_s[-1], interval_s=INTERVAL_S, num_requests=h.num_requests[-1],
                       avg_isl_tokens=2000.0, avg_osl_tokens=200.0, avg_ttft_ms=None, avg_itl_ms=None, history=h)


@pytest.fixture(scope="module")
def setup(request):
    profile_dir = request.getfixturevalue("h200_profile_dir")
    # HPA's 300 s window alone: the default's hour-long scale-down floor has its own tests below.
    cfg = PlannerConfig(profile=ProfileConfig(dir=str(profile_dir)), predictor=PredictorConfig(name="kalman"),
                        decision=HPA_ONLY)
    return cfg, load_profile_dir(profile_dir)


def sized(setup, counts, j):
    cfg, profile = setup
    return size_for_load(interval_load(history(counts), j), cfg, profile)


@pytest.mark.parametrize(
    "collected, intervals, with_burst",
    [
        pytest.param(1, 4, True, id="1 collected of the 300 s window's 5: the warm-up's last 4 count, the burst too"),
        pytest.param(2, 3, True, id="2 collected: the last 3, the burst the oldest of them"),
        pytest.param(3, 2, False, id="3 collected: the burst has left the window"),
        pytest.param(4, 1, False, id="4 collected: the warm-up's last interval alone"),
    ],
)
def test_the_floor_is_the_window_share_of_the_warmup_and_fades(setup, collected, intervals, with_burst):
    cfg, profile = setup
    floor = size_warmup_floor(live([300] * collected), history(WARM), cfg, profile)
    counted = [sized(setup, WARM, j) for j in range(len(WARM) - intervals, len(WARM))]
    assert floor.intervals == intervals and floor.window_s == 300.0
    assert floor.targets == {p: max(c[p] for c in counted) for p in ("prefill", "decode")}
    burst, quiet = sized(setup, WARM, 7), sized(setup, WARM, 9)
    assert burst["prefill"] > quiet["prefill"]  # the case means something: the burst needs more
    assert floor.targets["prefill"] == (burst if with_burst else quiet)["prefill"]


def test_the_window_is_the_longest_hold(setup):
    """With independent_stabilization_s 420 s the warm-up stands in for 7 intervals less those collected."""
    cfg, profile = setup
    longer = cfg.model_copy(update={"decision": DecisionConfig(independent_stabilization_s=420.0,
                                                                   scale_down_floor_s=None)})
    assert size_warmup_floor(live([300] * 3), history(WARM), longer, profile).intervals == 4
    assert size_warmup_floor(live([300] * 3), history(WARM), cfg, profile).intervals == 2


@pytest.mark.parametrize(
    "collected, warm, why",
    [
        pytest.param([300] * 5, WARM, "the planner's own history fills the window", id="window filled"),
        pytest.param([300], None, "no warm-up trace", id="no warm-up"),
        pytest.param([math.nan, math.nan], WARM, "no live load data: a warm-up never stands in for absent metrics",
                     id="no live load data"),
        pytest.param([300], [0, 0, 0], "the warm-up's intervals hold no requests to size", id="empty warm-up"),
    ],
)
def test_no_floor(setup, collected, warm, why):
    cfg, profile = setup
    warmup = None if warm is None else history([math.nan if c == 0 else c for c in warm])
    assert size_warmup_floor(live(collected), warmup, cfg, profile) is None, why


def test_a_store_keeps_each_warmup_intervals_sizing(setup):
    cfg, profile = setup
    store: dict = {}
    first = size_warmup_floor(live([300]), history(WARM), cfg, profile, sized=store)
    assert sorted(store) == [6, 7, 8, 9]
    store[9] = {"prefill": 11, "decode": 1}  # what is stored is what counts: it is not sized again
    assert size_warmup_floor(live([300]), history(WARM), cfg, profile, sized=store).targets["prefill"] == 11
    assert first == size_warmup_floor(live([300]), history(WARM), cfg, profile)


def test_sizing_respects_the_bounds(setup):
    cfg, profile = setup
    capped = cfg.model_copy(update={"decision": DecisionConfig(prefill={"min_replicas": 1, "max_replicas": 2})})
    assert size_for_load(interval_load(history(WARM), 7), capped, profile)["prefill"] == 2
    assert ReasonCode.WARMUP_START_FLOOR.value == "warmup_start_floor"


def test_the_scale_down_floor_counts_its_share_of_its_longer_window(setup):
    """With a 600 s floor at 75%, the burst 3 intervals back counts at 75% once it has left the 300 s window."""
    cfg, profile = setup
    floored = cfg.model_copy(update={"decision": DecisionConfig(scale_down_floor_s=600.0, scale_down_floor_frac=0.75)})
    burst, quiet = sized(setup, WARM, 7), sized(setup, WARM, 9)
    floor = size_warmup_floor(live([300] * 3), history(WARM), floored, profile)
    assert (floor.intervals, floor.window_s, floor.floor_frac) == (7, 600.0, 0.75)
    assert floor.targets["prefill"] == max(quiet["prefill"], math.ceil(burst["prefill"] * 0.75))
    assert math.ceil(burst["prefill"] * 0.75) > quiet["prefill"]  # the case means something: the share binds
    # Once the planner's own history fills the floor's window too, no floor.
    assert size_warmup_floor(live([300] * 10), history(WARM), floored, profile) is None
    assert size_warmup_floor(live([300] * 3), history(WARM), cfg, profile).floor_frac is None
    # The default: an hour at half, so the whole ten-minute warm-up counts, the burst at half.
    default = size_warmup_floor(live([300] * 3), history(WARM), cfg.model_copy(update={"decision": DecisionConfig()}),
                           profile)
    assert (default.window_s, default.floor_frac, default.intervals) == (3600.0, 0.5, len(WARM))
    assert default.targets["prefill"] == max(quiet["prefill"], math.ceil(burst["prefill"] * 0.5))


def test_the_warmup_is_sized_at_its_peaks_whatever_the_basis_for_independent_arrivals(setup):
    """The burst arrives in its busiest 15 s: flat sizing for independent arrivals would read it at its minute's
    mean; the floor sizes the warm-up with the burst basis either way."""
    cfg, profile = setup
    peaky = history(WARM)
    peaky = LoadHistory(t_s=peaky.t_s, num_requests=peaky.num_requests, avg_isl_tokens=peaky.avg_isl_tokens,
                        avg_osl_tokens=peaky.avg_osl_tokens, interval_s=INTERVAL_S, peak_window_s=15.0,
                        peak_rps=tuple(4 * c / INTERVAL_S if c > 1000 else c / INTERVAL_S for c in WARM))
    flat = cfg.model_copy(update={"sizing": cfg.sizing.model_copy(update={"independent_burst_basis": "off"})})
    burst = cfg.model_copy(update={"sizing": cfg.sizing.model_copy(update={"independent_burst_basis": None})})
    assert cfg.sizing.independent_burst_basis == "off"  # the default: flat for independent arrivals
    by_flat = size_for_load(interval_load(peaky, 7), flat, profile)["prefill"]
    at_peak = size_for_load(interval_load(peaky, 7), burst, profile)["prefill"]
    assert at_peak > by_flat  # the case means something: the burst basis asks more for the burst
    floor = size_warmup_floor(live([300]), peaky, flat, profile)
    assert floor.targets["prefill"] == at_peak == size_warmup_floor(live([300]), peaky, burst, profile).targets["prefill"]


def test_the_pipeline_runs_the_floor_as_a_step_on_scheduled_runs_only(setup):
    """plan_interval (the simulator's path; the flow's runs the same steps as tasks) sizes the floor itself
    from the warm-up it is given, and a fast-path run, which only adds over what is set, has none."""
    cfg, profile = setup
    obs, warmup = live([300]), history(WARM)
    fleet = FleetState(prefill=PoolState(1, 1), decode=PoolState(1, 1))
    scheduled = plan_interval(obs, fleet, cfg, profile, now_s=obs.taken_at_s, warmup=warmup)
    assert scheduled.start_floor == size_warmup_floor(obs, warmup, cfg, profile) is not None
    assert ReasonCode.WARMUP_START_FLOOR in [r.code for r in scheduled.decision.reasons]
    assert plan_interval(obs, fleet, cfg, profile, now_s=obs.taken_at_s, warmup=warmup, fast_path=True).start_floor is None
    assert plan_interval(obs, fleet, cfg, profile, now_s=obs.taken_at_s).start_floor is None



# The warm-up with its burst, the floor's share by the running floor's rule (planner.decision.stabilization.floor_share):
# WARM's 10th-percentile minute is 300 of the 3,000 burst (10%, at most the default's 25%): quiet spells.
STEADY = [2400] * 7 + [3000, 2400, 2400]  # 80% of the busiest: none
FLAT_RULE = {"scale_down_floor_quiet_share": None, "scale_down_floor_burst_frac": None}


@pytest.mark.parametrize("warm, sized_on, config, share, why", [
    pytest.param(WARM, "p90", {}, 1.0, "synchronised bursts: arrivals clump, quiet spells: its 10th-percentile "
                 "interval 10% of its busiest, <= 25%", id="clumping and quiet spells: all of the highest"),
    pytest.param(WARM, "mean", {}, 0.5, "arrivals look independent: sized on the mean forecast",
                 id="independent arrivals (sized on the mean): half"),
    pytest.param(WARM, None, {}, 0.5, "arrivals look independent", id="no forecast: half"),
    pytest.param(STEADY, "p90", {}, 0.5, "arrivals clump but no quiet spells: its 10th-percentile interval 80% of "
                 "its busiest, > 25%", id="clumping, a steady stream: half"),
    pytest.param(WARM, "p90", FLAT_RULE, 0.5, None, id="the burst share not configured: half, nothing said"),
    pytest.param(WARM, "p90", {"scale_down_floor_burst_frac": 0.75}, 0.75, "synchronised bursts",
                 id="a configured burst share of 75%"),
])
def test_the_warm_floor_takes_its_share_by_the_running_floors_rule(setup, warm, sized_on, config, share, why):
    cfg, profile = setup
    decision = cfg.model_copy(update={"decision": DecisionConfig(**config)})
    floor = size_warmup_floor(live([300] * 3), history(warm), decision, profile, sized_on=sized_on)
    burst, quiet = sized(setup, warm, 7), sized(setup, warm, 9)
    assert (floor.window_s, floor.floor_frac, floor.intervals) == (3600.0, share, len(warm))
    assert floor.targets["prefill"] == max(quiet["prefill"], math.ceil(burst["prefill"] * share - 1e-9))
    if why is None:
        assert floor.floor_why == ""
    else:
        assert why in floor.floor_why
    # The decision's reason says the share and why.
    raised, reasons = start_from_warmup({"prefill": 1, "decode": 1}, floor=floor)
    said = [r.message for r in reasons if r.pool == "prefill"]
    assert raised["prefill"] == floor.targets["prefill"] > 1 and len(said) == 1
    assert f"the scale-down floor's {share:.0%} of their highest counted" in said[0]
    assert why is None or why in said[0]


def test_the_burst_share_binds_the_warm_floor(setup):
    """The case means something: on WARM all of the burst is more than half of it, so the share moves the floor."""
    cfg, profile = setup
    default = cfg.model_copy(update={"decision": DecisionConfig()})
    clumped = size_warmup_floor(live([300] * 3), history(WARM), default, profile, sized_on="p90")
    mean = size_warmup_floor(live([300] * 3), history(WARM), default, profile, sized_on="mean")
    assert clumped.targets["prefill"] > mean.targets["prefill"]


def test_the_pipeline_gives_the_floor_this_runs_forecast_basis(setup):
    """plan_interval passes the predict step's sized_on to the warm-up floor step (the predict step runs first)."""
    cfg, profile = setup
    default = cfg.model_copy(update={"decision": DecisionConfig()})
    obs, warmup = live([300]), history(WARM)
    fleet = FleetState(prefill=PoolState(1, 1), decode=PoolState(1, 1))
    plan = plan_interval(obs, fleet, default, profile, now_s=obs.taken_at_s, warmup=warmup)
    assert plan.forecast is not None
    assert plan.start_floor == size_warmup_floor(obs, warmup, default, profile, sized_on=plan.forecast.sized_on)
    assert plan.start_floor.floor_frac == (1.0 if plan.forecast.sized_on != "mean" else 0.5)
