"""`sla-planner executor`: carry out the planner's virtual-connector decisions on local workers.

    sla-planner executor --config configs/executor.yaml

For fleets without Kubernetes. Runs the fleet executor (executor.run) in
Dynamo's own environment, where Dynamo's VirtualConnectorClient lives:
`--dynamo-python`, else `$SLA_DYNAMO_PYTHON`, else `.venv-dynamo` (installed
by scripts/install_dynamo.sh on first use). Its workers keep running when the
executor stops (a restarted executor adopts them); `--stop-workers` drains them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from planner_cli.command import command_parser

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def add_parser(subparsers) -> None:
    p = command_parser(subparsers, "executor", doc=__doc__,
                       help="start and drain local Dynamo workers as the planner decides (virtual connector)")
    p.add_argument("--config", required=True, help="executor YAML (executor.config.ExecutorConfig)")
    p.add_argument("--dynamo-python", default=os.environ.get("SLA_DYNAMO_PYTHON"),
                   help="python of an environment with ai-dynamo-runtime 1.6.1 (default: .venv-dynamo, installed "
                        "on first use)")
    p.add_argument("--stop-workers", action="store_true", help="drain every worker the executor runs, then exit")


def run(args: argparse.Namespace) -> int:
    from executor.config import load_executor_config

    try:
        load_executor_config(args.config)  # a bad file fails here, in one line, before Dynamo starts
    except ValueError as exc:
        print(f"sla-planner executor: {exc}", file=sys.stderr)
        return 2
    python = args.dynamo_python
    if python is None:
        from planner_cli.stack_dynamo import dynamo_python

        try:
            python = dynamo_python()
        except RuntimeError as exc:
            print(f"sla-planner executor: {exc}", file=sys.stderr)
            return 1
    if not Path(python).is_file():
        print(f"sla-planner executor: --dynamo-python {python}: no such file", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT),
                                                                      os.environ.get("PYTHONPATH")]))}
    argv = [python, "-m", "executor", "--config", args.config] + (["--stop-workers"] if args.stop_workers else [])
    try:
        return subprocess.run(argv, env=env).returncode
    except KeyboardInterrupt:
        return 130
