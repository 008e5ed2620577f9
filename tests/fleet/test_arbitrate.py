"""The fleet's GPU arbitration (planner.fleet), as tables worked out by hand.

Every demand below is built by hand: `requests` and, per pool, the share of requests meeting that pool's
target at 0, 1, 2, ... replicas. Expected miss at (p, d) = 1 - met_prefill[p] x met_decode[d] (x requests: the requests lost); the
arbitration minimises the sum of priority x miss within the budget (SLA attainment points).
"""

from __future__ import annotations

import pytest

from planner.config import DecisionConfig, PoolBounds
from planner.decision.gpu_budget import fit_gpu_budget
from planner.fleet.arbitrate import arbitrate
from planner.fleet.demand import DeploymentDemand
from planner.fleet.fixed import fixed_split, priority_order
from planner.types import ReasonCode

ONE = {"prefill": 1, "decode": 1}


def demand(name, wanted, *, prefill=(), decode=(), requests=100.0, priority=1.0, floor=ONE, gpus=ONE):
    met = {"prefill": tuple(prefill), "decode": tuple(decode)} if prefill or decode else {}
    return DeploymentDemand(name, {"prefill": wanted[0], "decode": wanted[1]}, dict(floor), dict(gpus),
                            priority=priority, requests=requests, met_frac=met)


# a: prefill 1 -> 2 takes its TTFT share from 0.5 to 1.0 (saves 0.5 of its attainment, 50 of 100 requests);
# b: prefill 1 -> 2 takes it from 0.8 to 1.0 (saves 0.2). Decode is met at 1 replica in both.
A = dict(prefill=(0, 0.5, 1.0), decode=(0, 1.0))
B = dict(prefill=(0, 0.8, 1.0), decode=(0, 1.0))


@pytest.mark.parametrize("demands, budget, expected", [
    pytest.param([demand("a", (2, 1), **A), demand("b", (2, 1), **B)], 6, {"a": (2, 1), "b": (2, 1)},
                 id="fits: 3 + 3 = 6 <= 6, everyone gets its wants"),
    pytest.param([demand("a", (2, 1), **A), demand("b", (2, 1), **B)], 5, {"a": (2, 1), "b": (1, 1)},
                 id="one GPU over the floors (4): a saves 50 > b's 20"),
    pytest.param([demand("a", (2, 1), **A), demand("b", (2, 1), **B, priority=3)], 5, {"a": (1, 1), "b": (2, 1)},
                 id="priority weighs the loss: b 3 x 0.2 = 0.6 > a's 0.5"),
    pytest.param([demand("a", (2, 1), **A), demand("b", (2, 1), **B, priority=2)], 5, {"a": (2, 1), "b": (1, 1)},
                 id="not a fixed order: b priority 2 x 0.2 = 0.4 < a's 0.5, a gets it"),
    pytest.param([demand("a", (2, 1), **A, requests=10), demand("b", (2, 1), **B, requests=1000)], 5,
                 {"a": (2, 1), "b": (1, 1)},
                 id="attainment, not traffic: a's 0.5 of 10 requests beats b's 0.2 of 1000"),
    pytest.param([demand("a", (2, 1), **A, gpus={"prefill": 2, "decode": 1}), demand("b", (2, 1), **B)], 6,
                 {"a": (1, 1), "b": (2, 1)},
                 id="GPUs per replica: floors 3 + 2 = 5, one GPU left does not buy a's 2-GPU replica"),
    pytest.param([demand("a", (1, 3), prefill=(0, 1.0), decode=(0, 0, 0, 1.0)),
                  demand("b", (3, 1), prefill=(0, 0.7, 0.9, 1.0), decode=(0, 1.0))], 6,
                 {"a": (1, 3), "b": (1, 1)},
                 id="no greedy stall: a's 2 decode replicas save 1.0 together (0 alone), b's 2 prefill 0.3"),
    pytest.param([demand("a", (3, 3)), demand("b", (3, 3), priority=2)], 8, {"a": (1, 1), "b": (3, 3)},
                 id="no loss tables: equal losses, the GPUs go to the higher priority"),
])
def test_arbitrate_grants(demands, budget, expected):
    arb = arbitrate(demands, budget, guaranteed_share_frac=0.0)
    got = {n: (g.targets["prefill"], g.targets["decode"]) for n, g in arb.grants.items()}
    assert got == expected
    assert arb.granted_gpus <= budget


def test_weighted_loss_and_miss_fractions():
    # a at (2, 1): met 1.0 x 1.0 -> miss 0; b at (1, 1): 0.8 x 1.0 -> miss 0.2 (20 requests), priority 1.
    arb = arbitrate([demand("a", (2, 1), **A), demand("b", (2, 1), **B)], 5, guaranteed_share_frac=0.0)
    assert arb.weighted_loss == pytest.approx(0.2)
    assert arb.grants["b"].expected_miss_frac == pytest.approx(0.2)
    assert arb.grants["b"].wanted_miss_frac == pytest.approx(0.0)
    assert arb.wanted_gpus == 6 and arb.short


def test_held_deployment_is_told_who_got_the_budget_and_what_they_would_miss():
    # b got prefill 2; with one fewer its TTFT share would be 0.8: "would miss by 20%"; b's priority 3.
    arb = arbitrate([demand("a", (2, 1), **A), demand("b", (2, 1), **B, priority=3)], 5, guaranteed_share_frac=0.0)
    (reason,) = arb.grants["a"].reasons
    assert reason.code == ReasonCode.FLEET_BUDGET and reason.pool == "prefill"
    assert reason.message.startswith("prefill held at 1 (wanted 2): budget given to b, priority 3, whose TTFT "
                                     "forecast would miss by 20% with prefill at 1")
    assert "one more prefill replica would save 50 of its 100 requests" in reason.message
    assert reason.numbers["requests_saved_by_one_more"] == pytest.approx(50.0)
    (full,) = arb.grants["b"].reasons
    assert full.pool is None and "granted in full" in full.message


def test_within_budget_no_reasons():
    arb = arbitrate([demand("a", (2, 1), **A), demand("b", (2, 1), **B)], 6)
    assert all(g.reasons == () for g in arb.grants.values())


def test_floors_above_the_budget_give_every_floor_and_say_so():
    arb = arbitrate([demand("a", (3, 3), floor={"prefill": 2, "decode": 2}), demand("b", (3, 3))], 5)
    assert {n: g.targets for n, g in arb.grants.items()} == {"a": {"prefill": 2, "decode": 2},
                                                             "b": {"prefill": 1, "decode": 1}}
    assert "cannot be met: the deployments' minimums alone need 6 GPUs" in arb.grants["a"].reasons[0].message


@pytest.mark.parametrize("wanted, gpus, floor, budget", [
    pytest.param((6, 4), ONE, ONE, 5, id="x 0.5: (3, 2)"),
    pytest.param((7, 3), ONE, ONE, 6, id="x 0.6: 4.2, 1.8 -> (4, 1) + 1 to decode's larger remainder"),
    pytest.param((4, 4), {"prefill": 2, "decode": 1}, ONE, 7, id="2-GPU prefill"),
    pytest.param((5, 1), ONE, {"prefill": 1, "decode": 1}, 3, id="decode at its floor"),
])
def test_one_deployment_is_cut_as_the_single_deployment_budget(wanted, gpus, floor, budget):
    d = demand("a", wanted, prefill=(0,) + (0.5,) * wanted[0], decode=(0,) + (0.5,) * wanted[1], floor=floor,
               gpus=gpus)
    cfg = DecisionConfig(max_gpu_budget=budget, prefill=PoolBounds(min_replicas=floor["prefill"]),
                         decode=PoolBounds(min_replicas=floor["decode"]))
    today, _ = fit_gpu_budget({"prefill": wanted[0], "decode": wanted[1]}, gpus_per_replica=gpus, cfg=cfg)
    assert arbitrate([d], budget).grants["a"].targets == today


@pytest.mark.parametrize("frac, expected, why", [
    pytest.param(0.0, {"a": (1, 1), "b": (3, 1)}, "whose TTFT forecast would miss by 40% with prefill at 2",
                 id="0: all by loss, the 2 GPUs over the floors to b (0.8) rather than one each (0.1 + 0.4)"),
    pytest.param(1.0, {"a": (2, 1), "b": (2, 1)}, "within its guaranteed share of the budget",
                 id="1: each keeps its floor (2) + half of the 2 GPUs the floors leave: a its wants, b (2, 1)"),
])
def test_guaranteed_share(frac, expected, why):
    # budget 6, floors 2 + 2; a wants (2, 1) = 3 GPUs, b (3, 1) = 4. a: prefill 1 -> 2 saves 0.1;
    # b: 1 -> 2 saves 0.4, 2 -> 3 another 0.4.
    demands = [demand("a", (2, 1), prefill=(0, 0.9, 1.0), decode=(0, 1.0)),
               demand("b", (3, 1), prefill=(0, 0.2, 0.6, 1.0), decode=(0, 1.0))]
    arb = arbitrate(demands, 6, guaranteed_share_frac=frac)
    assert {n: (g.targets["prefill"], g.targets["decode"]) for n, g in arb.grants.items()} == expected
    held = next(g for g in arb.grants.values() if g.held)
    assert why in held.reasons[0].message


def test_guaranteed_share_lends_what_a_deployment_does_not_want():
    # budget 7, equal shares 3.5 -> 3 GPUs each. a wants 6: keeps (2, 1) (3 x 0.5 = 1.5, 1.5 -> (1, 1), the
    # leftover GPU to prefill); b wants 2 of its 3. The 2 GPUs left go by loss, both to a: (3, 2) meets
    # 1.0 x 0.9 = 0.9, (2, 3) 0.8 x 1.0 = 0.8.
    arb = arbitrate([demand("a", (3, 3), prefill=(0, 0.5, 0.8, 1.0), decode=(0, 0.5, 0.9, 1.0)),
                     demand("b", (1, 1), **B)], 7)
    assert arb.grants["a"].targets == {"prefill": 3, "decode": 2}
    assert arb.grants["b"].targets == {"prefill": 1, "decode": 1}


def test_fixed_split_cuts_each_to_its_share_and_lends_nothing():
    # budget 6, equal shares 3 + 3. a wants 6 GPUs: cut to 3, x 0.5 -> 1.5, 1.5 -> (1, 1) + 1 to prefill (a tie
    # goes to prefill). b wants 2 of its 3: granted, its spare GPU not lent to a.
    arb = fixed_split([demand("a", (3, 3)), demand("b", (1, 1))], 6)
    assert arb.grants["a"].targets == {"prefill": 2, "decode": 1}
    assert arb.grants["b"].targets == {"prefill": 1, "decode": 1}
    assert arb.granted_gpus == 5


def test_priority_order_fills_the_first_then_cuts():
    # budget 7: a (priority 2) wants 6 but b's floor keeps 2 back: a cut to 5 (x 5/6: 2.5, 2.5 -> (2, 2) + 1 to
    # prefill); b left 2 GPUs: its floor.
    arb = priority_order([demand("a", (3, 3), priority=2), demand("b", (2, 2))], 7)
    assert arb.grants["a"].targets == {"prefill": 3, "decode": 2}
    assert arb.grants["b"].targets == {"prefill": 1, "decode": 1}


def test_the_loss_rule_beats_both_fixed_rules_on_its_objective():
    demands = [demand("a", (3, 3), prefill=(0, 0.2, 0.8, 0.99), decode=(0, 0.5, 0.95, 0.99)),
               demand("b", (3, 3), prefill=(0, 0.6, 0.6, 0.99), decode=(0, 0.9, 0.99, 0.99), priority=2)]
    loss = arbitrate(demands, 8, guaranteed_share_frac=0.0).weighted_loss
    assert loss < fixed_split(demands, 8).weighted_loss
    assert loss < priority_order(demands, 8).weighted_loss


@pytest.mark.parametrize("kwargs, message", [
    pytest.param(dict(priority=float("nan")), "priority must be a number >= 0", id="nan priority"),
    pytest.param(dict(priority=-1), "priority must be a number >= 0", id="negative priority"),
    pytest.param(dict(prefill=(0, 0.5)), "met_frac[prefill] needs shares in 0..1 for 0..2", id="short table"),
    pytest.param(dict(gpus={"prefill": 0, "decode": 1}), "gpus_per_replica[prefill] must be an integer >= 1",
                 id="0 GPUs"),
])
def test_bad_demand_is_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        demand("a", (2, 1), **kwargs)


def test_bad_budget_and_duplicate_names():
    with pytest.raises(ValueError, match="budget_gpus must be an integer >= 1, got 0"):
        arbitrate([demand("a", (1, 1))], 0)
    with pytest.raises(ValueError, match="deployment name 'a' is used twice"):
        arbitrate([demand("a", (1, 1)), demand("a", (1, 1))], 4)


def test_granted_decision_takes_the_grant_and_keeps_the_recommendation():
    from planner.fleet.arbitrate import granted_decision
    from planner.types import Decision

    arb = arbitrate([demand("a", (2, 1), **A), demand("b", (2, 1), **B, priority=3)], 5, guaranteed_share_frac=0.0)
    own = Decision(prefill_replicas=2, decode_replicas=1, apply=True, reasons=(), recommended_prefill_replicas=2,
                   recommended_decode_replicas=1, based_on=(1, 1))
    held = granted_decision(own, arb.grants["a"])  # a held at (1, 1): what is already set
    assert (held.prefill_replicas, held.decode_replicas, held.apply) == (1, 1, False)
    assert held.recommended_prefill_replicas == 2 and held.codes() == ["fleet_budget"]
    full = granted_decision(own, arb.grants["b"])
    assert (full.prefill_replicas, full.apply) == (2, True) and "granted in full" in full.reasons[0].message


def test_every_rule_stays_within_the_budget_floors_and_wants():
    # Every combination of floors (1 or 2 per pool), wants up to 4 per pool and 1-2 GPUs per decode replica
    # for two deployments, budgets from their floors to their wants.
    import itertools

    from planner.fleet.fixed import RULES

    met = dict(prefill=(0, 0.3, 0.6, 0.8, 1.0), decode=(0, 0.5, 0.9, 1.0, 1.0))
    cases = 0
    for fa, fb, wa, wb, g in itertools.product((1, 2), (1, 2), ((2, 4), (4, 1)), ((3, 3), (1, 2)), (1, 2)):
        a = demand("a", wa, floor={"prefill": fa, "decode": 1}, gpus={"prefill": 1, "decode": g}, **met)
        b = demand("b", wb, floor={"prefill": 1, "decode": fb}, priority=2, **met)
        for budget in range(a.gpus(a.floor) + b.gpus(b.floor), a.gpus(a.wanted) + b.gpus(b.wanted) + 1):
            for name, rule in RULES.items():
                arb = rule([a, b], budget)
                assert arb.granted_gpus <= budget, (name, budget)
                for d in (a, b):
                    t = arb.grants[d.name].targets
                    assert all(d.floor[p] <= t[p] <= d.wanted[p] for p in t), (name, budget, d.name, t)
                cases += 1
    assert cases == 648  # 216 (deployments, budget) pairs x 3 rules
