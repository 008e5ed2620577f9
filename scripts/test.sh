#!/usr/bin/env bash
# The test command: installs what it needs, lints (ruff), then runs the whole suite (arguments go to pytest).
# SLA_TEST_WORKERS=N (N > 1, for machines with more cores) runs it in two phases: the tests not marked slow on N
# xdist workers (one file per worker at a time; each worker its own PREFECT_HOME, Prefect harness, Prometheus and
# etcd), then the slow ones (the end-to-end stacks, which must not share the machine) one at a time. On this 2-core
# machine one process is faster: the tests not marked slow took 13 min 24 s on two workers, about 10 min in one.
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
workers="${SLA_TEST_WORKERS:-1}"
if [ "$workers" -le 1 ]; then
  run "$@"
  exit $?
fi
rc=0
run -n "$workers" --dist loadfile -m "not slow" "$@" || rc=$?
run -m slow "$@" || rc=$?
exit "$rc"
