"""Arrival clumping and the sizing basis it picks (planner.signals.clumping, predictor.size_on: auto).

Hand cases use square window counts: 400 requests in a 60 s interval have 100 in the mean 15 s
window, one Poisson standard deviation is 10, so a busiest window of 110 (7.333 rps) is z = 1.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from pydantic import ValidationError

from planner.signals import clumping
from planner.signals.clumping import clumping_index, interval_clumping, quantile_words, recent_clumping_index, sizing_basis
from planner.config import PlannerConfig, PredictorConfig, ProfileConfig
from planner.steps import interpolate_replicas, predict_load
from planner.types import Corrections, LoadHistory, Observation
from sim.replay import ReplaySettings, peak_rate_rps
from tests.support.fixtures_profile import linear_engine
from tests.planner.signals.test_sizing_burst import hist  # the same per-interval history, 15 s peaks

NAN = float("nan")


STEP_FROM_560 = (560 - 400 - 2 * 960 ** 0.5) / 4  # 24.51: a step beyond 2 SDs of the counts' difference


@pytest.mark.parametrize("n, peak_count, previous, after, expected", [
    pytest.param(400, 110, 400, None, 1.0, id="z = (110 - 100) / 10 = 1"),
    pytest.param(400, 130, 400, None, 9.0, id="z = 3 -> 9"),
    pytest.param(400, 95, 400, None, 0.0, id="peak below the mean window -> 0"),
    # a trend from 240 to 400 raises the last window by 160/4 x 3/8 = 15 without clumping
    pytest.param(400, 125, 240, None, 1.0, id="trend 15 taken off: (125 - 100 - 15) / 10"),
    # from 460 the trend is 60/4 x 3/8 = 5.625; the step (60 - 2 sqrt(860)) / 4 = 0.34 is within the noise
    pytest.param(400, 115.625, 460, None, 1.0, id="a falling trend counts the same"),
    pytest.param(400, 110, 0, None, 0.0, id="after an empty interval the trend covers it"),
    # the interval started at the previous interval's rate: its first window may hold 560/4 = 140
    pytest.param(400, 125, 560, None, ((25 - STEP_FROM_560) / 10) ** 2, id="a step down from the previous rate"),
    # a burst starting inside the interval: the next interval's rate, (1200 - 400 - 2 x 40) / 4 = 180
    pytest.param(400, 300, 400, 1200, 4.0, id="a burst starting inside: (300 - 100 - 180) / 10 = 2"),
    pytest.param(400, 300, 400, None, 400.0, id="the same peak with no next interval yet: z = 20"),
    pytest.param(400, 110, 400, 450, 1.0, id="a next count within the noise: no step"),
])
def test_interval_clumping_by_hand(n, peak_count, previous, after, expected):
    got = interval_clumping(num_requests=n, peak_rps=peak_count / 15.0, previous_requests=previous,
                            next_requests=after, interval_s=60.0, window_s=15.0)
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("kw", [
    dict(num_requests=0.0), dict(num_requests=NAN), dict(peak_rps=None), dict(peak_rps=-1.0),
    dict(previous_requests=NAN), dict(next_requests=NAN), dict(window_s=60.0), dict(window_s=0.0),
])
def test_interval_clumping_without_a_reading(kw):
    base = dict(num_requests=400.0, peak_rps=110 / 15, previous_requests=400.0, interval_s=60.0, window_s=15.0)
    base.update(kw)
    assert interval_clumping(**base) is None


def test_index_is_a_quantile_over_the_lookback():
    # d per interval: 1, 9, 0, 1 (the empty interval is skipped; the next one's trend is against 400)
    h = hist([400, 400, 0, 400, 400], [110 / 15, 130 / 15, 0.0, 95 / 15, 110 / 15])
    index, note = clumping_index(h, lookback_intervals=10, min_intervals=4, quantile=0.5)
    assert index == pytest.approx(1.0) and "median over 4 intervals" in note  # too few to leave the newest out
    last2, note = clumping_index(h, lookback_intervals=2, min_intervals=2, quantile=0.5)
    assert last2 == pytest.approx(4.5) and "median over 2 intervals" in note  # 9 and 0: the newest (1) left out
    # The default, the 40th percentile (linear between order statistics): 0 + 0.4 x (9 - 0) over 9 and 0.
    last2, note = clumping_index(h, lookback_intervals=2, min_intervals=2)
    assert last2 == pytest.approx(3.6) and "40th percentile over 2 intervals" in note
    # 0, 1, 1, 9: the 40th percentile sits at 1.2 of 3 steps, on the 1s.
    assert clumping_index(h, lookback_intervals=10, min_intervals=4)[0] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "quantile, words",
    [(0.5, "median"), (0.4, "40th percentile"), (0.33, "33rd percentile"), (0.21, "21st percentile"),
     (0.12, "12th percentile"), (0.11, "11th percentile"), (0.02, "2nd percentile"), (0.125, "12.5th percentile"),
     (0.9, "90th percentile")],
)
def test_the_note_names_the_quantile_in_words(quantile, words):
    assert quantile_words(quantile) == words
    h = hist([400, 400, 0, 400, 400], [110 / 15, 130 / 15, 0.0, 95 / 15, 110 / 15])
    assert f"({words} over 4 intervals" in clumping_index(h, lookback_intervals=10, min_intervals=4, quantile=quantile)[1]


def test_a_run_of_clumpy_intervals_is_not_persistent_clumping():
    # Independent tenants' sub-minute bursts (Azure code's) clump a few intervals in a row; synchronised
    # copies clump in nearly every one. Ten intervals: four with a clump (190 in the busiest window of 100: d = 81), six without (d = 1).
    runs = hist([400.0] * 11, [110 / 15] * 6 + [190 / 15] * 4 + [110 / 15])
    index, _ = clumping_index(runs, lookback_intervals=10, min_intervals=4)
    assert index == pytest.approx(1.0)
    assert clumping_index(runs, lookback_intervals=10, min_intervals=4, quantile=0.7)[0] == pytest.approx(81.0)
    persistent = hist([400.0] * 11, [110 / 15] * 3 + [190 / 15] * 8)
    assert clumping_index(persistent, lookback_intervals=10, min_intervals=4)[0] == pytest.approx(81.0)


# Two clumpy intervals (190 in the busiest window of 100: d = 81) after quiet ones (d = 1), read over 2 intervals:
# this run's index 81, the run before's 1 + 0.4 x 80 = 33 (one clumpy of its two), the one before that 1.
TWO_CLUMPS = hist([400.0] * 7, [110 / 15] * 4 + [190 / 15] * 2 + [110 / 15])


@pytest.mark.parametrize("history, runs, expected, lowest_of", [
    pytest.param(TWO_CLUMPS, 1, 81.0, None, id="1 run: this run's reading alone"),
    pytest.param(TWO_CLUMPS, 2, 33.0, 2, id="2 runs: the run before read less"),
    pytest.param(TWO_CLUMPS, 3, 1.0, 3, id="3 runs: the one before that read none"),
    pytest.param(hist([400.0] * 7, [190 / 15] * 7), 3, 81.0, None, id="clumping that lasts reads the same"),
    pytest.param(hist([400.0] * 2, [110 / 15, 190 / 15]), 3, 33.0, None,
                 id="earlier runs without a reading (too few intervals) do not count"),
])
def test_recent_clumping_index_is_the_lowest_of_the_last_runs(history, runs, expected, lowest_of):
    index, note = recent_clumping_index(history, runs=runs, lookback_intervals=2, min_intervals=2)
    assert index == pytest.approx(expected)
    assert (f"the lowest of the last {lowest_of} runs'" in note) == (lowest_of is not None), note
    assert recent_clumping_index(None, runs=2, lookback_intervals=2, min_intervals=2)[0] is None
    with pytest.raises(ValueError, match="runs must be >= 1, got 0"):
        recent_clumping_index(history, runs=0, lookback_intervals=2, min_intervals=2)


@pytest.mark.parametrize("runs, basis", [(1, "p90"), (2, "mean")])
def test_the_pipeline_takes_the_p90_once_enough_runs_read_clumping(runs, basis):
    cfg = PredictorConfig(name="constant", clumping_lookback_intervals=2, clumping_min_intervals=2,
                          clumping_max_index=50.0, clumping_runs=runs)
    f = predict_load(_obs(TWO_CLUMPS), cfg)
    assert any(f"sized on the {basis} forecast" in n for n in f.notes), f.notes
    assert f.sized_on == basis  # decided once, by the predict step; interpolate sizes on what it carries


def test_a_burst_starting_in_the_newest_interval_waits_for_the_next_to_be_read():
    # Steady 400 a minute with z = 1 (d = 1) per minute, then a burst starting inside the newest:
    # 300 in its busiest window reads d = 400 without a next interval (test_interval_clumping_by_hand).
    steady = [400.0] * 6
    h = hist(steady + [400.0], [110 / 15] * 6 + [300 / 15])
    index, note = clumping_index(h, lookback_intervals=2, min_intervals=2, quantile=0.5)
    assert index == pytest.approx(1.0) and "median over 2 intervals" in note  # with it: the median of 400 and 1
    # Once the next interval shows the step (1,200), the burst interval reads d = 4, the step taken off.
    h = hist(steady + [400.0, 1200.0], [110 / 15] * 6 + [300 / 15, 330 / 15])
    index, _ = clumping_index(h, lookback_intervals=2, min_intervals=2, quantile=0.5)
    assert index == pytest.approx((1.0 + 4.0) / 2)


@pytest.mark.parametrize("h, why", [
    pytest.param(hist([400] * 5, None, window_s=None), "no peak-rate signal", id="no peak signal"),
    pytest.param(hist([400, 400, 400], [110 / 15] * 3), "3 intervals with requests and a peak rate, 4 needed", id="too few intervals"),
    pytest.param(hist([400, NAN, 400, 400], [110 / 15, NAN, NAN, 110 / 15]), "2 intervals",
                 id="unknown counts and peaks are skipped"),
])
def test_index_unknown_says_why(h, why):
    index, note = clumping_index(h, lookback_intervals=10, min_intervals=4)
    assert index is None and why in note


def test_index_rejects_bad_settings():
    with pytest.raises(ValueError, match="lookback_intervals and min_intervals must be >= 1, got 0"):
        clumping_index(hist([400], [7.0]), lookback_intervals=0, min_intervals=1)
    with pytest.raises(ValueError, match="quantile must be in \\(0, 1\\), got 1.0"):
        clumping_index(hist([400], [7.0]), lookback_intervals=1, min_intervals=1, quantile=1.0)


def _clumped_history(clump: int, *, rps: float, minutes: int, seed: int) -> LoadHistory:
    """Arrivals at `rps` in clumps of `clump` within 1 s (1: Poisson), read as the simulator's collect step reads."""
    rng = np.random.default_rng(seed)
    starts = np.cumsum(rng.exponential(clump / rps, size=int(rps / clump * 60 * minutes * 1.2)))
    arrivals = np.sort((starts[:, None] + rng.uniform(0.0, 1.0, size=(starts.size, clump))).ravel())
    arrivals = arrivals[arrivals < 60.0 * minutes]
    ends = 60.0 * np.arange(1, minutes + 1)
    counts = np.histogram(arrivals, bins=np.concatenate(([0.0], ends)))[0].astype(float)
    peaks = [peak_rate_rps(arrivals, end_s=e, scenario=ReplaySettings()) for e in ends]
    return hist(list(counts), peaks)


def _bursty_history(*, seed: int, minutes: int = 12, clump: int = 1) -> LoadHistory:
    """Bursts like Azure code's: 50 rps for 40-150 s, then 3 rps for 40-150 s, switching at any second of a
    minute; independent (Poisson) arrivals within each stretch, in clumps of `clump` within 1 s."""
    rng = np.random.default_rng(seed)
    edges = np.cumsum(rng.uniform(40.0, 150.0, size=4 * minutes))
    edges = np.concatenate(([0.0], edges[edges < 60.0 * minutes], [60.0 * minutes]))
    parts = []
    for i, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        starts = rng.uniform(a, b, size=rng.poisson((50.0 if i % 2 else 3.0) / clump * (b - a)))
        parts.append((starts[:, None] + (rng.uniform(0.0, 1.0, size=(starts.size, clump)) if clump > 1 else 0.0)).ravel())
    arrivals = np.sort(np.concatenate(parts))
    arrivals = arrivals[arrivals < 60.0 * minutes]
    ends = 60.0 * np.arange(1, minutes + 1)
    counts = np.histogram(arrivals, bins=np.concatenate(([0.0], ends)))[0].astype(float)
    return hist(list(counts), [peak_rate_rps(arrivals, end_s=e, scenario=ReplaySettings()) for e in ends])


def test_bursts_starting_and_ending_inside_minutes_are_not_clumps(monkeypatch):
    max_index = PredictorConfig().clumping_max_index
    histories = [_bursty_history(seed=seed) for seed in range(5)]

    def median_index() -> float:
        return float(np.median([clumping_index(h, lookback_intervals=10, min_intervals=4)[0] for h in histories]))

    assert median_index() < max_index
    # Read against the previous minute's linear trend alone, a burst's onset or end looks like a clump
    # (Azure code x8's independent tenants read 22 so, and were sized on the p90 band).
    monkeypatch.setattr(clumping, "STEP_SIGMAS", math.inf)
    assert median_index() > max_index


def test_clumps_on_a_load_that_jumps_read_as_independent():
    # The price of the step allowance and the low quantile (docs/sizing.md): next to a significant step an
    # interval carries no evidence of clumping, and most of the last ten must show it. Clumps of 8 on a
    # load jumping between 3 and 50 rps every 40-150 s read below the threshold; the median read 0-4.4.
    max_index = PredictorConfig().clumping_max_index
    clumped = [clumping_index(_bursty_history(seed=seed, clump=8), lookback_intervals=10, min_intervals=4)[0]
               for seed in range(5)]
    assert max(clumped) < max_index, clumped
    at_median = [clumping_index(_bursty_history(seed=seed, clump=8), lookback_intervals=10, min_intervals=4,
                                quantile=0.5)[0] for seed in range(5)]
    assert max(at_median) > max_index, at_median


def _median_index(clump: int, rps: float) -> float:
    """The index over 10 minutes, median over 5 seeds (one 10-minute reading varies: 0.4-2.4 for Poisson at 40 rps)."""
    return float(np.median([clumping_index(_clumped_history(clump, rps=rps, minutes=10, seed=seed),
                                           lookback_intervals=10, min_intervals=4)[0] for seed in range(5)]))


def test_independent_arrivals_read_below_the_default_threshold_and_clumps_above():
    max_index = PredictorConfig().clumping_max_index
    independent = {rps: _median_index(1, rps) for rps in (2.0, 40.0)}
    assert all(0.3 < v < max_index for v in independent.values()), independent
    eight = _median_index(8, 40.0)
    assert eight > 2 * max_index, eight
    # Pairs of copies sit between: above independent arrivals at the same rate.
    assert independent[2.0] < _median_index(2, 2.0) < eight


@pytest.mark.parametrize("size_on, index, expected, why", [
    ("auto", 1.3, "mean", "arrivals look independent (clumping 1.30 < 1.8)"),
    ("auto", 1.8, "p90", "arrivals clump (clumping 1.80 >= 1.8)"),
    ("auto", 11.0, "p90", "arrivals clump"),
    ("auto", None, "p90", "arrival clumping not measured yet"),
    ("mean", 11.0, "mean", "predictor.size_on"),
    ("p90", 1.0, "p90", "predictor.size_on"),
])
def test_sizing_basis(size_on, index, expected, why):
    basis, note = sizing_basis(size_on, index, max_index=1.8)
    assert basis == expected and why in note


def test_sizing_basis_rejects_an_unknown_basis():
    with pytest.raises(ValueError, match="size_on must be 'mean', 'p90' or 'auto', got 'p99'"):
        sizing_basis("p99", 1.0, max_index=2.2)


def test_config_defaults_and_checks():
    cfg = PredictorConfig()
    assert (cfg.size_on, cfg.clumping_lookback_intervals, cfg.clumping_min_intervals, cfg.clumping_quantile,
            cfg.clumping_max_index, cfg.clumping_runs) == ("auto", 10, 4, 0.4, 1.7, 2)
    with pytest.raises(ValidationError, match="clumping_min_intervals \\(11\\) must not exceed"):
        PredictorConfig(clumping_min_intervals=11)
    with pytest.raises(ValidationError, match="size_on"):
        PredictorConfig(size_on="p99")


def _obs(history: LoadHistory) -> Observation:
    return Observation(taken_at_s=history.t_s[-1], interval_s=60.0, num_requests=history.num_requests[-1],
                       avg_isl_tokens=1000.0, avg_osl_tokens=200.0, avg_ttft_ms=100.0, avg_itl_ms=10.0,
                       peak_rps=history.peak_rps[-1], peak_window_s=15.0, history=history)


@pytest.mark.parametrize("peak_count, basis", [(110, "mean"), (130, "p90")])
def test_the_pipeline_sizes_on_the_basis_the_forecast_notes(peak_count, basis):
    cfg = PlannerConfig(profile=ProfileConfig(dir="x"), predictor={"name": "constant", "params": {
        "constant": {}}})
    h = hist([400.0] * 6, [peak_count / 15.0] * 6)
    f = predict_load(_obs(h), cfg.predictor)
    assert f.clumping_index == pytest.approx(((peak_count - 100) / 10) ** 2)
    assert any(f"sized on the {basis} forecast" in n for n in f.notes), f.notes
    # The constant predictor's band is wide enough here that the p90 asks for more requests than the mean.
    f = dataclasses.replace(f, num_requests_p90=2 * f.num_requests)
    sizing = interpolate_replicas(f, corrections=Corrections(), profile=linear_engine(), cfg=cfg)
    expected = f.num_requests if basis == "mean" else None
    for pool in ("prefill", "decode"):
        requests = sizing[pool].numbers["requests"]
        assert requests == pytest.approx(expected) if expected is not None else requests > 2 * f.num_requests


def test_fixed_basis_measures_nothing():
    cfg = PlannerConfig(profile=ProfileConfig(dir="x"), predictor={"name": "constant", "size_on": "p90"})
    f = predict_load(_obs(hist([400.0] * 6, [110 / 15] * 6)), cfg.predictor)
    assert f.clumping_index is None and not any(n.startswith("clumping") for n in f.notes)
    assert f.sized_on == "p90"


@pytest.mark.parametrize("index, independent_basis, burst_sized", [
    (1.0, None, True),  # burst sizing on either basis by default
    (1.0, "off", False),  # arrivals look independent: the independent basis applies
    (5.0, "off", True),  # clumped: sized on the p90, burst_basis as configured
])
def test_the_burst_basis_while_arrivals_look_independent(index, independent_basis, burst_sized):
    cfg = PlannerConfig(profile=ProfileConfig(dir="x"), predictor={"name": "constant"},
                        sizing={"independent_burst_basis": independent_basis})
    # Three quarters of each interval's requests in its busiest 15 s: a burst the history shows.
    f = predict_load(_obs(hist([400.0] * 6, [300 / 15] * 6)), cfg.predictor)
    # the basis the predict step would have chosen at that index (it travels on the forecast)
    f = dataclasses.replace(f, clumping_index=index,
                            sized_on=sizing_basis("auto", index, max_index=cfg.predictor.clumping_max_index)[0])
    prefill = interpolate_replicas(f, corrections=Corrections(), profile=linear_engine(), cfg=cfg)["prefill"]
    assert prefill.numbers["sized_on_mean"] == float(index < 1.8)
    assert ("replicas_for_burst" in prefill.numbers) == burst_sized, prefill.message


def test_independent_burst_basis_is_checked():
    with pytest.raises(ValidationError, match="independent_burst_basis"):
        PlannerConfig(profile=ProfileConfig(dir="x"), sizing={"independent_burst_basis": "sometimes"})
