# Sourced by scripts/install_*.sh: one separate environment per external project, rebuilt only when its stamp
# (a hash of what it installs) changes. Each installer prints the environment's python on its last line.

# venv_up_to_date NAME VENV STAMP IMPORT: print VENV's python and return 0 when its stamp matches and IMPORT
# (a Python module) imports there; return 1 otherwise.
venv_up_to_date() {
  local name="$1" venv="$2" stamp="$3" module="$4"
  if [ -f "$venv/.sla-planner-stamp" ] && [ "$(cat "$venv/.sla-planner-stamp")" = "$stamp" ] \
     && "$venv/bin/python" -c "import $module" >/dev/null 2>&1; then
    echo "$name: $venv is up to date" >&2
    echo "$venv/bin/python"
    return 0
  fi
  return 1
}

# venv_begin NAME VENV WHAT: uv (installed if missing), the stamp removed until the install completes, the venv.
venv_begin() {
  local name="$1" venv="$2" what="$3"
  command -v uv >/dev/null 2>&1 || python3 -m pip install -q uv
  export UV_COMPILE_BYTECODE=1
  echo "$name: installing $what into $venv" >&2
  rm -f "$venv/.sla-planner-stamp"
  [ -x "$venv/bin/python" ] || uv venv -q "$venv" --python 3.11
}

# venv_done NAME VENV STAMP: the stamp written (the install checked), the python printed.
venv_done() {
  local name="$1" venv="$2" stamp="$3"
  echo "$stamp" > "$venv/.sla-planner-stamp"
  echo "$name: done" >&2
  echo "$venv/bin/python"
}
