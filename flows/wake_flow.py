"""The wake run: pools at zero scaled up at once because requests are waiting for them.

Started by `sla-planner watch` when the wake signal fires (requests held by the
waker or queued at the frontend while a pool is at zero; in-process with
--wake-run, or through the `sla-planner.wake.requested` event and the planner
deployment's trigger). It reads the fleet, decides with planner.decision.wake
(every pool at zero to decision.scale_to_zero.wake_replicas, nothing doubled
or undone), writes through the connector and names itself after what it did
("wake prefill 0→1 decode 0→1"), with a table of the reasons and their numbers.
The next scheduled run sizes the woken fleet as usual.
"""

from __future__ import annotations

import time
from datetime import datetime

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.states import Completed, State

from flows.config import PlannerRunConfig, load_run_config
from flows.planner_flow import _rename_run as rename_run
from flows.report import artifact_key
from planner.decision.wake import at_zero, decide_wake, wake_signal
from planner.types import POOLS
from tasks.apply import apply_decision
from tasks.collect import open_connector, read_fleet
from tasks.wake import fetch_wake_requests


@flow(name="sla-planner-wake", log_prints=False)
def wake_flow(
    config: PlannerRunConfig | None = None,
    config_path: str | None = None,
    waiting_requests: float | None = None,
) -> State:
    """Wake every pool at zero now, if requests are waiting.

    Args:
        config: the whole run configuration inline (the fields of configs/planner.yaml); give this or config_path.
        config_path: path of the run configuration YAML on the worker, e.g. configs/planner.yaml.
        waiting_requests: what the watcher read (metrics.queries.wake_requests); None: read it now.
    """
    if (config is None) == (config_path is None):
        raise ValueError("wake flow: give exactly one of `config` or `config_path`")
    run_cfg = config if config is not None else load_run_config(config_path)
    cfg = run_cfg.planner
    now = time.time()
    connector = open_connector(run_cfg.connector, namespace=cfg.namespace)
    fleet = read_fleet(connector, now_s=now)
    if waiting_requests is None:
        waiting_requests = fetch_wake_requests(run_cfg.metrics, now_s=now, interval_s=cfg.adjustment_interval_s)
    signal = wake_signal(pools_at_zero=at_zero(fleet, cfg.decision), waiting_requests=waiting_requests,
                         min_requests=cfg.decision.scale_to_zero.wake_min_requests)
    decision = decide_wake(fleet=fleet, cfg=cfg.decision, signal=signal)
    record = apply_decision(connector, decision, now_s=now) if decision.apply else None
    before = {p: getattr(fleet, p).current_replicas for p in POOLS}
    after = {"prefill": decision.prefill_replicas, "decode": decision.decode_replicas}
    moves = " ".join(f"{p} {before[p]}→{after[p]}" for p in POOLS if before[p] != after[p])
    stamp = datetime.fromtimestamp(now).strftime("%H:%M:%S")
    name = f"{stamp} wake {moves}" if record is not None else f"{stamp} wake: nothing to do"
    rename_run(name)
    create_table_artifact(
        key=artifact_key("wake", cfg.namespace),
        table=[{"pool": r.pool or "both", "code": r.code.value, "reason": r.message,
                "numbers": ", ".join(f"{k} {v:g}" for k, v in r.numbers.items())} for r in decision.reasons],
        description=f"wake from zero for {cfg.namespace}: {signal.message}",
    )
    message = (f"woke {moves} (decision {record.decision_id}): {signal.message}" if record is not None
               else f"nothing written: {decision.reasons[0].message}")
    get_run_logger().info(message)
    return Completed(message=message, data={"decision": decision.as_dict(), "applied": record is not None,
                                            "decision_id": None if record is None else record.decision_id,
                                            "waiting_requests": waiting_requests})
