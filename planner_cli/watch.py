"""`sla-planner watch`: the fast path's watcher, between the planner's scheduled runs.

Every planner.fast_path.poll_s it reads the saturation guardrail's per-pod queue
and KV-cache series (and the routing service's shed counter,
metrics.queries.shed_requests) from Prometheus. When the saturation signal
fires it sends the Prefect event `sla-planner.saturation.detected` for the
planner's namespace and model, at most once per fast_path.cooldown_s; the
planner deployment's trigger (prefect.yaml) then starts a scale-up-only run.

With decision.allow_scale_to_zero it also watches for requests waiting for a
pool at zero (metrics.queries.wake_requests: held by the waker, queued at the
frontend; the fleet read through the connector says which pools are at zero):
then it sends `sla-planner.wake.requested` (the wake deployment's trigger), or
with --wake-run runs the wake flow itself at once (no deployment, no worker's
pick-up delay; the run is still a Prefect run with its artifacts).

Needs planner.fast_path.enabled or decision.allow_scale_to_zero, PREFECT_API_URL
(the Prefect server the planner deployment lives on) and a Prometheus at
metrics.prometheus_url. An unreachable Prometheus is one line on stderr and the
next poll tries again. Prints one line per event sent or wake run; --verbose
also prints every poll.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import datetime

from planner_cli.command import add_config_option, command_parser


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "watch", doc=__doc__,
                       help="poll the saturation signal and send the Prefect event that starts a scale-up-only planner "
                            "run")
    add_config_option(p)
    p.add_argument("--polls", type=int, default=None, help="stop after this many polls (default: run until stopped)")
    p.add_argument("--verbose", action="store_true", help="print every poll, not only the events sent")
    p.add_argument("--wake-run", action="store_true", help="at zero with requests waiting, run the wake flow here "
                   "instead of sending the wake event")


class SaturationWatcher:
    """Reads the signal from Prometheus and sends the event, at most once per cooldown_s.

    The cooldown here only spares Prefect repeated events; the planner's own
    cooldown (from the decision history) is what guards the fleet.
    """

    def __init__(self, run_cfg, collector, *, emit: Callable | None = None):
        from connectors.prefect_events import emit_saturation

        self.run_cfg = run_cfg
        self.collector = collector
        self.emit = emit or emit_saturation
        self.last_sent_s: float | None = None

    def poll(self, *, now_s: float) -> tuple[object, object | None, str]:
        """(signal, event sent or None, one line saying what happened). now_s: Unix seconds."""
        from planner.saturation.fast_path import saturation_signal

        cfg = self.run_cfg.planner
        pods, shed, problems = self.collector.saturation_inputs(now_s=now_s, interval_s=cfg.adjustment_interval_s)
        signal = saturation_signal(
            pods=pods, thresholds=cfg.saturation.for_model(cfg.model_id, cfg.namespace), cfg=cfg.fast_path,
            shed_requests=shed,
        )
        stamp = datetime.fromtimestamp(now_s).strftime("%H:%M:%S")
        notes = f" ({'; '.join(problems)})" if problems else ""
        if not signal.fire:
            return signal, None, f"{stamp} quiet: {len(pods)} pods reporting{notes}"
        if self.last_sent_s is not None and now_s - self.last_sent_s < cfg.fast_path.cooldown_s:
            return signal, None, (f"{stamp} saturated, event sent {now_s - self.last_sent_s:.0f} s ago "
                                  f"(cooldown {cfg.fast_path.cooldown_s:g} s): {signal.message}")
        event = self.emit(signal, namespace=cfg.namespace, model_id=cfg.model_id, now_s=now_s)
        if event is None:
            raise RuntimeError("Prefect sends no events from this process: set PREFECT_API_URL to the server "
                               "the planner deployment runs on")
        self.last_sent_s = now_s
        return signal, event, f"{stamp} saturated: {signal.message} -> event {event.event} {event.id}{notes}"


class WakeWatcher:
    """While a pool is at zero, reads the requests waiting for it and starts the wake.

    wake(signal, waiting_requests, now_s): what starts the wake run (the event, or the flow in-process); it is
    called again only once the fleet is at zero again (the wake's targets are in flight or set meanwhile).
    """

    def __init__(self, run_cfg, collector, connector, *, wake: Callable):
        self.run_cfg, self.collector, self.connector, self.wake = run_cfg, collector, connector, wake

    def poll(self, *, now_s: float) -> tuple[object, object | None, str]:
        """(signal, what wake returned or None, one line saying what happened). now_s: Unix seconds."""
        from planner.decision.wake import at_zero, wake_signal

        cfg = self.run_cfg.planner
        pools = at_zero(self.connector.read_fleet(now_s=now_s), cfg.decision)
        waiting = (self.collector.wake_requests(now_s=now_s, interval_s=cfg.adjustment_interval_s)
                   if pools else None)
        signal = wake_signal(pools_at_zero=pools, waiting_requests=waiting,
                             min_requests=cfg.decision.scale_to_zero.wake_min_requests)
        stamp = datetime.fromtimestamp(now_s).strftime("%H:%M:%S")
        if not signal.fire:
            return signal, None, f"{stamp} no wake: {signal.message}"
        started = self.wake(signal, waiting, now_s)
        return signal, started, f"{stamp} wake: {signal.message} -> {started}"


def wake_by_event(run_cfg) -> Callable:
    """Send sla-planner.wake.requested (the wake deployment's trigger starts the run)."""
    from connectors.prefect_events import emit_wake

    def wake(signal, waiting, now_s):
        event = emit_wake(signal, namespace=run_cfg.planner.namespace, model_id=run_cfg.planner.model_id,
                          now_s=now_s)
        if event is None:
            raise RuntimeError("Prefect sends no events from this process: set PREFECT_API_URL to the server "
                               "the wake deployment runs on")
        return f"event {event.event} {event.id}"
    return wake


def wake_by_run(run_cfg) -> Callable:
    """Run the wake flow in this process, now."""
    from flows.wake_flow import wake_flow

    from prefect import get_client

    def wake(signal, waiting, now_s):
        state = wake_flow(config=run_cfg, waiting_requests=waiting, return_state=True)
        with get_client(sync_client=True) as client:
            name = client.read_flow_run(state.state_details.flow_run_id).name
        return f"wake run '{name}' {state.name}: {state.message}"
    return wake


def run(args: argparse.Namespace) -> int:
    if args.polls is not None and args.polls < 1:
        print("sla-planner watch: --polls must be >= 1", file=sys.stderr)
        return 2
    from prefect.settings import PREFECT_API_URL

    from connectors.prometheus import PrometheusCollector
    from flows.config import load_run_config

    cfg = load_run_config(args.config)
    zero = cfg.planner.decision.allow_scale_to_zero
    if not cfg.planner.fast_path.enabled and not zero:
        raise ValueError(f"{args.config}: planner.fast_path.enabled and planner.decision.allow_scale_to_zero are "
                         "both false: nothing to watch (docs/control.md, Fast path; docs/scale-to-zero.md)")
    if not PREFECT_API_URL.value():
        raise ValueError("no Prefect API: set PREFECT_API_URL to the server the planner deployment runs on")
    poll_s = cfg.planner.fast_path.poll_s
    with PrometheusCollector(cfg.metrics) as collector:
        watchers = []
        if cfg.planner.fast_path.enabled:
            watchers.append(SaturationWatcher(cfg, collector))
        if zero:
            from connectors.factory import make_connector

            connector = make_connector(cfg.connector, default_namespace=cfg.planner.namespace)
            watchers.append(WakeWatcher(cfg, collector, connector,
                                        wake=wake_by_run(cfg) if args.wake_run else wake_by_event(cfg)))
        start = time.time()
        n = 0
        while args.polls is None or n < args.polls:
            now = time.time()
            for watcher in watchers:
                try:
                    _, event, line = watcher.poll(now_s=now)
                except ConnectionError as exc:
                    print(f"sla-planner watch: {' '.join(str(exc).split())}; trying again in {poll_s:g} s",
                          file=sys.stderr, flush=True)
                else:
                    if event is not None or args.verbose:
                        print(line, flush=True)
            n += 1
            if args.polls is not None and n >= args.polls:
                break
            # On the poll grid from the start: a slow poll does not push the later ones back.
            time.sleep(max(0.0, start + n * poll_s - time.time()))
    return 0
