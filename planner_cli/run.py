"""`sla-planner run`: one planner flow run against the configured Prometheus and connector.

What the scheduled `planner` deployment does every interval, once, from this shell. It
needs a Prometheus at metrics.prometheus_url that scrapes the fleet's Dynamo frontend
and workers, and the connector's backend (the Kubernetes API, or etcd for the virtual
connector; the local connector keeps a file). Both are checked before Prefect starts,
so an unreachable one is one line at once instead of a failed run after its retries.
--dry-run, or any what-if option, decides without applying anything.

No Prometheus at hand? `sla-planner plan` runs the same flow against a simulated fleet.
"""

from __future__ import annotations

import argparse
import sys
import time

from planner_cli.command import add_config_option, command_parser


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "run", doc=__doc__,
                       help="one planner flow run against the configured Prometheus and connector (what the deployment "
                            "runs)")
    add_config_option(p)
    p.add_argument("--dry-run", action="store_true", help="decide, apply nothing")
    what_if = p.add_argument_group("what-if (decide for other conditions; nothing is applied)")
    what_if.add_argument("--load-multiplier", type=float, default=None, help="scale the observed load by this")
    what_if.add_argument("--ttft-ms", type=float, default=None, help="plan for this TTFT target instead, ms")
    what_if.add_argument("--itl-ms", type=float, default=None, help="plan for this ITL target instead, ms")
    p.add_argument("--verbose", action="store_true", help="show Prefect's run logs too")


def run(args: argparse.Namespace) -> int:
    from planner_cli.local_prefect import prefect_api, prefect_env

    prefect_env(verbose=args.verbose)
    from connectors.profiles import load_profile
    from flows.config import load_run_config
    from planner.whatif import WhatIf

    try:
        cfg = load_run_config(args.config)
        try:
            load_profile(cfg.planner.profile)
        except (ValueError, OSError) as exc:
            raise ValueError(f"{args.config}: planner.profile: {exc}") from None
        options = {"load_multiplier": args.load_multiplier, "ttft_ms": args.ttft_ms, "itl_ms": args.itl_ms}
        given = {k: v for k, v in options.items() if v is not None}
        what_if = WhatIf(**given) if given else None
    except ValueError as exc:  # pydantic's ValidationError included
        print(f"sla-planner run: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    _check_backends(cfg)
    with prefect_api("run", verbose=args.verbose, debug=args.debug):
        from flows.planner_flow import planner_flow

        out = planner_flow(config=cfg, dry_run=args.dry_run, what_if=what_if)
    print(run_line(out))
    return 0


def run_line(out: dict) -> str:
    """What `sla-planner run` prints of a planner flow run's result data: targets, outcome, reason codes."""
    d, cur = out["decision"], out["current"]
    how = "dry run" if out["dry_run"] else ("applied, decision " + str(out["decision_id"]) if out["applied"]
                                            else "nothing to write")
    if out.get("advisory"):
        adv = out["advisory"]
        how = (f"advisory, nothing written; {adv['autoscaler']} has prefill {adv['now']['prefill']['autoscaler']}, "
               f"decode {adv['now']['decode']['autoscaler']}")
    return (f"prefill {cur['prefill']} -> {d['prefill_replicas']}, decode {cur['decode']} -> {d['decode_replicas']} "
            f"({how}); reasons: {', '.join(dict.fromkeys(r['code'] for r in d['reasons']))}")


def _check_backends(cfg) -> None:
    """Read the fleet and the metrics once, as the flow will: the connector's and the collector's
    own errors name the server, what was being done and the cause."""
    from connectors.factory import make_connector
    from connectors.prometheus import PrometheusCollector

    connector = make_connector(cfg.connector, default_namespace=cfg.planner.namespace)
    connector.validate()
    with PrometheusCollector(cfg.metrics) as collector:
        collector.collect(now_s=time.time(), interval_s=cfg.planner.adjustment_interval_s, history_intervals=1)
