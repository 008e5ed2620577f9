"""Several traces against one GPU budget (sim.fleet_replay): the arbitration in the loop, seeded and short.

Two models on the H200 profile, the first 20 minutes of Azure code x4 and of Azure conv x4 (independent
tenants +-30 s, seed 0). With a budget far above their wants the fleet replay is each model's replay alone;
with a tight one no interval's targets pass the budget and every held run says why.
"""

from __future__ import annotations

import warnings

import pytest

from connectors.profiles import load_profile_dir
from planner.config import SloTarget
from sim.fleet_replay import FleetMemberReplay, fleet_attainment, replay_fleet
from sim.lookup import ProfileTables
from sim.policies import PlannerPolicy, default_planner_config
from sim.replay import ReplaySettings, replay
from tests.support.fixtures_prefect import prefect_harness  # noqa: F401  (fixture)
from workloads.traces import load_trace, multiply_load, time_window

SLO = SloTarget(ttft_ms=200, itl_ms=10)


@pytest.fixture(scope="module")
def setup(shared_data, h200_profile_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        profile = load_profile_dir(h200_profile_dir)
    traces = {name: time_window(multiply_load(load_trace(shared_data / "traces" / f), 4, seed=0, jitter_s=30.0),
                                0.0, 1200.0)
              for name, f in (("code", "azure2023_code.csv.gz"), ("conv", "azure2023_conv.csv.gz"))}
    return profile, ProfileTables(profile), traces, str(h200_profile_dir)


def _members(setup, priorities=None):
    profile, tables, traces, profile_dir = setup
    cfg = default_planner_config(profile_dir=profile_dir, ttft_ms=SLO.ttft_ms, itl_ms=SLO.itl_ms, interval_s=60)
    return [FleetMemberReplay(name, trace, tables, PlannerPolicy(cfg, profile), ReplaySettings(slo=SLO),
                              (priorities or {}).get(name, 1.0)) for name, trace in traces.items()]


def test_a_budget_above_the_wants_changes_nothing(setup):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fleet = replay_fleet(_members(setup), budget_gpus=1000)
        for m in _members(setup):
            alone = replay(m.trace, m.tables, m.policy, scenario=m.scenario)
            together = fleet.results[m.name]
            assert together.gpu_hours == pytest.approx(alone.gpu_hours)
            assert (together.sla_met() == alone.sla_met()).all()
    assert fleet.short_intervals == 0 and set(fleet.held_intervals.values()) == {0}


@pytest.mark.parametrize("rule", ["loss", "split", "priority"])
def test_a_tight_budget_holds_every_interval_within_it(setup, rule):
    budget = 6
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fleet = replay_fleet(_members(setup), budget_gpus=budget, rule=rule)
    assert fleet.short_intervals > 0 and fleet.peak_granted_gpus <= budget
    code, conv = fleet.results["code"].timeline, fleet.results["conv"].timeline
    n = min(len(code.t_s), len(conv.t_s)) - 1  # up to the interval the first finished in (then its GPUs are free)
    targets = [code.prefill_target[i] + code.decode_target[i] + conv.prefill_target[i] + conv.decode_target[i]
               for i in range(n)]
    assert max(targets) <= budget
    held = [r for tl in (code, conv) for r in tl.reasons if "fleet_budget" in r]
    assert held and all(" held at " in r for r in held)
    assert 0.0 < fleet_attainment(fleet) < 1.0
    assert sum(len(r.sla_met()) for r in fleet.results.values()) == sum(len(m.trace) for m in _members(setup))


def test_fast_path_is_refused(setup):
    members = _members(setup)
    members[0].policy.fast_path = members[0].policy.cfg.fast_path
    with pytest.raises(ValueError, match="deployment 'code' has the fast path on"):
        replay_fleet(members, budget_gpus=10)


@pytest.mark.parametrize("models, message", [
    pytest.param([("a", "planner"), ("a", "planner")], "models: name 'a' is used twice", id="duplicate names"),
    pytest.param([("a", "static:2x1")], "policy must be 'planner'", id="not the planner"),
])
def test_fleet_what_if_refuses_bad_input_in_one_line(models, message):
    from pydantic import ValidationError

    from sim.whatif.fleet import FleetModel, FleetWhatIf
    from sim.whatif.scenario import WhatIfScenario

    with pytest.raises(ValidationError, match=message):
        FleetWhatIf(budget_gpus=8, models=[FleetModel(name=n, scenario=WhatIfScenario(
            trace="t.csv", profile_dir="p", policy=policy)) for n, policy in models])


def test_demand_from_a_replayed_plan(setup):
    """A planner's last plan of a replay as the fleet reads it: its decision's targets, its bounds, and shares
    that never fall as replicas rise (at the trace's end a low load point can be 0 requests, met by none)."""
    from planner.fleet.demand import demand_from_plan

    member = _members(setup)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        replay(member.trace, member.tables, member.policy, scenario=member.scenario)
    plan, policy = member.policy.last_plan, member.policy
    d = demand_from_plan("code", plan, cfg=policy.cfg, profile=policy.profile, priority=2.0)
    assert d.wanted == {"prefill": plan.decision.prefill_replicas, "decode": plan.decision.decode_replicas}
    assert d.min_replicas == {"prefill": 1, "decode": 1} and d.priority == 2.0
    assert d.requests == pytest.approx(plan.forecast.num_requests)
    for pool in ("prefill", "decode"):
        fracs = d.met_frac[pool]
        assert len(fracs) == d.wanted[pool] + 1 and fracs[0] < fracs[-1]
        assert all(b >= a - 1e-12 for a, b in zip(fracs, fracs[1:]))
    assert d.miss_frac(d.wanted) < d.miss_frac({"prefill": 1, "decode": 1}) or d.wanted == {"prefill": 1, "decode": 1}


def test_what_if_fleet_flow_explains_itself(prefect_harness, setup, tmp_path):  # noqa: F811
    """The fleet what-if as a Prefect run: its name says the budget and rule, its message the figures, its
    artifact a row per model."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from sim.whatif.fleet import FleetModel, FleetWhatIf
    from sim.whatif.flow import what_if_fleet_flow
    from sim.whatif.scenario import WhatIfScenario
    from workloads.traces import write_mooncake_jsonl

    _, _, traces, profile_dir = setup
    models = []
    for name, trace in traces.items():
        path = write_mooncake_jsonl(time_window(trace, 0.0, 300.0), tmp_path / f"{name}.jsonl")
        models.append(FleetModel(name=name, scenario=WhatIfScenario(trace=str(path), profile_dir=profile_dir)))
    state = what_if_fleet_flow(FleetWhatIf(models=models, budget_gpus=4), return_state=True)
    summary = state.result()
    assert set(summary["models"]) == {"code", "conv"} and summary["peak_granted_gpus"] <= 4
    assert state.message.startswith("fleet ") and "of requests met their SLA" in state.message

    async def fetch():
        async with get_client() as client:
            run = await client.read_flow_run(state.state_details.flow_run_id)
            arts = await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["what-if-fleet-loss"])))
            return run, arts

    run, arts = asyncio.run(fetch())
    assert run.name == "what-if fleet: 4 GPUs, rule loss"
    report = arts[0].data
    assert "| code (" in report and "| conv (" in report and "4 GPUs, rule loss" in report


def test_replicas_of_several_gpus_count_as_such(setup, shared_data):
    """A 4-GPU-replica model (Qwen3-32B TP4 on H100, aiconfigurator's profile) beside a 1-GPU one: the grants
    count each replica's GPUs, so its targets x 4 plus the other's never pass the budget."""
    from tests.support.fixtures_profile import profiler_dir

    profile_h200, tables_h200, traces, profile_dir = setup
    qwen_dir = profiler_dir(shared_data, "aic-Qwen32B-H100-TP4")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qwen = load_profile_dir(qwen_dir)
    assert (qwen.gpus_per_prefill_engine, qwen.gpus_per_decode_engine) == (4, 4)
    slo_qwen = SloTarget(ttft_ms=1000, itl_ms=30)
    from sim.config import SimConfig

    members = [
        FleetMemberReplay("qwen", traces["code"], ProfileTables(qwen), PlannerPolicy(
            default_planner_config(profile_dir=str(qwen_dir), ttft_ms=1000, itl_ms=30, interval_s=60), qwen),
            ReplaySettings(slo=slo_qwen, sim=SimConfig(gpus_per_prefill=4, gpus_per_decode=4))),
        _members(setup)[1],
    ]
    budget = 14
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fleet = replay_fleet(members, budget_gpus=budget)
    assert fleet.short_intervals > 0 and fleet.peak_granted_gpus <= budget
    q, c = fleet.results["qwen"].timeline, fleet.results["conv"].timeline
    # Up to the interval in which the first of them finished: from then on its GPUs are free (its replay ends).
    used = [4 * (q.prefill_target[i] + q.decode_target[i]) + c.prefill_target[i] + c.decode_target[i]
            for i in range(min(len(q.t_s), len(c.t_s)) - 1)]
    assert max(used) <= budget
