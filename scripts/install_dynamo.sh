#!/usr/bin/env bash
# Installs NVIDIA Dynamo 1.6.1 (ai-dynamo + ai-dynamo-runtime, CPU wheels from the package registry)
# into its own environment, .venv-dynamo, separate from the planner's .venv:
#   - every package pinned in stack/dynamo/requirements.lock, installed with --no-deps
#     (a plain `pip install ai-dynamo` fails: its aisimulate dependency is NVIDIA-index only);
#   - the import-only aisimulate stand-in (stack/dynamo/standin) copied into its site-packages.
# Idempotent: a second run with an unchanged lock and stand-in checks a stamp and returns at once.
# Prints the environment's python on the last line. SLA_DYNAMO_VENV overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SLA_DYNAMO_VENV:-$PWD/.venv-dynamo}"
LOCK=stack/dynamo/requirements.lock
STANDIN=stack/dynamo/standin/aisimulate_core
stamp="$( (cat "$LOCK"; cat "$STANDIN"/*.py) | sha256sum | cut -c1-16)"
if [ -f "$VENV/.sla-planner-stamp" ] && [ "$(cat "$VENV/.sla-planner-stamp")" = "$stamp" ] \
   && "$VENV/bin/python" -c "import dynamo._core" >/dev/null 2>&1; then
  echo "install_dynamo: $VENV is up to date" >&2
  echo "$VENV/bin/python"
  exit 0
fi
command -v uv >/dev/null 2>&1 || python3 -m pip install -q uv
export UV_COMPILE_BYTECODE=1
echo "install_dynamo: installing Dynamo 1.6.1 into $VENV" >&2
rm -f "$VENV/.sla-planner-stamp"
[ -x "$VENV/bin/python" ] || uv venv -q "$VENV" --python 3.11
uv pip install -q --python "$VENV/bin/python" --no-deps -r "$LOCK"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/aisimulate_core"
cp -r "$STANDIN" "$site/aisimulate_core"
"$VENV/bin/python" - <<'PY'
from dynamo._core import DistributedRuntime, VirtualConnectorClient, VirtualConnectorCoordinator  # noqa: F401
from dynamo.planner.connectors.kubernetes import KubernetesConnector  # noqa: F401
PY
echo "$stamp" > "$VENV/.sla-planner-stamp"
echo "install_dynamo: done" >&2
echo "$VENV/bin/python"
