"""`sla-planner fleet run`: one fleet flow run, every deployment of a fleet file under its GPU budget.

What the scheduled `fleet` deployment does every interval, once, from this shell: decide every
deployment, arbitrate the budget, apply each grant in its own deployment run. The fleet file and every
run configuration it names are checked first (a priority that is not a number, one name or one target
used twice, minimums above the budget), each problem one line before any run; nothing is applied then.
--dry-run decides and arbitrates without applying.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from planner_cli.command import command_parser

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FLEET = PROJECT_ROOT / "configs" / "fleet.yaml"


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "fleet", doc=__doc__,
                       help="plan every deployment of a fleet file under one GPU budget (what the fleet deployment "
                            "runs)")
    sub = p.add_subparsers(dest="fleet_command", metavar="{run}")
    sub.required = True
    r = sub.add_parser("run", help="one fleet flow run: decide all, arbitrate the budget, apply each grant")
    r.add_argument("--fleet", default=str(DEFAULT_FLEET), help="fleet file (default: %(default)s)")
    r.add_argument("--dry-run", action="store_true", help="decide and arbitrate, apply nothing")
    r.add_argument("--charts", choices=("changed", "all", "none"), default="changed",
                   help="which deployment runs draw their chart (default: %(default)s: targets moved or held)")
    r.add_argument("--verbose", action="store_true", help="show Prefect's run logs too")


def run(args: argparse.Namespace) -> int:
    from planner_cli.local_prefect import prefect_api, prefect_env

    prefect_env(verbose=args.verbose)
    from flows.fleet_config import load_fleet

    try:
        load_fleet(args.fleet)
    except ValueError as exc:
        print(f"sla-planner fleet run: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    with prefect_api("fleet run", verbose=args.verbose, debug=args.debug):
        from flows.fleet_flow import fleet_flow

        state = fleet_flow(fleet_path=args.fleet, dry_run=args.dry_run, charts=args.charts, return_state=True)
    if not state.is_completed():
        print(f"sla-planner fleet run: {state.message}", file=sys.stderr)
        return 1
    out = state.result()
    for d in out["deployments"]:
        print(f"{d['deployment']:<20} {d['current']} -> {d['granted']} (wanted {d['wanted']}); {d['outcome']}")
    print(state.message)
    return 0
