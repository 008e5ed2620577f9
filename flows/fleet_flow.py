"""The fleet flow: every deployment of a fleet file planned in one run, under one GPU budget.

decide every deployment → arbitrate the budget → apply and explain each deployment in its own run.

Arbitration needs every deployment's wanted targets before anything is applied, so one fleet run
decides them all (each deployment's decide step is a task run of the fleet run, `decide <name>`,
run side by side in a thread pool: most of a decide step waits on Prometheus), arbitrates once,
then gives each deployment its own run, created under its final name
(`chat 12:05 prefill 2→3 decode 4`), which applies its granted targets and publishes what a planner
run publishes: its state message, decision table (with the budget's reasons), summary and chart.
A deployment the budget held says so, with who the GPUs went to, in its own run. That run is a task
run of the fleet run by default, or a subflow run (`deployment_runs`), which the server pays ~10
blocking calls for; one flow run per deployment would also pay a process start each, and could not
arbitrate before applying (docs/control-plane.md measures the shapes).

A deployment whose decide step fails (after its retries) is applied nothing: its GPUs count at the
replicas it has (at its max_replicas when those cannot be read either), so nothing the others are
granted can overrun the budget, and the fleet run ends Failed (retry it from the UI: it decides
every deployment again).
"""

from __future__ import annotations

import contextvars
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.states import Completed, Failed, State
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.task_runners import ThreadPoolTaskRunner

from flows.fleet_config import Fleet, FleetMember, load_fleet
from flows.planner_flow import publish_run
from flows.report import artifact_key, run_name
from tasks.apply import apply_decision
from tasks.retry import network_task
from tasks.fleet import DeploymentPlan, arbitrate_fleet, decide_deployment, granted_plan, load_fleet_profiles

# Decide steps in flight at once: enough to keep Prometheus busy while one thread plans (the GIL
# lets one run Python at a time), few enough that a slow Prometheus is not hit by the whole fleet.
DECIDE_THREADS = 8
# Deployment runs created, applied and published at once.
EXPLAIN_THREADS = 4


@flow(name="sla-planner-fleet", log_prints=False, task_runner=ThreadPoolTaskRunner(max_workers=DECIDE_THREADS))
def fleet_flow(
    fleet_path: str = "configs/fleet.yaml",
    dry_run: bool = False,
    charts: Literal["changed", "all", "none"] = "changed",
    deployment_runs: Literal["task", "subflow"] = "task",
    now_s: float | None = None,
) -> State:
    """Plan every deployment of the fleet file, arbitrate the GPU budget, apply each grant in its own run.

    Args:
        fleet_path: the fleet file on the worker (flows.fleet_config), e.g. configs/fleet.yaml.
        dry_run: decide and arbitrate, apply nothing (artifacts under the what-if keys).
        charts: which deployment runs draw their chart: changed (targets moved or held by the budget), all, none.
        deployment_runs: what each deployment's apply-and-explain step is: a task run of this run (named,
            message, artifacts; at 100 deployments a round 2.8x shorter) or a subflow run of its own.
        now_s: advanced, leave empty: the run's clock, Unix seconds (replays, benchmarks, tests).
    """
    fleet = load_fleet(fleet_path)
    now = time.time() if now_s is None else now_s
    phases_s = {"start": time.perf_counter()}
    members = fleet.members
    profiles = load_fleet_profiles([m.run.planner.profile for m in members])
    futures = [
        decide_deployment.submit(
            m.name, m.run.planner, profile, metrics=m.run.metrics, connector=m.run.connector,
            latency_model=m.run.latency_model, now_s=now)
        for m, profile in zip(members, profiles)
    ]
    plans: dict[str, DeploymentPlan | None] = {}
    for m, future in zip(members, futures):
        future.wait()
        plans[m.name] = future.result() if future.state.is_completed() else None
        if plans[m.name] is None:
            get_run_logger().error("%s: decide failed, held: %s", m.name, future.state.message)
    phases_s["decide"] = time.perf_counter()
    arbitration = arbitrate_fleet(fleet, plans, profiles)
    phases_s["arbitrate"] = time.perf_counter()
    granted = {m.name: granted_plan(plans[m.name], arbitration.grants[m.name])
               for m in members if plans[m.name] is not None}

    explained: dict[str, State] = {}
    latencies: dict[str, float] = {}  # decide start to published, s

    # A deployment run's parameters are what the UI shows of it (its name and grant); the plan it applies
    # stays in this process: as a parameter, Prefect would walk and encode it (~0.1 s each).
    def deployment_run(name: str, deployment: str, granted_targets: dict[str, int], chart: bool) -> State:
        """Apply one deployment's granted targets (unless a dry run) and publish its decision as a planner run.

        The run was created under its final name (`chat 12:05 prefill 2→3 decode 4`); its message, decision
        table (with the budget's reasons), summary and chart are a planner run's. Another writer moving the
        replicas since the decide step fails this run (the connector refuses the stale write): deciding again
        here could overrun the grant, and the next fleet run decides from them.
        """
        plan = granted[deployment]
        # Inside a task run the write is a plain call (this task retries); a subflow runs it as its task.
        apply = apply_decision if deployment_runs == "subflow" else apply_decision.fn
        record = None if dry_run else apply(plan.connector, plan.result.decision, now_s=now)
        state = publish_run(fleet.member(deployment).run, plan.result, record, now_s=now, applying=not dry_run,
                            what_if="", ttft=plan.ttft, named=name, chart=chart)
        latencies[deployment] = time.perf_counter() - plan.started_s
        return state

    def chart_for(plan: DeploymentPlan) -> bool:
        return charts == "all" or (charts == "changed" and _moved_or_held(plan))

    def name_of(m: FleetMember) -> str:
        return f"{m.name} " + run_name(granted[m.name].result, now_s=now, applying=not dry_run)

    if deployment_runs == "task":
        # Task runs reach the server as events, batched, where a flow run makes ~10 blocking calls.
        explain_task = task(deployment_run, name="explain_deployment", task_run_name="{name}", **network_task)
        futures = {m.name: explain_task.submit(name=name_of(m), deployment=m.name,
                                               granted_targets=granted[m.name].wanted,
                                               chart=chart_for(granted[m.name]))
                   for m in members if m.name in granted}
        for name, future in futures.items():
            future.wait()
            explained[name] = future.state
    else:
        # Named by its `name` parameter: a name given with with_options would rebuild the parameter schema
        # (~0.2 s of CPU) for every deployment.
        run_flow = flow(deployment_run, name="sla-planner-deployment", flow_run_name="{name}", log_prints=False)

        def explain(m: FleetMember) -> None:
            explained[m.name] = run_flow(name=name_of(m), deployment=m.name, granted_targets=granted[m.name].wanted,
                                         chart=chart_for(granted[m.name]), return_state=True)

        # Each deployment run waits on the server for most of its time: a few side by side keep it busy.
        # Each thread starts from this run's context, so the runs are this run's subflows. They send no
        # heartbeats of their own: one lasts about a second, and its exit would wait up to 1 s for the
        # heartbeat thread's next wake-up (this fleet run's heartbeats go on; settings are copied once here:
        # ~0.4 s of CPU each).
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}), \
                ThreadPoolExecutor(max_workers=EXPLAIN_THREADS, thread_name_prefix="explain") as pool:
            for m in members:
                if m.name in granted:
                    pool.submit(contextvars.copy_context().run, explain, m)
    rows, failed = [], [n for n, p in plans.items() if p is None]
    for m in members:
        if m.name not in granted:
            rows.append(_row(m, None, None, applied=False, outcome="decide failed: held where it is"))
            continue
        state = explained[m.name]
        if state.is_completed():
            rows.append(_row(m, plans[m.name], granted[m.name], applied=state.result()["applied"],
                             outcome=state.message))
        else:
            failed.append(m.name)
            rows.append(_row(m, plans[m.name], granted[m.name], applied=False, outcome=f"failed: {state.message}"))
    phases_s["apply and explain"] = time.perf_counter()
    message = _fleet_message(fleet, arbitration, rows, failed=failed, dry_run=dry_run)
    create_table_artifact(key=artifact_key("fleet", fleet.path.stem, what_if=dry_run), table=rows,
                          description=f"fleet {fleet.path}: per deployment current, wanted, granted targets; {message}")
    data = {"deployments": [{**r, "latency_s": latencies.get(r["deployment"])} for r in rows],
            "budget_gpus": fleet.budget_gpus, "wanted_gpus": arbitration.wanted_gpus,
            "granted_gpus": arbitration.granted_gpus, "phases_s": _durations(phases_s)}
    if failed:
        return Failed(message=message)
    return Completed(message=message, data=data)


def _durations(marks: dict[str, float]) -> dict[str, float]:
    """Seconds between consecutive marks, named by the later one (the phase that ended there)."""
    names, times = list(marks), list(marks.values())
    return {names[i]: round(times[i] - times[i - 1], 3) for i in range(1, len(times))}


def _moved_or_held(plan: DeploymentPlan) -> bool:
    """The targets differ from what is set, or the budget held the deployment below what it wanted."""
    d = plan.result.decision
    return (plan.current != {"prefill": d.prefill_replicas, "decode": d.decode_replicas}
            or any(r.pool is not None and r.code.value == "fleet_budget" for r in d.reasons))


def _row(m: FleetMember, plan: DeploymentPlan | None, granted: DeploymentPlan | None, *, applied: bool,
         outcome: str) -> dict:
    """The fleet table's row of one deployment: current, wanted and granted targets, and what happened."""
    def targets(t: dict | None) -> str:
        return "-" if t is None else f"prefill {t['prefill']}, decode {t['decode']}"

    return {"deployment": m.name, "priority": m.priority, "current": targets(plan and plan.current),
            "wanted": targets(plan and plan.wanted), "granted": targets(granted and granted.wanted),
            "applied": applied, "outcome": outcome}


def _fleet_message(fleet: Fleet, arbitration, rows: list[dict], *, failed: list[str], dry_run: bool) -> str:
    """The fleet run's state message: deployments, GPUs wanted and granted against the budget, who was held."""
    held = [n for n, g in arbitration.grants.items() if g.held]
    text = (f"{len(rows)} deployments, {arbitration.wanted_gpus} GPUs wanted, {arbitration.granted_gpus} granted "
            f"of {fleet.budget_gpus}")
    text += f"; held by the budget: {', '.join(held)}" if held else "; every deployment granted what it wanted"
    text += f"; failed: {', '.join(failed)}" if failed else ""
    return ("dry run, " if dry_run else "") + text
