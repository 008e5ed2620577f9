"""The planner flow (a file name apart from the `planner` package, because Prefect
puts this folder on sys.path when it loads the entrypoint): collect → correct → predict → warm-up floor → interpolate → analyze saturation → decide → apply.

Scheduled every adjustment interval (prefect.yaml). Each step is its own task,
so the UI shows which one failed or retried. A run rebuilds everything from
Prometheus and the connector, so a crashed or rescheduled run loses nothing.
`dry_run` or a what-if decides without applying.
"""

from __future__ import annotations

import dataclasses
import functools
import time

from prefect import flow, get_run_logger
from prefect.artifacts import create_image_artifact, create_markdown_artifact, create_table_artifact
from prefect.states import Completed, State

from connectors.base import Connector, FleetChangedError
from flows.advisory import AdvisoryView, advisory_view
from flows.charts import planner_chart_png, png_data_url
from flows.config import PlannerRunConfig, ReplayInputs, load_run_config
from flows.report import artifact_key, decision_summary, decision_table, run_message, run_name
from planner.config import PlannerConfig
from planner.advisory import advisory_fleet
from planner.pipeline import PlanResult, Steps, plan_steps
from planner.latency.profile import EngineProfile
from planner.steps import needs_warmup
from planner.latency.ttft_view import TtftView
from planner.types import DecisionRecord
from routing.models.planner_view import TtftChoice
from planner.whatif import WhatIf, apply_what_if, effective_config
from tasks.advisory import compare_with_autoscaler, fetch_advisory_history
from tasks.apply import apply_decision
from tasks.collect import collect_metrics, fetch_ready_history, open_connector, read_fleet
from tasks.latency_model import fetch_ttft_view
from tasks.steps import (
    analyze_fleet_saturation,
    correct_latency,
    decide_targets,
    interpolate_replicas,
    load_profiling_data,
    load_warmup_history,
    open_predictor_cache,
    predict_load,
    size_warmup_floor,
)

# The pipeline's steps, each as its Prefect task of the same name (tests/flows/test_flow_planner.py checks it).
STEP_TASKS = Steps(
    correct=correct_latency,
    predict=predict_load,
    warmup_floor=size_warmup_floor,
    interpolate=interpolate_replicas,
    analyze_saturation=analyze_fleet_saturation,
    decide=decide_targets,
)


# How far back the ready counts are read for the measured startup times (scale to zero), s.
READY_HISTORY_S = 6 * 3600.0


@flow(name="sla-planner", log_prints=False)
def planner_flow(
    config: PlannerRunConfig | None = None,
    config_path: str | None = None,
    dry_run: bool = False,
    what_if: WhatIf | None = None,
    fast_path: bool = False,
    replay: ReplayInputs | None = None,
) -> State:
    """Plan one adjustment interval and apply it (unless dry_run or what_if).

    The run is renamed after its interval and targets (`12:05 prefill 2→3 decode 4`), ends with
    a message saying why, and publishes its decision table, summary and chart.

    Args:
        config: the whole run configuration inline (the fields of configs/planner.yaml); give this or config_path.
        config_path: path of the run configuration YAML on the worker, e.g. configs/planner.yaml.
        dry_run: decide and publish the decision, apply nothing (artifacts under the what-if keys).
        what_if: plan for scaled load or other SLA targets; nothing is applied (artifacts under the what-if keys).
        fast_path: started by the saturation trigger (prefect.yaml's triggers, `sla-planner watch`):
            scale up only, after planner.fast_path.cooldown_s.
        replay: advanced, leave empty: metrics and clock given instead of Prometheus and the current time
            (replays, the simulator, tests).
    """
    run_cfg = _resolve_config(config, config_path)
    observation = None if replay is None else replay.observation
    now = time.time() if replay is None or replay.now_s is None else replay.now_s
    cfg = effective_config(run_cfg.planner, what_if)
    # planner.mode advisory: a scheduled run decides and publishes as one that applies, and writes nothing.
    advisory = not dry_run and what_if is None and cfg.mode == "advisory"
    applying = not dry_run and what_if is None and not advisory

    profile = load_profiling_data(cfg.profile)
    ttft = fetch_ttft_view(run_cfg.latency_model, profile, now_s=now)
    connector = open_connector(run_cfg.connector, namespace=cfg.namespace, read_only=advisory)
    # Fleet first, then metrics: load that arrives in between is counted against
    # the older replica numbers, so any error leans toward more replicas.
    fleet = read_fleet(connector, now_s=now)
    history = fetch_advisory_history(run_cfg.metrics, run_cfg.advisory, cfg, now_s=now) if advisory else None
    if history is not None:
        fleet = advisory_fleet(fleet, autoscaler=history.autoscaler, recommended=history.recommended)
    # Fitted predictor state is reused only for the live series of this model;
    # a what-if's scaled load or a given observation never touches it.
    cache_namespace = f"{cfg.namespace}/{cfg.model_id}" if observation is None and what_if is None else None
    if observation is None:
        observation = collect_metrics(
            run_cfg.metrics,
            now_s=now,
            interval_s=cfg.adjustment_interval_s,
            history_intervals=cfg.predictor.history_intervals,
            fleet=fleet,
        )
        if cfg.decision.allow_scale_to_zero:
            # Scale to zero weighs a cold start by each pool's startup, measured from these ready counts.
            fleet = dataclasses.replace(fleet, ready_history=fetch_ready_history(
                run_cfg.metrics, now_s=now, window_s=READY_HISTORY_S, interval_s=cfg.adjustment_interval_s,
                step_s=min(5.0, cfg.adjustment_interval_s / 10.0)))
    obs = apply_what_if(observation, what_if)
    # The warm-up's peak rates over the live window, so burst and clumping read from the first run.
    warmup = (load_warmup_history(cfg.predictor.warmup_trace_path, interval_s=cfg.adjustment_interval_s,
                                  peak_window_s=None if obs.history is None else obs.history.peak_window_s,
                                  peak_step_s=run_cfg.metrics.peak_step_s)
              if needs_warmup(obs, cfg.predictor) else None)
    cache = open_predictor_cache(cfg.predictor.cache_dir, namespace=cache_namespace)
    steps = dataclasses.replace(STEP_TASKS, predict=functools.partial(predict_load, cache=cache))
    # A planner just started keeps what the warm-up's last window needed until its own fill the window
    # (the pipeline's warm-up floor step).
    result = plan_steps(obs, fleet, cfg, profile, now_s=now, steps=steps, fast_path=fast_path, ttft_view=ttft.view,
                        warmup=warmup)
    result, record = _apply(result, connector, cfg, profile, steps=steps, now_s=now, applying=applying,
                            fast_path=fast_path, ttft_view=ttft.view)
    view = None if history is None else advisory_view(
        compare_with_autoscaler(result, history, run_cfg.advisory, now_s=now, interval_s=cfg.adjustment_interval_s),
        history, result.decision, autoscaler=run_cfg.advisory.name, now_s=now)
    what_if_text = "" if what_if is None else f"what-if {what_if.model_dump(exclude_none=True)}"
    return publish_run(run_cfg, result, record, now_s=now, applying=applying, what_if=what_if_text, ttft=ttft,
                       advisory=view)


def _apply(
    result: PlanResult, connector: Connector, cfg: PlannerConfig, profile: EngineProfile, *,
    steps: Steps, now_s: float, applying: bool, fast_path: bool, ttft_view: TtftView | None,
) -> tuple[PlanResult, DecisionRecord | None]:
    """Write the decision unless the run only decides; (the plan carried out, its record or None)."""
    if not applying:
        return result, None
    try:
        return result, apply_decision(connector, result.decision, now_s=now_s)
    except FleetChangedError as exc:
        # Another writer moved the replicas after our read: decide again from the fleet as it is
        # now (the old decision is never written); a second change within the run fails it.
        get_run_logger().warning("%s; reading the fleet again and deciding from it", exc)
        fleet = read_fleet(connector, now_s=now_s)
        result = plan_steps(result.observation, fleet, cfg, profile, now_s=now_s, steps=steps,
                            fast_path=fast_path, previous=result, ttft_view=ttft_view)
        return result, apply_decision(connector, result.decision, now_s=now_s)


def publish_run(
    run_cfg: PlannerRunConfig, result: PlanResult, record: DecisionRecord | None, *,
    now_s: float, applying: bool, what_if: str, ttft: TtftChoice, named: str | None = None, chart: bool = True,
    advisory: AdvisoryView | None = None,
) -> State:
    """Rename the run, publish its artifacts, gauges and log line; the Completed state saying why.

    named: the name the run was created with (a fleet run's deployment runs are named when they start),
        so it is not renamed; None: renamed after the decision. chart: publish the chart image too.
    advisory: a recommend-only run's comparison with the running autoscaler (planner.mode advisory): published
        under the live keys, beside the decision.
    """
    namespace, fleet, decision, forecast = run_cfg.planner.namespace, result.fleet, result.decision, result.forecast
    live, view = applying or advisory is not None, advisory
    summary = decision_summary(result, record=record, dry_run=not applying, what_if=what_if,
                               ttft_source=(ttft.source, ttft.reason), advisory=view and view.summary)
    name = named or run_name(result, now_s=now_s, applying=applying, what_if=bool(what_if), advisory=bool(view))
    message = run_message(result, record=record, applying=applying, what_if=bool(what_if), advisory=bool(view))
    if named is None:
        _rename_run(name)
    # Dry runs and what-ifs keep their own keys: a live key's history is the scheduled runs' (applied or advisory).
    create_table_artifact(
        key=artifact_key("decision", namespace, what_if=not live),
        table=decision_table(result, record=record, dry_run=not applying, ttft_source=(ttft.source, ttft.reason),
                             slo=run_cfg.planner.slo, advisory=view and view.rows),
        description=f"planner decision for {namespace}: inputs, forecast, factors, targets, reasons",
    )
    create_markdown_artifact(
        key=artifact_key("summary", namespace, what_if=not live), markdown=summary,
        description="planner decision summary",
    )
    if chart:
        create_image_artifact(
            image_url=png_data_url(planner_chart_png(
                result, now_s=now_s, record=record, title=f"{namespace}: {name}", advisory=view and view.lines,
                **({"window_s": run_cfg.advisory.window_s} if view else {}))),
            key=artifact_key("chart", namespace, what_if=not live),
            description=f"{namespace}: observed and forecast load, recommended and applied replicas ({message})",
        )
    if view:
        create_table_artifact(
            key=artifact_key("advisory", namespace), table=view.series,
            description=f"{namespace}: ours and {view.lines.autoscaler}'s replicas per pool, a row where either changed",
        )
    if run_cfg.planner_metrics.enabled:
        _publish_planner_metrics(run_cfg, result, record, advisory=bool(view))
    get_run_logger().info(
        "prefill %d -> %d, decode %d -> %d (%s); reasons: %s",
        fleet.prefill.current_replicas,
        decision.prefill_replicas,
        fleet.decode.current_replicas,
        decision.decode_replicas,
        "advisory" if view else "dry run" if not applying else ("applied" if record else "not written"),
        ", ".join(decision.codes()),
    )
    return Completed(message=message, data={
        "decision": decision.as_dict(),
        "decision_id": None if record is None else record.decision_id,
        "applied": record is not None,
        "dry_run": not applying,
        "forecast": None
        if forecast is None
        else {
            "num_requests": forecast.num_requests,
            "num_requests_p90": forecast.num_requests_p90,
            "avg_isl_tokens": forecast.avg_isl_tokens,
            "avg_osl_tokens": forecast.avg_osl_tokens,
            "predictor": forecast.predictor,
            "clumping_index": forecast.clumping_index,
            "sized_on": forecast.sized_on,
        },
        "corrections": {"prefill": result.corrections.prefill, "decode": result.corrections.decode},
        "ttft_source": {"source": ttft.source, "reason": ttft.reason},
        "current": {"prefill": fleet.prefill.current_replicas, "decode": fleet.decode.current_replicas},
        "advisory": view and view.as_dict(),
    })


def _rename_run(name: str) -> None:
    """Give the running flow run its decision as its name (the name is only known after deciding)."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if flow_run.id is None:
        return
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=name)


def _resolve_config(config: PlannerRunConfig | None, config_path: str | None) -> PlannerRunConfig:
    if config is not None and config_path is not None:
        raise ValueError("planner flow: give either `config` or `config_path`, not both")
    if config is not None:
        return config
    if config_path is not None:
        return load_run_config(config_path)
    raise ValueError("planner flow: no configuration: pass `config` or `config_path`")


def _publish_planner_metrics(run_cfg: PlannerRunConfig, result: PlanResult, record, *, advisory: bool = False) -> None:
    from connectors.planner_metrics import publish_run

    publish_run(
        run_cfg.planner_metrics,
        result=result,
        record=record,
        namespace=run_cfg.planner.namespace,
        model_id=run_cfg.planner.model_id,
        slo=run_cfg.planner.slo,
        inference_pool=run_cfg.llmd_inference_pool,
        advisory=advisory,
    )
