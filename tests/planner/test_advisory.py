"""Advisory mode's core: the comparison with the running autoscaler and the fleet an advisory run decides from."""

from __future__ import annotations

import pytest

from planner.advisory import advisory_fleet, changes, compare, compare_run, value_at
from planner.types import Decision, DecisionRecord, FleetState, PoolState

STEP_S = 60.0
NOW_S = 6000.0
ONE_GPU = {"prefill": 1, "decode": 1}


@pytest.mark.parametrize("t_s, expected", [
    pytest.param(120.0, 2, id="at a row: its value"),
    pytest.param(150.0, 2, id="30 s after it, within the 60 s step: still its value"),
    pytest.param(180.0, None, id="60 s after it with no newer row: a gap, unknown"),
    pytest.param(240.0, 5, id="the next row"),
    pytest.param(60.0, None, id="before the first row: unknown"),
    pytest.param(300.0, None, id="a row whose pool is None: unknown"),
    pytest.param(240.0005, 5, id="Prometheus' millisecond stamps: 0.5 ms after counts at the grid point"),
])
def test_value_at_holds_a_row_for_one_step_at_most(t_s, expected):
    rows = [(120.0, 2, 1), (240.0, 5, 1), (300.0, None, 1)]
    assert value_at(rows, t_s, pool="prefill", max_age_s=STEP_S) == expected


def _flat(start_s: float, end_s: float, prefill: int, decode: int) -> list:
    return [(t, prefill, decode) for t in range(int(start_s), int(end_s) + 1, int(STEP_S))]


def test_compare_counts_gpu_hours_and_intervals_where_both_are_known():
    # Window 600 s: grid 5460, 5520, ..., 6000 (10 points). The advisory's history covers the last 6 points
    # (5700..6000); the autoscaler's all 10: 1+1 replicas until 5700, 3+2 from 5760.
    ours = _flat(5700, 6000, 2, 2)
    theirs = _flat(5460, 5700, 1, 1) + _flat(5760, 6000, 3, 2)
    c = compare(ours, theirs, now_s=NOW_S, window_s=600.0, step_s=STEP_S, gpus_per_replica={"prefill": 1, "decode": 2})
    # Both known at 5700..6000: 6 intervals. At 5700: ours 2x1 + 2x2 = 6 GPUs vs 1x1 + 1x2 = 3 (more);
    # 5760..6000 (5): 6 vs 3x1 + 2x2 = 7 (fewer).
    assert c.intervals == 6
    assert (c.more_intervals, c.fewer_intervals, c.same_intervals) == (1, 5, 0)
    # GPU-hours: ours 6 GPUs x 6 min = 0.6; theirs 3 x 1 min + 7 x 5 min = 38 GPU-min = 0.6333.
    assert c.advisory_gpu_hours == pytest.approx(0.6)
    assert c.autoscaler_gpu_hours == pytest.approx(38 / 60)
    # Per pool: prefill ours 2 vs 1 (more) once, vs 3 (fewer) five times; decode 2 vs 1 once more, 2 vs 2 five same.
    p, d = c.pools["prefill"], c.pools["decode"]
    assert (p.more_intervals, p.fewer_intervals, p.same_intervals) == (1, 5, 0)
    assert (d.more_intervals, d.fewer_intervals, d.same_intervals) == (1, 0, 5)
    assert p.advisory_gpu_hours == pytest.approx(12 / 60) and p.autoscaler_gpu_hours == pytest.approx(16 / 60)
    assert c.now_difference == {"prefill": -1, "decode": 0}


def test_compare_with_no_advisory_history_has_no_interval_but_this_run():
    c = compare([(NOW_S, 4, 2)], _flat(5460, 6000, 3, 3), now_s=NOW_S, window_s=600.0, step_s=STEP_S,
                gpus_per_replica=ONE_GPU)
    # Only now is known on both sides: 6 GPUs vs 6, one interval of 1 min = 0.1 GPU-h each.
    assert (c.intervals, c.same_intervals) == (1, 1)
    assert c.advisory_gpu_hours == pytest.approx(0.1) == c.autoscaler_gpu_hours
    assert c.now_difference == {"prefill": 1, "decode": -1}


def test_compare_refuses_a_window_shorter_than_a_step():
    with pytest.raises(ValueError, match="advisory comparison: need 0 < step_s <= window_s, got step 60.0 s, window 30.0 s"):
        compare([], [], now_s=NOW_S, window_s=30.0, step_s=STEP_S, gpus_per_replica=ONE_GPU)


def test_compare_run_ends_each_history_with_this_run():
    fleet = FleetState(prefill=PoolState(3, 3, 2), decode=PoolState(4, 4, 1))
    decision = Decision(prefill_replicas=2, decode_replicas=5, apply=True, reasons=())
    c = compare_run(decision, fleet, advisory=[], autoscaler=[], now_s=NOW_S, window_s=600.0, step_s=STEP_S)
    # ours 2x2 + 5x1 = 9 GPUs, theirs 3x2 + 4x1 = 10 over one minute.
    assert c.advisory_now == {"prefill": 2, "decode": 5} and c.autoscaler_now == {"prefill": 3, "decode": 4}
    assert c.advisory_gpu_hours == pytest.approx(9 / 60) and c.autoscaler_gpu_hours == pytest.approx(10 / 60)
    assert c.fewer_intervals == 1


def test_changes_keep_the_rows_where_the_replicas_moved():
    rows = [(0.0, 1, 1), (60.0, 1, 1), (120.0, None, 1), (180.0, 2, 1), (240.0, 2, 1), (300.0, 2, 3)]
    assert changes(rows) == ((0.0, 1, 1), (180.0, 2, 1), (300.0, 2, 3))


def test_advisory_fleet_decides_from_the_autoscaler_with_our_recommendations():
    fleet = FleetState(prefill=PoolState(3, 3), decode=PoolState(4, 4),
                       last_decision=DecisionRecord(7, 100.0, 5, 5, done=False),
                       recent_targets=((100.0, 5, 5),), applied_targets=((100.0, 5, 5),))
    out = advisory_fleet(fleet, autoscaler=[(0.0, 1, 2), (60.0, 3, 4), (120.0, 3, 4)],
                         recommended=[(60.0, 2, 2), (120.0, None, 2), (180.0, 3, 2)])
    assert out.prefill == fleet.prefill and out.decode == fleet.decode
    assert out.last_decision is None  # an old applying decision is not waited for: nothing of ours is applied
    assert out.applied_targets == ((0.0, 1, 2), (60.0, 3, 4))
    assert out.recent_targets == ((60.0, 2, 2), (180.0, 3, 2))
