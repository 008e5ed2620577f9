"""Properties of `decide` over random fleets, sizings, pod metrics, histories and configs.

- every decision stays inside each pool's [min, max];
- it stays inside the GPU budget whenever the pool minimums fit in it;
- missing, stale or partial (frontends down) data never takes a pool below
  its current replicas (bounds and budget permitting);
- the guardrail never lets a pool drop below what it asked for, unless a hard
  limit (max replicas, GPU budget) forces it.
"""

from __future__ import annotations

import dataclasses
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.config import DecisionConfig, PoolBounds, SaturationThresholds
from planner.decision.decide import decide
from planner.saturation.guardrail import analyze_pool
from planner.types import (
    POOLS,
    DecisionRecord,
    FleetState,
    Observation,
    PodMetrics,
    PoolSizing,
    PoolState,
    ScrapeCoverage,
)

NOW = 50_000.0
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

metric_kv = st.one_of(st.none(), st.just(math.nan), st.floats(0.0, 1.0))
metric_queue = st.one_of(st.none(), st.just(math.nan), st.floats(0.0, 12.0))


@st.composite
def bounds(draw, allow_zero):
    lo = draw(st.integers(0 if allow_zero else 1, 8))
    return PoolBounds(min_replicas=lo, max_replicas=draw(st.integers(max(lo, 1), 20)))


@st.composite
def decision_configs(draw):
    allow_zero = draw(st.booleans())
    return DecisionConfig(
        prefill=draw(bounds(allow_zero)),
        decode=draw(bounds(allow_zero)),
        max_gpu_budget=draw(st.one_of(st.none(), st.integers(1, 80))),
        max_step_replicas=draw(st.one_of(st.none(), st.integers(1, 6))),
        scale_down_stabilization_s=draw(st.sampled_from([0.0, 300.0, 900.0])),
        wait_for_previous_s=draw(st.sampled_from([0.0, 600.0, 1800.0])),
        allow_scale_to_zero=allow_zero,
    )


@st.composite
def fleets(draw, *, with_last=True):
    def pool():
        current = draw(st.integers(0, 24))
        return PoolState(current_replicas=current, ready_replicas=draw(st.integers(0, current)),
                         gpus_per_replica=draw(st.sampled_from([1, 1, 2, 4, 8])))

    prefill, decode = pool(), pool()
    last = None
    if with_last and draw(st.booleans()):
        last = DecisionRecord(
            decision_id=draw(st.integers(1, 100)),
            decided_at_s=NOW - draw(st.floats(0, 4000)),
            prefill_replicas=draw(st.integers(0, 24)),
            decode_replicas=draw(st.integers(0, 24)),
            done=draw(st.booleans()),
        )
    history = draw(st.lists(
        st.tuples(st.floats(NOW - 1200, NOW), st.integers(0, 24), st.integers(0, 24)), max_size=6))
    return FleetState(prefill=prefill, decode=decode, last_decision=last, recent_targets=tuple(history))


@st.composite
def pods_for(draw, fleet: FleetState):
    out = []
    for pool in POOLS:
        n = getattr(fleet, pool).current_replicas
        reporting = draw(st.integers(max(0, n - 2), n))
        for i in range(reporting):
            out.append(PodMetrics(pod=f"{pool}-{i}", pool=pool, kv_usage_frac=draw(metric_kv),
                                  queue_length=draw(metric_queue)))
    return out


def observation(draw, pods, *, load_ok=True, stale=False):
    num = draw(st.floats(0, 5000)) if load_ok else draw(st.sampled_from([None, math.nan]))
    return Observation(
        taken_at_s=NOW - draw(st.floats(0, 60)), interval_s=60.0, num_requests=num,
        avg_isl_tokens=draw(st.one_of(st.none(), st.floats(1, 8000))) if not load_ok else 1000.0,
        avg_osl_tokens=200.0, avg_ttft_ms=None, avg_itl_ms=None, pods=tuple(pods),
        stale_reasons=("prometheus down",) if stale else (),
    )


def sizing_from(draw):
    return {p: PoolSizing(p, draw(st.integers(0, 40))) for p in POOLS}


def guardrail(fleet, pods, cfg, use):
    if not use:
        return None
    return {
        p: analyze_pool(pool=p, pods=pods, state=getattr(fleet, p), thresholds=SaturationThresholds(),
                        min_replicas=getattr(cfg, p).min_replicas, max_replicas=getattr(cfg, p).max_replicas)
        for p in POOLS
    }


def gpus(fleet, targets):
    return sum(targets[p] * getattr(fleet, p).gpus_per_replica for p in POOLS)


def targets_of(d):
    return {"prefill": d.prefill_replicas, "decode": d.decode_replicas}


@SETTINGS
@given(data=st.data())
def test_decisions_stay_within_bounds_and_budget(data):
    cfg = data.draw(decision_configs())
    fl = data.draw(fleets())
    pods = data.draw(pods_for(fl))
    o = observation(data.draw, pods, load_ok=data.draw(st.booleans()), stale=data.draw(st.booleans()))
    d = decide(sizing=sizing_from(data.draw), saturation=guardrail(fl, pods, cfg, data.draw(st.booleans())),
               fleet=fl, obs=o, cfg=cfg, now_s=NOW)
    out = targets_of(d)
    for p in POOLS:
        b = getattr(cfg, p)
        assert b.min_replicas <= out[p] <= b.max_replicas, (p, out, b, d.codes())
        if not cfg.allow_scale_to_zero:
            assert out[p] >= 1
    mins = {p: getattr(cfg, p).min_replicas for p in POOLS}
    if cfg.max_gpu_budget is not None and gpus(fl, mins) <= cfg.max_gpu_budget:
        assert gpus(fl, out) <= cfg.max_gpu_budget, (out, cfg.max_gpu_budget, d.codes())
    baseline = (
        {"prefill": fl.last_decision.prefill_replicas, "decode": fl.last_decision.decode_replicas}
        if {"hold_previous_not_done", "scale_up_past_pending"} & set(d.codes())  # what is set: the pending decision
        else {p: getattr(fl, p).current_replicas for p in POOLS}
    )
    assert d.apply == (out != baseline)


@st.composite
def unlimited_configs(draw):
    """Configs whose hard limits never bind: current replicas sit inside the bounds, no budget."""
    return DecisionConfig(
        prefill=PoolBounds(min_replicas=1, max_replicas=30),
        decode=PoolBounds(min_replicas=1, max_replicas=30),
        max_step_replicas=draw(st.one_of(st.none(), st.integers(1, 6))),
        scale_down_stabilization_s=draw(st.sampled_from([0.0, 300.0])),
    )


@SETTINGS
@given(data=st.data(), how=st.sampled_from(["load_missing", "stale", "pod_metrics_missing", "partial_scrape"]))
def test_missing_or_stale_data_never_reduces_replicas(data, how):
    cfg = data.draw(unlimited_configs())
    fl = data.draw(fleets(with_last=False))
    fl = FleetState(
        prefill=PoolState(max(1, fl.prefill.current_replicas), fl.prefill.ready_replicas, fl.prefill.gpus_per_replica),
        decode=PoolState(max(1, fl.decode.current_replicas), fl.decode.ready_replicas, fl.decode.gpus_per_replica),
        recent_targets=fl.recent_targets,
    )
    pods = data.draw(pods_for(fl))
    if how == "pod_metrics_missing":
        # one pod per pool goes silent; load data is fine, so sizing may ask for anything
        silenced = {f"{p}-0" for p in POOLS}
        pods = [PodMetrics(x.pod, x.pool, None, None) if x.pod in silenced else x for x in pods]
    o = observation(data.draw, pods, load_ok=how != "load_missing", stale=how == "stale")
    if how == "partial_scrape":
        # some of the frontends' targets down: the load looks smaller than it is; no guardrail to lean on
        expected = data.draw(st.integers(2, 6))
        o = dataclasses.replace(o, coverage=(ScrapeCoverage("frontend targets", expected,
                                                            data.draw(st.integers(0, expected - 1))),))
    sat = guardrail(fl, pods, cfg, how != "partial_scrape")
    d = decide(sizing=sizing_from(data.draw), saturation=sat, fleet=fl, obs=o, cfg=cfg, now_s=NOW)
    for p in POOLS:
        assert getattr(d, f"{p}_replicas") >= getattr(fl, p).current_replicas, (how, p, d.codes())


@SETTINGS
@given(data=st.data())
def test_guardrail_floor_holds_unless_a_hard_limit_binds(data):
    cfg = data.draw(unlimited_configs())
    cfg = cfg.model_copy(update={"max_step_replicas": None})
    fl = data.draw(fleets(with_last=False))
    pods = data.draw(pods_for(fl))
    o = observation(data.draw, pods)
    sat = guardrail(fl, pods, cfg, True)
    d = decide(sizing=sizing_from(data.draw), saturation=sat, fleet=fl, obs=o, cfg=cfg, now_s=NOW)
    for p in POOLS:
        floor = min(max(sat[p].floor_replicas, 1), 30)
        assert getattr(d, f"{p}_replicas") >= floor, (p, sat[p].signal, d.codes())
