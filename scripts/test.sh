#!/usr/bin/env bash
# The test command: installs what it needs, lints (ruff), then runs the whole suite.
# With no arguments it runs in two phases: the tests not marked slow on two xdist workers (one file per worker
# at a time: each worker its own Prefect harness, Prometheus and etcd), then the slow ones (the end-to-end stacks,
# which must not share this 2-core machine with anything else) one at a time. Arguments: one plain pytest run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false
# Lint first (pyproject's [tool.ruff]: pyflakes only): any finding fails the run before a test starts.
.venv/bin/ruff check --quiet .
pytest=(.venv/bin/python -m pytest -q --timeout 900 --durations=15)
run() {  # pytest's exit code, "no tests collected" (5) as a failure
  local rc=0
  "${pytest[@]}" "$@" || rc=$?
  if [ "$rc" = "5" ]; then echo "pytest collected no tests: $*"; return 1; fi
  return "$rc"
}
if [ "$#" -gt 0 ]; then
  run "$@"
  exit $?
fi
rc=0
run -n "${SLA_TEST_WORKERS:-2}" --dist loadfile -m "not slow" || rc=$?
run -m slow || rc=$?
exit "$rc"
