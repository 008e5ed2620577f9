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
source scripts/venv_stamp.sh
VENV="${SLA_DYNAMO_VENV:-$PWD/.venv-dynamo}"
LOCK=stack/dynamo/requirements.lock
STANDIN=stack/dynamo/standin/aisimulate_core
stamp="$( (cat "$LOCK"; cat "$STANDIN"/*.py) | sha256sum | cut -c1-16)"
venv_up_to_date install_dynamo "$VENV" "$stamp" dynamo._core && exit 0
venv_begin install_dynamo "$VENV" "Dynamo 1.6.1"
uv pip install -q --python "$VENV/bin/python" --no-deps -r "$LOCK"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
rm -rf "$site/aisimulate_core"
cp -r "$STANDIN" "$site/aisimulate_core"
"$VENV/bin/python" - <<'PY'
from dynamo._core import DistributedRuntime, VirtualConnectorClient, VirtualConnectorCoordinator  # noqa: F401
from dynamo.planner.connectors.kubernetes import KubernetesConnector  # noqa: F401
PY
venv_done install_dynamo "$VENV" "$stamp"
