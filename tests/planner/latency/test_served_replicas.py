"""The replicas that served an interval (planner.latency.served), table tests in the style of Kubernetes' HPA
replica calculator tests: each case a decision history, an interval and the time-weighted ready replicas."""

from __future__ import annotations

import pytest

from planner.latency.served import interval_replicas, ready_at, served_replicas
from planner.types import FleetState, PoolState

STARTUP_S = 60.0

# (name, applied decisions (t_s, prefill, decode) oldest first, pool, interval start, end, expected)
CASES = [
    ("steady fleet", [(0.0, 2, 3)], "prefill", 600.0, 660.0, 2.0),
    ("steady fleet, decode", [(0.0, 2, 3)], "decode", 600.0, 660.0, 3.0),
    # The measured problem: scaled up at the run that opened the interval, ready as it ends.
    ("scale-up at the interval's start serves from its end", [(0.0, 1, 1), (600.0, 4, 1)], "prefill",
     600.0, 660.0, 1.0),
    ("that scale-up, the next interval", [(0.0, 1, 1), (600.0, 4, 1)], "prefill", 660.0, 720.0, 4.0),
    ("scale-up mid-interval (fast path) still starting", [(0.0, 2, 1), (630.0, 5, 1)], "prefill",
     600.0, 660.0, 2.0),
    ("scale-up ready mid-interval", [(0.0, 2, 1), (570.0, 5, 1)], "prefill", 600.0, 660.0, (30 * 2 + 30 * 5) / 60),
    ("scale-down takes effect at once", [(0.0, 4, 2), (615.0, 1, 2)], "prefill", 600.0, 660.0,
     (15 * 4 + 45 * 1) / 60),
    ("scale-up then a smaller one before the first is ready", [(0.0, 1, 1), (540.0, 6, 1), (570.0, 3, 1)],
     "prefill", 570.0, 630.0, (30 * 1 + 30 * 3) / 60),
    ("decode pool moves, prefill does not", [(0.0, 2, 2), (600.0, 2, 6)], "prefill", 600.0, 660.0, 2.0),
    ("before the oldest decision: its targets", [(900.0, 3, 3)], "prefill", 600.0, 660.0, 3.0),
]


@pytest.mark.parametrize("name,applied,pool,start,end,expected", CASES, ids=[c[0] for c in CASES])
def test_served_replicas_table(name, applied, pool, start, end, expected):
    assert served_replicas(applied, pool, start_s=start, end_s=end, startup_s=STARTUP_S) == pytest.approx(expected)


def test_ready_at_a_scale_up_turns_ready_after_startup():
    applied = [(0.0, 1, 1), (100.0, 3, 1)]
    assert [ready_at(applied, "prefill", t, startup_s=STARTUP_S) for t in (99.0, 100.0, 159.9, 160.0)] == [1, 1, 1, 3]


def test_no_decisions_is_none_and_the_fleet_falls_back_to_current_replicas():
    assert served_replicas([], "prefill", start_s=0.0, end_s=60.0, startup_s=STARTUP_S) is None
    fleet = FleetState(prefill=PoolState(4, 2), decode=PoolState(3, 3))
    replicas, note = interval_replicas(fleet, end_s=660.0, interval_s=60.0, startup_s=STARTUP_S)
    assert replicas == {"prefill": 4.0, "decode": 3.0}
    assert "no applied decisions" in note


def test_interval_replicas_reads_the_applied_decisions():
    fleet = FleetState(prefill=PoolState(4, 4), decode=PoolState(2, 2),
                       applied_targets=((0.0, 1, 2), (600.0, 4, 2)))
    replicas, note = interval_replicas(fleet, end_s=660.0, interval_s=60.0, startup_s=STARTUP_S)
    assert replicas == {"prefill": 1.0, "decode": 2.0}
    assert "prefill 1" in note and "startup 60 s" in note


@pytest.mark.parametrize("kwargs,message", [
    (dict(pool="both", start_s=0.0, end_s=60.0, startup_s=60.0), "pool must be one of prefill, decode, got 'both'"),
    (dict(pool="prefill", start_s=60.0, end_s=60.0, startup_s=60.0), "need start_s < end_s, got 60 .. 60"),
    (dict(pool="prefill", start_s=0.0, end_s=60.0, startup_s=-1.0), "startup_s must be >= 0, got -1"),
])
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        served_replicas([(0.0, 1, 1)], **kwargs)


def test_decisions_out_of_order_are_refused():
    with pytest.raises(ValueError, match="oldest first"):
        served_replicas([(60.0, 1, 1), (0.0, 2, 2)], "prefill", start_s=0.0, end_s=60.0, startup_s=60.0)
