#!/usr/bin/env bash
# Installs everything sla-planner needs on a fresh Debian machine (run as root or with sudo):
# Debian's prometheus, prometheus-pushgateway, etcd-server and chromium (headless) for the real-component
# tests, uv, and the locked Python environment in .venv. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

need_apt=()
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v prometheus-pushgateway >/dev/null 2>&1 || need_apt+=(prometheus-pushgateway)
# Headless Chromium: the browser test of the Prefect UI and scripts/screenshot_ui.py.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Debian starts these as services on install; the tests start their own on free ports.
for svc in prometheus prometheus-pushgateway etcd; do
  if command -v systemctl >/dev/null 2>&1; then $SUDO systemctl stop "$svc" >/dev/null 2>&1 || true; fi
done

if ! command -v uv >/dev/null 2>&1; then
  echo "setup: installing uv"
  python3 -m pip install -q uv
fi

export UV_COMPILE_BYTECODE=1   # otherwise every import recompiles when PYTHONDONTWRITEBYTECODE=1
uv sync --frozen --extra dev --python 3.11
# Dynamo 1.6.1 in its own environment (.venv-dynamo): the tests run its connectors, client, frontend and mocker.
bash scripts/install_dynamo.sh >/dev/null
# vLLM 0.32.0's CPU build in its own environment (.venv-vllm): tests/e2e/test_e2e_vllm.py and `stack up --fleet vllm`
# start real engines from it.
bash scripts/install_vllm.sh >/dev/null
echo "setup: done (.venv ready)"
