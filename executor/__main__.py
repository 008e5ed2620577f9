"""`python -m executor --config FILE` (in the Dynamo environment, the project on PYTHONPATH)."""

from __future__ import annotations

import argparse
import sys

from executor.config import load_executor_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m executor", description=__doc__)
    parser.add_argument("--config", required=True, help="executor YAML (executor.config.ExecutorConfig)")
    parser.add_argument("--stop-workers", action="store_true",
                        help="drain every worker in the table and exit (teardown)")
    args = parser.parse_args(argv)
    try:
        cfg = load_executor_config(args.config)
    except ValueError as exc:
        print(f"executor: {exc}", file=sys.stderr)
        return 2
    if args.stop_workers:
        from executor.workers import WorkerTable

        table = WorkerTable(cfg)
        table.adopt()
        table.stop_all()
        return 0
    from executor.run import main as run_main

    try:
        run_main(cfg)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
