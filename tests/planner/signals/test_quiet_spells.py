"""Quiet spells in the arrivals (planner.signals.quiet_spells) and the scale-down floor's share for synchronised bursts."""

from __future__ import annotations

import dataclasses
import math

import pytest

from planner.config import DecisionConfig
from planner.decision.decide import decide
from planner.signals.quiet_spells import had_quiet_spell, quiet_share
from planner.types import FleetState, LoadHistory, Observation, PoolSizing, PoolState, ReasonCode

NOW = 10_000.0


def history(counts, *, end_s=NOW):
    """Per-minute arrivals, the last interval ending at end_s."""
    n = len(counts)
    return LoadHistory(t_s=tuple(end_s - 60.0 * (n - 1 - i) for i in range(n)), num_requests=tuple(counts),
                       avg_isl_tokens=(1000.0,) * n, avg_osl_tokens=(200.0,) * n, interval_s=60.0)


@pytest.mark.parametrize("counts, since_s, expected", [
    # np.quantile, linear: 11 points, the 10th percentile is the second smallest.
    pytest.param([100, 0, 0, 4000, 2000, 900, 300, 200, 300, 4000, 3000], 0.0, 0 / 4000,
                 id="bursts after quiet minutes: 0 of 4000"),
    pytest.param([400, 450, 460, 440, 450, 470, 440, 500, 490, 430, 40], 0.0, 400 / 500,
                 id="steady stream, one partial last minute: 2nd smallest 400 of 500 (the 40 is not a spell)"),
    pytest.param([1000, 2000], 0.0, (1000 + 0.1 * 1000) / 2000, id="two: 1000 + 0.1 x (2000 - 1000) over 2000"),
    pytest.param([5000, 10, 20, 30], NOW - 150.0, (10 + 0.2 * 10) / 30,
                 id="only the window's: 10, 20, 30 (the 5000 ended before it); 12 of 30"),
    pytest.param([100, math.nan, 200, 300], 0.0, (100 + 0.2 * 100) / 300, id="NaN left out: 100, 200, 300"),
    pytest.param([500], 0.0, None, id="one interval: too little to tell"),
    pytest.param([0, 0, 0], 0.0, None, id="nothing arrived: too little to tell"),
])
def test_quiet_share(counts, since_s, expected):
    got = quiet_share(history(counts), since_s=since_s)
    assert got == pytest.approx(expected) if expected is not None else got is None


def test_quiet_share_refuses_a_quantile_outside_0_1():
    with pytest.raises(ValueError, match="quantile must be within 0..1, got 1.5"):
        quiet_share(history([1, 2]), since_s=0.0, quantile=1.5)


@pytest.mark.parametrize("counts, quiet", [
    pytest.param([3000, 20, 0, 4000, 2000], True, id="quiet minutes: 0.4 x 20 = 8 of 4000 <= 0.25"),
    pytest.param([400, 450, 460, 440, 500], False, id="steady: 400 + 0.4 x 40 = 416 of 500 > 0.25"),
    pytest.param([500], True, id="too little history: quiet (the floor keeps holding)"),
])
def test_had_quiet_spell(counts, quiet):
    assert had_quiet_spell(history(counts), since_s=0.0, max_share=0.25)[0] is quiet
    assert had_quiet_spell(None, since_s=0.0, max_share=0.25) == (True, None)


def _decide(counts, *, clumping, **config):
    """Prefill 6 running, sized 2 now, 8 recommended 50 minutes ago: the 300 s window has let go; the floor
    (an hour) keeps ceil(0.5 x 8) = 4, or ceil(0.625 x 8) = 5 with the burst share while arrivals come in
    synchronised bursts (quiet spells, and sizing took the upper forecast: sized_on_mean 0)."""
    fleet = FleetState(prefill=PoolState(current_replicas=6, ready_replicas=6),
                       decode=PoolState(current_replicas=1, ready_replicas=1),
                       recent_targets=((NOW - 3000, 8, 1), (NOW - 200, 2, 1), (NOW - 100, 2, 1)))
    obs = Observation(taken_at_s=NOW, interval_s=60.0, num_requests=float(counts[-1]), avg_isl_tokens=1000.0,
                      avg_osl_tokens=200.0, avg_ttft_ms=120.0, avg_itl_ms=9.0)
    obs = dataclasses.replace(obs, history=history(counts))
    sizing = {p: PoolSizing(p, n, {"load_rps": 10.0, "sized_on_mean": 0.0 if clumping else 1.0}, f"{p} sized")
              for p, n in (("prefill", 2), ("decode", 1))}
    return decide(sizing=sizing, saturation=None, fleet=fleet, obs=obs, cfg=DecisionConfig(**config), now_s=NOW)


BURSTS = [3000, 20, 0, 4000, 2000, 300]  # the 10th percentile 10 of 4000: quiet spells
STEADY = [400, 450, 460, 440, 500, 480]  # 420 of 500: none
ASKED = {"scale_down_floor_quiet_share": 0.25, "scale_down_floor_burst_frac": 0.625}
# The default before the burst share (flat-floor): half, whatever the arrivals.
FLAT = {"scale_down_floor_quiet_share": None, "scale_down_floor_burst_frac": None}


@pytest.mark.parametrize("counts, clumping, config, expected", [
    pytest.param(BURSTS, True, FLAT, 4, id="not asked: half of 8"),
    pytest.param(BURSTS, True, ASKED, 5, id="quiet spells, clumping: the burst share, ceil(0.625 x 8) = 5"),
    pytest.param(BURSTS, False, ASKED, 4, id="quiet spells, independent arrivals (sized on the mean): half"),
    pytest.param(STEADY, True, ASKED, 4, id="clumping but a steady stream: half"),
])
def test_floor_keeps_the_burst_share_for_synchronised_bursts(counts, clumping, config, expected):
    d = _decide(counts, clumping=clumping, **config)
    assert d.prefill_replicas == expected
    floor = [r for r in d.reasons if r.code == ReasonCode.SCALE_DOWN_FLOOR and r.pool == "prefill"]
    assert len(floor) == 1 and floor[0].numbers["floor_frac"] == (0.625 if expected == 5 else 0.5)
    # The burst share says why: 0.5 x 20 = 10 requests of 4000 is 0% (0.25%) of the busiest.
    assert ("synchronised bursts: arrivals clump, quiet spells: its 10th-percentile interval 0% of its busiest, "
            "<= 25%" in floor[0].message) is (expected == 5)


def test_the_default_keeps_the_hours_highest_for_synchronised_bursts():
    """The default (quiet share 0.25, burst share 1): after quiet spells with clumping arrivals the floor keeps
    all of the hour's 8, never above the 6 running: held at 6; independent arrivals keep half, 4."""
    assert _decide(BURSTS, clumping=True).prefill_replicas == 6
    assert _decide(BURSTS, clumping=False).prefill_replicas == 4


@pytest.mark.parametrize("config, match", [
    pytest.param({"scale_down_floor_quiet_share": 0.0, "scale_down_floor_burst_frac": 0.75},
                 "scale_down_floor_quiet_share", id="share 0"),
    pytest.param({"scale_down_floor_quiet_share": None}, "go together: got 1.0 and None",
                 id="the quiet share off, the default burst share left on"),
])
def test_config_refuses(config, match):
    with pytest.raises(ValueError, match=match):
        DecisionConfig(**config)
