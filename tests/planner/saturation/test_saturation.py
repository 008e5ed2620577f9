"""Saturation guardrail: WVA's published cases plus our departures (missing metrics, multi-removal).

Thresholds 0.8 / 5 and triggers 0.1 / 3 unless a case says otherwise.
spare KV = 0.8 - usage, spare queue = 5 - waiting, averaged over non-saturated replicas.
"""

from __future__ import annotations

import math

import pytest

from planner.config import DecisionConfig, SaturationConfig, SaturationThresholds, parse_yaml
from planner.saturation.guardrail import analyze_fleet, analyze_pool, desired_in_flight
from planner.saturation.analysis import analyze_saturation
from planner.saturation.spare_capacity import classify_replica, spare_after_removal
from planner.saturation.variant_targets import VariantState, analyze_model
from planner.types import DecisionRecord, FleetState, Observation, PodMetrics, PoolState

WVA = SaturationThresholds()


def pods(kv_and_queue, *, pool="decode", variant="default", prefix=None):
    prefix = prefix or variant
    return [
        PodMetrics(pod=f"{prefix}-{i}", pool=pool, kv_usage_frac=kv, queue_length=q, variant=variant)
        for i, (kv, q) in enumerate(kv_and_queue)
    ]


# ---------------------------------------------------------------- replica classification


@pytest.mark.parametrize(
    "kv, queue, state",
    [
        pytest.param(0.79, 4, "ok", id="0.79 < 0.8 and 4 < 5: ok"),
        pytest.param(0.80, 0, "saturated", id="kv 0.80 >= 0.80: saturated (inclusive)"),
        pytest.param(0.10, 5, "saturated", id="queue 5 >= 5: saturated (inclusive)"),
        pytest.param(None, 1, "missing", id="kv None: missing, not spare"),
        pytest.param(0.3, math.nan, "missing", id="queue NaN: missing, not spare"),
        pytest.param(math.inf, 1, "missing", id="kv inf: missing"),
        pytest.param(0.95, None, "saturated", id="kv 0.95 saturates even with queue missing"),
        pytest.param(None, 7, "saturated", id="queue 7 saturates even with kv missing"),
    ],
)
def test_classify_replica(kv, queue, state):
    (pod,) = pods([(kv, queue)])
    verdict = classify_replica(pod, WVA)
    assert verdict.state == state
    if state != "ok":
        assert verdict.spare_kv_frac is None and verdict.spare_queue is None


@pytest.mark.parametrize(
    "kv, queue, fragment",
    [
        pytest.param(80.0, 1, "kv_usage_frac must be a fraction in 0..1, got 80.0", id="percent passed as fraction"),
        pytest.param(-0.1, 1, "kv_usage_frac must be a fraction in 0..1, got -0.1", id="negative kv"),
        pytest.param(0.1, -2, "queue_length must be >= 0, got -2", id="negative queue"),
    ],
)
def test_classify_replica_rejects_impossible_values(kv, queue, fragment):
    (pod,) = pods([(kv, queue)])
    with pytest.raises(ValueError, match="pod 'default-0'") as err:
        classify_replica(pod, WVA)
    assert fragment in str(err.value)


# ---------------------------------------------------------------- WVA's published analysis cases


@pytest.mark.parametrize(
    "replicas, signal, avg_spare_kv, avg_spare_queue",
    [
        pytest.param([(0.75, 1), (0.76, 1)], "scale_up", 0.045, 4.0,
                     id="KV 0.75/0.76: spare (0.05+0.04)/2 = 0.045 < 0.1 -> scale up"),
        pytest.param([(0.3, 3), (0.3, 3)], "scale_up", 0.5, 2.0,
                     id="queue 3/3: spare (2+2)/2 = 2 < 3 -> scale up"),
        pytest.param([(0.5, 1)], "steady", 0.3, 4.0,
                     id="KV 0.5 queue 1: spare 0.3 >= 0.1, 4 >= 3; single replica -> no action"),
        pytest.param([(0.20, 0), (0.30, 0), (0.25, 0)], "scale_down_safe", 0.55, 5.0,
                     id="KV 0.20/0.30/0.25: load 0.25*3/2 = 0.375, spare 0.425 >= 0.1 -> safe"),
        pytest.param([(0.70, 0), (0.75, 0)], "scale_up", 0.075, 5.0,
                     id="KV 0.70/0.75: spare 0.075 < 0.1 -> scale up, so scale-down unsafe"),
        pytest.param([(0.85, 6), (0.9, 7)], "scale_up", 0.0, 0.0,
                     id="all saturated: no spare at all (0) -> scale up"),
        pytest.param([(0.85, 0), (0.1, 1)], "steady", 0.7, 4.0,
                     id="1 saturated + 1 ok: spare 0.7/4 fine but 1 non-saturated < 2 -> unsafe"),
    ],
)
def test_wva_published_cases(replicas, signal, avg_spare_kv, avg_spare_queue):
    a = analyze_saturation(pods=pods(replicas), thresholds=WVA)
    assert a.signal == signal
    assert a.avg_spare_kv_frac == pytest.approx(avg_spare_kv)
    assert a.avg_spare_queue == pytest.approx(avg_spare_queue)
    assert a.should_scale_up == (signal == "scale_up")
    assert a.scale_down_safe == (signal == "scale_down_safe")


@pytest.mark.parametrize(
    "replicas, safe, after_kv, after_queue",
    [
        pytest.param([(0.20, 1), (0.30, 1), (0.25, 1)], True, 0.425, 3.5,
                     id="0.20/0.30/0.25 q1: kv 0.8-0.25*1.5 = 0.425, queue 5-1*1.5 = 3.5 -> safe"),
        pytest.param([(0.70, 0), (0.75, 0)], False, -0.65, 5.0,
                     id="0.70/0.75: 0.8-0.725*2 = -0.65 < 0.1 -> unsafe"),
        pytest.param([(0.30, 2), (0.30, 2)], False, 0.2, 1.0,
                     id="q 2/2: kv 0.8-0.6 = 0.2 ok, queue 5-2*2 = 1 < 3 -> unsafe"),
        pytest.param([(0.35, 0), (0.35, 0)], True, 0.1, 5.0,
                     id="boundary: 0.8-0.35*2 = 0.1 >= 0.1 -> safe (>= is inclusive)"),
    ],
)
def test_scale_down_simulation_scales_load_by_n_over_n_minus_1(replicas, safe, after_kv, after_queue):
    a = analyze_saturation(pods=pods(replicas), thresholds=WVA)
    assert a.scale_down_safe is safe
    assert a.spare_kv_after_removal_frac == pytest.approx(after_kv)
    assert a.spare_queue_after_removal == pytest.approx(after_queue)


def test_single_replica_is_never_safe_to_remove():
    a = analyze_saturation(pods=pods([(0.0, 0)]), thresholds=WVA)
    assert not a.scale_down_safe and a.max_safe_removals == 0
    assert a.spare_kv_after_removal_frac is None
    assert "only 1 non-saturated replica(s), need 2" in a.message


@pytest.mark.parametrize(
    "replicas, removals",
    [
        pytest.param([(0.3, 0)] * 4, 2,
                     id="4 x 0.3: r=2 -> 0.8-0.3*4/2 = 0.2 ok; r=3 -> 0.8-1.2 < 0.1 -> 2"),
        pytest.param([(0.1, 0)] * 5, 4,
                     id="5 x 0.1: r=4 -> 0.8-0.1*5 = 0.3 ok -> 4 (one replica stays)"),
        pytest.param([(0.2, 0), (0.30, 0), (0.25, 0)], 1,
                     id="0.20/0.30/0.25: r=1 spare 0.425; r=2 -> 0.8-0.75 = 0.05 < 0.1 -> 1"),
        pytest.param([(0.0, 1)] * 6, 3,
                     id="6 x queue 1: r=3 -> 5-1*6/3 = 3 >= 3 ok; r=4 -> 5-6/2 = 2 < 3 -> 3"),
    ],
)
def test_max_safe_removals_extends_the_one_replica_check(replicas, removals):
    assert analyze_saturation(pods=pods(replicas), thresholds=WVA).max_safe_removals == removals


def test_spare_after_removal_rejects_removing_everything():
    with pytest.raises(ValueError, match="removed must be in 1..1, got 2"):
        spare_after_removal(avg_spare_kv_frac=0.5, avg_spare_queue=4, non_saturated=2, removed=2, thresholds=WVA)


@pytest.mark.parametrize(
    "replicas, signal, safe",
    [
        pytest.param([(0.2, 0), (0.2, 0), (None, None)], "steady", False,
                     id="2 ok + 1 silent: spare fine but unknown load -> no scale-down"),
        pytest.param([(0.75, 1), (0.76, 1), (None, 0)], "scale_up", False,
                     id="silent replica not counted as spare: avg over 0.05/0.04 = 0.045 -> scale up"),
        pytest.param([(None, None), (math.nan, math.nan)], "no_data", False,
                     id="nothing reports: no signal either way"),
    ],
)
def test_missing_metrics_never_count_as_spare(replicas, signal, safe):
    a = analyze_saturation(pods=pods(replicas), thresholds=WVA)
    assert a.signal == signal
    assert a.scale_down_safe is safe
    assert a.missing_count == sum(1 for kv, q in replicas if kv is None or (isinstance(kv, float) and math.isnan(kv)))


def test_duplicate_pod_names_are_an_error():
    dup = pods([(0.1, 0)]) * 2
    with pytest.raises(ValueError, match=r"repeated: \['default-0'\]"):
        analyze_saturation(pods=dup, thresholds=WVA)


def test_analysis_numbers_carry_the_figures():
    a = analyze_saturation(pods=pods([(0.75, 1), (0.76, 1)]), thresholds=WVA)
    n = a.numbers
    assert n["avg_spare_kv_frac"] == pytest.approx(0.045)
    assert n["kv_spare_trigger"] == 0.1 and n["queue_spare_trigger"] == 3
    assert n["saturated_count"] == 0 and n["non_saturated_count"] == 2
    assert "avg spare KV 0.045 (trigger 0.1)" in a.message


# ---------------------------------------------------------------- multi-variant targets


def three_variants(**overrides):
    """Costs 20 (a100), 5 (l4), 15 (h100), two replicas each."""
    base = {
        "a100": dict(cost=20.0, current_replicas=2),
        "l4": dict(cost=5.0, current_replicas=2),
        "h100": dict(cost=15.0, current_replicas=2),
    }
    for name, fields in overrides.items():
        base[name].update(fields)
    return [VariantState(name=name, **fields) for name, fields in base.items()]


def three_variant_pods(kv, queue):
    out = []
    for name in ("a100", "l4", "h100"):
        out += pods([(kv, queue)] * 2, variant=name)
    return out


@pytest.mark.parametrize(
    "kv, queue, expected",
    [
        pytest.param(0.75, 1, {"a100": 2, "l4": 3, "h100": 2},
                     id="scale up: cheapest (l4, cost 5) 2->3"),
        pytest.param(0.1, 0, {"a100": 1, "l4": 2, "h100": 2},
                     id="scale down: most expensive (a100, cost 20) 2->1"),
    ],
)
def test_cost_aware_choice(kv, queue, expected):
    model = analyze_model(pods=three_variant_pods(kv, queue), variants=three_variants(), thresholds=WVA)
    assert not model.in_transition
    assert {t.name: t.target_replicas for t in model.targets} == expected
    changed = [t for t in model.targets if t.target_replicas != t.current_replicas]
    assert len(changed) == 1 and changed[0].action in ("scale_up", "scale_down")


def test_no_action_keeps_every_variant():
    # KV 0.7 queue 0 x6: spare 0.1 >= 0.1, not a scale-up; one fewer: 0.8-0.7*6/5 = -0.04 < 0.1 -> unsafe
    model = analyze_model(pods=three_variant_pods(0.7, 0), variants=three_variants(), thresholds=WVA)
    assert model.analysis.signal == "steady"
    assert all(t.target_replicas == 2 and t.action == "no_change" for t in model.targets)


@pytest.mark.parametrize(
    "costs, kv, chosen, target",
    [
        pytest.param({"a100": 5.0, "l4": 5.0, "h100": 5.0}, 0.75, "a100", 3,
                     id="equal costs, scale up: alphabetically first (a100)"),
        pytest.param({"a100": 5.0, "l4": 5.0, "h100": 5.0}, 0.1, "l4", 1,
                     id="equal costs, scale down: alphabetically last (l4)"),
    ],
)
def test_cost_ties_break_alphabetically(costs, kv, chosen, target):
    variants = three_variants(**{n: {"cost": c} for n, c in costs.items()})
    model = analyze_model(pods=three_variant_pods(kv, 0), variants=variants, thresholds=WVA)
    assert model.target(chosen).target_replicas == target
    assert sum(t.target_replicas != t.current_replicas for t in model.targets) == 1


def test_scale_up_skips_variants_with_pending_replicas():
    # l4 is cheapest but has a pod starting; h100 (15) is next cheapest.
    # Metrics come from the two ready l4 pods, and current counts ready pods only here so the
    # model is stable (pending pods are tracked separately, as WVA's VariantReplicaState does).
    variants = three_variants(l4={"pending_replicas": 1})
    model = analyze_model(pods=three_variant_pods(0.75, 1), variants=variants, thresholds=WVA)
    assert {t.name: t.target_replicas for t in model.targets} == {"a100": 2, "l4": 2, "h100": 3}


def test_scale_up_skips_variants_at_max():
    variants = three_variants(l4={"max_replicas": 2})
    model = analyze_model(pods=three_variant_pods(0.75, 1), variants=variants, thresholds=WVA)
    assert model.target("h100").target_replicas == 3 and model.target("l4").target_replicas == 2


def test_scale_down_keeps_at_least_one_replica_per_variant():
    # a100 has one replica left: the next most expensive (h100, 15) gives one up instead.
    variants = three_variants(a100={"current_replicas": 1})
    ps = pods([(0.1, 0)], variant="a100") + pods([(0.1, 0)] * 2, variant="l4") + pods([(0.1, 0)] * 2, variant="h100")
    model = analyze_model(pods=ps, variants=variants, thresholds=WVA)
    assert {t.name: t.target_replicas for t in model.targets} == {"a100": 1, "l4": 2, "h100": 1}


@pytest.mark.parametrize(
    "variant_overrides, drop_pod, preserved",
    [
        pytest.param({"a100": {"desired_replicas": 4}}, None, {"a100": 4, "l4": 2, "h100": 2},
                     id="a100 desired 4 vs current 2: model frozen, a100 keeps 4, others current"),
        pytest.param({"l4": {"current_replicas": 4}}, None, {"a100": 2, "l4": 4, "h100": 2},
                     id="l4: 2 of 4 pods reporting: model frozen at current"),
        pytest.param({}, "h100-1", {"a100": 2, "l4": 2, "h100": 2},
                     id="h100: 1 of 2 pods reporting: frozen, even though KV 0.75 asks for scale-up"),
    ],
)
def test_transition_blocks_every_variant(variant_overrides, drop_pod, preserved):
    ps = [p for p in three_variant_pods(0.75, 1) if p.pod != drop_pod]
    model = analyze_model(pods=ps, variants=three_variants(**variant_overrides), thresholds=WVA)
    assert model.in_transition
    assert {t.name: t.target_replicas for t in model.targets} == preserved
    assert all(t.action == "preserved" for t in model.targets)


def test_desired_zero_or_equal_to_current_is_not_a_transition():
    variants = three_variants(a100={"desired_replicas": 0}, l4={"desired_replicas": 2})
    model = analyze_model(pods=three_variant_pods(0.75, 1), variants=variants, thresholds=WVA)
    assert not model.in_transition and model.target("l4").target_replicas == 3


def test_three_of_four_pods_reporting_freezes_the_model():
    ps = pods([(0.75, 1), (0.76, 1), (0.7, 1)])  # the fourth pod has no metrics at all
    model = analyze_model(pods=ps, variants=[VariantState(name="default", current_replicas=4)], thresholds=WVA)
    assert model.in_transition
    assert model.transition_reasons == ("variant default: 3 of 4 replicas report metrics",)
    assert model.targets[0].target_replicas == 4


def test_targets_are_clamped_to_variant_bounds():
    # a single variant at 5 with min 6 (raised by config): stays at its min whatever the signal
    variants = [VariantState(name="default", current_replicas=5, min_replicas=6, max_replicas=8)]
    model = analyze_model(pods=pods([(0.1, 0)] * 5), variants=variants, thresholds=WVA)
    assert model.targets[0].target_replicas == 6


@pytest.mark.parametrize(
    "variants, ps, fragment",
    [
        pytest.param([], [], "at least one variant", id="no variants"),
        pytest.param([VariantState(name="a", current_replicas=1)] * 2, [], "unique", id="duplicate variant"),
        pytest.param([VariantState(name="a", current_replicas=1)], pods([(0.1, 0)], variant="b"),
                     "pods ['b-0'] belong to unknown variant(s) ['b']", id="pod of unknown variant"),
    ],
)
def test_model_input_errors_name_the_problem(variants, ps, fragment):
    with pytest.raises(ValueError) as err:
        analyze_model(pods=ps, variants=variants, thresholds=WVA)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    "fields, fragment",
    [
        pytest.param(dict(current_replicas=-1), "current_replicas must be an integer >= 0, got -1", id="negative current"),
        pytest.param(dict(current_replicas=2, cost=math.nan), "cost must be a finite number", id="NaN cost"),
        pytest.param(dict(current_replicas=2, min_replicas=3, max_replicas=2), "max_replicas 2 < min_replicas 3",
                     id="max < min"),
    ],
)
def test_variant_state_validation(fields, fragment):
    with pytest.raises(ValueError, match="variant 'v'") as err:
        VariantState(name="v", **fields)
    assert fragment in str(err.value)


# ---------------------------------------------------------------- pool level


@pytest.mark.parametrize(
    "replicas, state, desired, signal, floor, target",
    [
        pytest.param([(0.75, 1), (0.76, 1)], PoolState(2, 2), None, "scale_up", 3, 3,
                     id="KV 0.75/0.76: floor 2+1 = 3"),
        pytest.param([(0.3, 0)] * 4, PoolState(4, 4), None, "scale_down_safe", 2, 3,
                     id="4 x 0.3: WVA target 4-1 = 3, floor 4-2 = 2"),
        pytest.param([(0.70, 0), (0.5, 1)], PoolState(2, 2), None, "steady", 2, 2,
                     id="spare (0.1+0.3)/2 = 0.2, 0.8-0.6*2 < 0.1: veto, floor = current 2"),
        pytest.param([(0.75, 1), (0.76, 1)], PoolState(3, 2), None, "transition", 3, 3,
                     id="2 of 3 reporting: frozen at current 3 despite saturation"),
        pytest.param([(0.1, 0)] * 2, PoolState(2, 2), 4, "transition", 4, 4,
                     id="desired 4 vs current 2: frozen, floor keeps the in-flight 4"),
        pytest.param([], PoolState(0, 0), None, "no_data", 0, 1,
                     id="empty pool: no data, floor 0; WVA target clamped up to min 1"),
        pytest.param([(None, None)] * 2, PoolState(2, 2), None, "transition", 2, 2,
                     id="2 pods silent: 0 of 2 reporting -> frozen at 2, never shrunk"),
    ],
)
def test_analyze_pool(replicas, state, desired, signal, floor, target):
    ps = pods(replicas) + pods([(0.99, 9)], pool="prefill", prefix="other")  # other pool ignored
    sat = analyze_pool(pool="decode", pods=ps, state=state, thresholds=WVA, desired_replicas=desired)
    assert (sat.signal, sat.floor_replicas, sat.target_replicas) == (signal, floor, target)
    assert sat.numbers["floor_replicas"] == floor
    assert sat.message.startswith("decode: ")


def test_analyze_pool_floor_respects_min_replicas():
    # 4 x 0.3 could lose 2, but the pool minimum is 3.
    sat = analyze_pool(pool="decode", pods=pods([(0.3, 0)] * 4), state=PoolState(4, 4), thresholds=WVA,
                       min_replicas=3)
    assert sat.floor_replicas == 3 and sat.target_replicas == 3


def test_analyze_pool_with_mixed_variant_pods_needs_variant_counts():
    ps = pods([(0.1, 0)], variant="a") + pods([(0.1, 0)], variant="b")
    with pytest.raises(ValueError, match=r"pool decode has pods of variants \['a', 'b'\]"):
        analyze_pool(pool="decode", pods=ps, state=PoolState(2, 2), thresholds=WVA)
    variants = [VariantState(name="a", current_replicas=1, cost=1), VariantState(name="b", current_replicas=1, cost=2)]
    sat = analyze_pool(pool="decode", pods=ps, state=PoolState(2, 2), thresholds=WVA, variants=variants)
    assert sat.signal == "scale_down_safe" and sat.model.target("b").target_replicas == 1
    with pytest.raises(ValueError, match="variants sum to 2 replicas, pool state says 3"):
        analyze_pool(pool="decode", pods=ps, state=PoolState(3, 3), thresholds=WVA, variants=variants)


@pytest.mark.parametrize(
    "last, now_s, expected",
    [
        pytest.param(None, 100.0, None, id="no previous decision"),
        pytest.param(DecisionRecord(1, 0.0, 3, 5, done=True), 100.0, None, id="done: nothing in flight"),
        pytest.param(DecisionRecord(1, 0.0, 3, 5, done=False), 100.0, 5, id="not done, 100 s < 1800 s: decode 5"),
        pytest.param(DecisionRecord(1, 0.0, 3, 5, done=False), 1800.0, None, id="not done but 1800 s old: timed out"),
    ],
)
def test_desired_in_flight(last, now_s, expected):
    fleet = FleetState(prefill=PoolState(3, 3), decode=PoolState(4, 4), last_decision=last)
    assert desired_in_flight(fleet=fleet, pool="decode", now_s=now_s, wait_for_previous_s=1800.0) == expected


def observation(ps):
    return Observation(taken_at_s=0.0, interval_s=60.0, num_requests=100.0, avg_isl_tokens=1000.0,
                       avg_osl_tokens=200.0, avg_ttft_ms=100.0, avg_itl_ms=10.0, pods=tuple(ps))


def test_analyze_fleet_uses_the_model_override_and_both_pools():
    ps = pods([(0.6, 0)] * 2, pool="prefill") + pods([(0.6, 0)] * 2, pool="decode", prefix="d")
    fleet = FleetState(prefill=PoolState(2, 2), decode=PoolState(2, 2))
    default_cfg = SaturationConfig()
    out = analyze_fleet(obs=observation(ps), fleet=fleet, saturation_cfg=default_cfg,
                        decision_cfg=DecisionConfig(), model_id="llama", namespace="prod", now_s=0.0)
    # default: spare 0.2 >= 0.1 -> not a scale-up; 0.8-0.6*2 < 0.1 -> steady
    assert {p: s.signal for p, s in out.items()} == {"prefill": "steady", "decode": "steady"}
    tight = SaturationConfig(overrides={"llama#prod": {"kv_cache_threshold": 0.65}})
    out = analyze_fleet(obs=observation(ps), fleet=fleet, saturation_cfg=tight,
                        decision_cfg=DecisionConfig(), model_id="llama", namespace="prod", now_s=0.0)
    # override: spare 0.65-0.6 = 0.05 < 0.1 -> scale up in both pools
    assert {p: s.floor_replicas for p, s in out.items()} == {"prefill": 3, "decode": 3}
    disabled = SaturationConfig(enabled=False)
    assert analyze_fleet(obs=observation(ps), fleet=fleet, saturation_cfg=disabled,
                         decision_cfg=DecisionConfig(), model_id="llama", namespace="prod", now_s=0.0) is None


# ---------------------------------------------------------------- config


def test_missing_config_means_recommended_defaults_not_zeros():
    for cfg in (SaturationConfig(), parse_yaml("", SaturationConfig, source="s.yaml"),
                parse_yaml("default: {}\n", SaturationConfig, source="s.yaml")):
        t = cfg.for_model("any", "ns")
        assert (t.kv_cache_threshold, t.queue_length_threshold, t.kv_spare_trigger, t.queue_spare_trigger) == (
            0.80, 5, 0.1, 3)


def test_override_replaces_the_default_wholly():
    text = """
default: {kv_cache_threshold: 0.9, kv_spare_trigger: 0.2, queue_spare_trigger: 2}
overrides:
  "meta/llama-70b#production": {kv_cache_threshold: 0.85}
"""
    cfg = parse_yaml(text, SaturationConfig, source="configs/saturation.yaml")
    over = cfg.for_model("meta/llama-70b", "production")
    # fields the override leaves out take the recommended values, not the default entry's 0.2 / 2
    assert (over.kv_cache_threshold, over.kv_spare_trigger, over.queue_spare_trigger) == (0.85, 0.1, 3)
    assert cfg.for_model("meta/llama-70b", "staging").kv_spare_trigger == 0.2


def test_wva_configmap_spelling_is_accepted():
    text = "default: {kvCacheThreshold: 0.75, queueLengthThreshold: 8, kvSpareTrigger: 0.05, queueSpareTrigger: 4}\n"
    t = parse_yaml(text, SaturationConfig, source="s.yaml").default
    assert (t.kv_cache_threshold, t.queue_length_threshold, t.kv_spare_trigger, t.queue_spare_trigger) == (
        0.75, 8, 0.05, 4)


@pytest.mark.parametrize(
    "text, fragments",
    [
        pytest.param("overrides:\n  llama-prod: {}\n", ["override key 'llama-prod' must be 'modelID#namespace'"],
                     id="override key without '#'"),
        pytest.param("overrides:\n  'llama#': {}\n", ["override key 'llama#'"], id="empty namespace"),
        pytest.param("default: {kv_cache_treshold: 0.7}\n", ["unknown field 'default.kv_cache_treshold'"],
                     id="misspelt field"),
        pytest.param("default: {kv_cache_threshold: 1.5}\n", ["default.kv_cache_threshold", "1.5"],
                     id="threshold above 1"),
        pytest.param("default: {kv_spare_trigger: 0.9}\n",
                     ["kv_spare_trigger (0.9) must be < kv_cache_threshold (0.8)"], id="trigger >= threshold"),
        pytest.param("default: {queue_spare_trigger: 5}\n",
                     ["queue_spare_trigger (5.0) must be < queue_length_threshold (5.0)"], id="queue trigger = threshold"),
    ],
)
def test_bad_config_is_rejected_naming_the_problem(text, fragments):
    with pytest.raises(ValueError) as err:
        parse_yaml(text, SaturationConfig, source="configs/saturation.yaml")
    assert str(err.value).startswith("configs/saturation.yaml: ")
    for fragment in fragments:
        assert fragment in str(err.value)
