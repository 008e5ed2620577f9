"""The fleet run's per-deployment decide step as one task: read the deployment, plan it, apply nothing.

A fleet run plans many deployments a minute, so a deployment's reads and steps are plain calls inside
one task run (its steps are in the deployment's decision table, not separate task runs): each task run
costs the server a record and its state changes, and at a hundred deployments a minute those records
were most of the server's work (docs/control-plane.md). The task retries what a retry can fix (an
unreachable Prometheus or backend), as every network task does.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prefect import task
from prefect.cache_policies import NO_CACHE

from connectors.base import Connector
from connectors.config import ConnectorConfig, LatencyModelConfig, MetricsConfig
from connectors.factory import make_connector
from connectors.predictor_cache import open_predictor_cache
from connectors.profiles import load_profile
from planner.config import PlannerConfig, ProfileConfig
from planner.fleet.arbitrate import Arbitration, Grant, arbitrate, granted_decision
from planner.fleet.demand import DeploymentDemand, demand_from_plan
from planner.latency.profile import EngineProfile
from planner.pipeline import PlanResult, Steps, plan_steps
from planner.steps import needs_warmup, predict_load
from planner.types import POOLS
from routing.models.planner_view import TtftChoice
from tasks.latency_model import read_ttft_view
from tasks.retry import network_task

# flows.fleet_config.Fleet / FleetMember are read by attribute only (tasks do not import flows).
from workloads.traces import load_warmup_history


@dataclass(frozen=True)
class DeploymentPlan:
    """One deployment's plan before the budget: what it wants, what it read, and where to apply it.

    started_s: when its decide step started, on the process's monotonic clock (time.perf_counter), so the
        fleet run can report each decision's latency through its apply.
    """

    name: str
    result: PlanResult
    ttft: TtftChoice
    connector: Connector
    started_s: float

    @property
    def wanted(self) -> dict[str, int]:
        d = self.result.decision
        return {"prefill": d.prefill_replicas, "decode": d.decode_replicas}

    @property
    def current(self) -> dict[str, int]:
        return {p: getattr(self.result.fleet, p).current_replicas for p in POOLS}


@task(cache_policy=NO_CACHE)
def load_fleet_profiles(profiles: list[ProfileConfig]) -> list[EngineProfile]:
    """Each deployment's profile, loaded once per distinct profile (a fleet's models often share one)."""
    loaded: dict[str, EngineProfile] = {}
    out = []
    for cfg in profiles:
        key = cfg.model_dump_json()
        if key not in loaded:
            loaded[key] = load_profile(cfg)
        out.append(loaded[key])
    return out


def plan_deployment(
    name: str, cfg: PlannerConfig, profile: EngineProfile, *, metrics: MetricsConfig, connector: ConnectorConfig,
    latency_model: LatencyModelConfig, now_s: float,
) -> DeploymentPlan:
    """Read one deployment (its TTFT source, fleet, metrics) and run the planner's steps; nothing is applied.

    cfg, metrics, connector, latency_model: the deployment's run configuration (flows.config.PlannerRunConfig).
    now_s: the run's clock, Unix seconds. The fleet is read before the metrics, as the planner flow does, so
    load arriving in between counts against the older replica numbers (errors lean toward more replicas).
    """
    from connectors.prometheus import PrometheusCollector

    started = time.perf_counter()
    ttft = read_ttft_view(latency_model, profile, now_s=now_s)
    backend = make_connector(connector, default_namespace=cfg.namespace)
    backend.validate()
    fleet = backend.read_fleet(now_s=now_s)
    with PrometheusCollector(metrics) as collector:
        obs = collector.collect(now_s=now_s, interval_s=cfg.adjustment_interval_s,
                                history_intervals=cfg.predictor.history_intervals,
                                expected_workers={p: getattr(fleet, p).ready_replicas for p in POOLS})
    warmup = (load_warmup_history(cfg.predictor.warmup_trace_path, interval_s=cfg.adjustment_interval_s,
                                  peak_window_s=None if obs.history is None else obs.history.peak_window_s,
                                  peak_step_s=metrics.peak_step_s)
              if needs_warmup(obs, cfg.predictor) else None)
    cache = open_predictor_cache(cfg.predictor.cache_dir, namespace=f"{cfg.namespace}/{cfg.model_id}")
    steps = Steps(predict=functools.partial(predict_load, cache=cache))
    result = plan_steps(obs, fleet, cfg, profile, now_s=now_s, steps=steps, ttft_view=ttft.view, warmup=warmup)
    return DeploymentPlan(name=name, result=result, ttft=ttft, connector=backend, started_s=started)


decide_deployment = task(plan_deployment, name="decide_deployment", task_run_name="decide {name}", **network_task)


def fleet_demands(members: Sequence, plans: Mapping[str, DeploymentPlan | None],
                  profiles: Sequence[EngineProfile]) -> list[DeploymentDemand]:
    """Each deployment's demand on the budget: from its plan, or, when its decide step failed, held where it is.

    members: the fleet's deployments (flows.fleet_config.FleetMember), in file order.
    A deployment without a plan is applied nothing, so it keeps the replicas it has: its demand is fixed at
    them (read through its connector), or at its most (max_replicas) when even they cannot be read, so the
    grants of the others never count on GPUs it may be using.
    """
    out = []
    for m, profile in zip(members, profiles):
        plan = plans.get(m.name)
        if plan is not None:
            out.append(demand_from_plan(m.name, plan.result, cfg=m.run.planner, profile=profile,
                                        priority=m.priority, ttft_view=plan.ttft.view))
            continue
        held, note = _current_or_most(m)
        out.append(DeploymentDemand(m.name, held, dict(held), dict(m.gpus_per_replica), priority=m.priority,
                                    notes=(f"its decide step failed: {note}",)))
    return out


def _current_or_most(member) -> tuple[dict[str, int], str]:
    try:
        backend = make_connector(member.run.connector, default_namespace=member.run.planner.namespace)
        fleet = backend.read_fleet(now_s=time.time())
    except Exception as exc:  # noqa: BLE001 - whatever failed, the safe count is the most it may use
        most = {p: getattr(member.run.planner.decision, p).max_replicas for p in POOLS}
        return most, f"counted at its max_replicas, its replicas unreadable ({' '.join(str(exc).split())})"
    return {p: getattr(fleet, p).current_replicas for p in POOLS}, "held at the replicas it has"


@task(cache_policy=NO_CACHE)
def arbitrate_fleet(fleet, plans: Mapping[str, DeploymentPlan | None],
                    profiles: Sequence[EngineProfile]) -> Arbitration:
    """The budget's grants for every deployment (planner.fleet.arbitrate), from the plans of this run.

    fleet: the checked fleet file (flows.fleet_config.Fleet).
    """
    return arbitrate(fleet_demands(fleet.members, plans, profiles), fleet.budget_gpus,
                     guaranteed_share_frac=fleet.guaranteed_share_frac)


def granted_plan(plan: DeploymentPlan, grant: Grant) -> DeploymentPlan:
    """The plan with its decision cut to the grant: the granted targets, and the budget's reasons after its own."""
    decision = granted_decision(plan.result.decision, grant)
    return dataclasses.replace(plan, result=dataclasses.replace(plan.result, decision=decision))
