#!/usr/bin/env bash
# The test command: installs what it needs, lints (ruff), then runs the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
# Lint first (pyproject's [tool.ruff]: pyflakes only): any finding fails the run before a test starts.
.venv/bin/ruff check --quiet .
set +e
.venv/bin/python -m pytest -q --timeout 900 --durations=15 "$@"
rc=$?
set -e
if [ "$rc" = "5" ]; then echo "pytest collected no tests"; exit 1; fi
exit "$rc"
