"""The `sla-planner` console command: one subcommand per user job.

Each subcommand lives in its own module with `add_parser(subparsers)` and
`run(args) -> int`; heavy imports (Prefect, pandas, models) happen inside
`run`, so `sla-planner --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, what it does) in the order `--help` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "planner_cli.plan",
    "planner_cli.backtest",
    "planner_cli.whatif",
    "planner_cli.router",
    "planner_cli.stack",
    "planner_cli.executor",
    "planner_cli.importer",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sla-planner",
        description="SLA-driven autoscaling for disaggregated LLM inference fleets",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(name)
        before = set(subparsers.choices)
        module.add_parser(subparsers)
        for command in set(subparsers.choices) - before:
            subparsers.choices[command].set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
