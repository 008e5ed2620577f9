"""The `sla-planner` console command: one subcommand per user job.

Each subcommand lives in its own module with `add_parser(subparsers)` and
`run(args) -> int`; heavy imports (Prefect, pandas, models) happen inside
`run`, so `sla-planner --help` stays fast.

An error a subcommand does not handle itself is one line naming it, exit code 2 for
bad input (a file, field or option) and 1 for a failure at run time (an unreachable
server, a failed run); `--debug` shows the traceback instead. Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, what it does) in the order `--help` lists them.
SUBCOMMANDS: tuple[str, ...] = (
    "planner_cli.plan",
    "planner_cli.run",
    "planner_cli.fleet",
    "planner_cli.backtest",
    "planner_cli.whatif",
    "planner_cli.router",
    "planner_cli.stack",
    "planner_cli.executor",
    "planner_cli.importer",
    "planner_cli.watch",
)

DEBUG_HELP = "on an error, show the full traceback instead of one line"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sla-planner",
        description="SLA-driven autoscaling for disaggregated LLM inference fleets",
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in SUBCOMMANDS:
        module = importlib.import_module(name)
        before = set(subparsers.choices)
        module.add_parser(subparsers)
        for command in set(subparsers.choices) - before:
            subparsers.choices[command].set_defaults(_module=module)
            # Also after the command (`sla-planner plan --debug`); SUPPRESS keeps a global --debug.
            subparsers.choices[command].add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                                     help=DEBUG_HELP)
    return parser


def exit_code(exc: BaseException) -> int:
    """2 for input the user can fix (a file, a field, an option), 1 for a failure at run time."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return 1
    return 2 if isinstance(exc, (ValueError, OSError, EOFError)) else 1


def one_line(exc: BaseException) -> str:
    """The exception's message on one line; its type where the message alone says too little."""
    text = " ".join(str(exc).split())
    if not text or not isinstance(exc, (ValueError, OSError, RuntimeError)) or type(exc) is RuntimeError:
        return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        print(f"sla-planner {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        print(f"sla-planner {args.command}: {one_line(exc)} (--debug: traceback)", file=sys.stderr)
        return exit_code(exc)


if __name__ == "__main__":
    sys.exit(main())
