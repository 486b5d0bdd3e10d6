#!/usr/bin/env bash
# Creates .venv and installs EvoTrainer into it. torch goes first and pinned: installed after
# anything that depends on it, pip would pull a multi-GB CUDA build instead of the CPU one.
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh dev
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${EVOTRAINER_TORCH:-torch==2.13.0}
extras=${1:-}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
log=.venv/setup.log
# pip's output goes to a log that is shown only when a step fails.
pip_install() {
  if ! .venv/bin/python -m pip install -q "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: 'pip install $*' failed (full log above)" >&2
    exit 1
  fi
}
# The code sandbox isolates best with bubblewrap (the job sees only the Python install and its own
# directory). Installed where apt-get is usable; elsewhere the sandbox falls back to namespaces and
# rlimits and says so once at run time.
if ! command -v bwrap >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing bubblewrap (the code sandbox)"
    { apt-get install -y -q bubblewrap || { apt-get update -q && apt-get install -y -q bubblewrap; }; } >"$log" 2>&1 \
      || echo "setup: could not install bubblewrap (log: $log); the code sandbox will use weaker isolation" >&2
  else
    echo "setup: bubblewrap (bwrap) is not installed and apt-get is not usable here; install it for full isolation" \
         "of model-written code (without it the sandbox uses namespaces and rlimits, with a warning)" >&2
  fi
fi
echo "setup: installing $TORCH, then evotrainer${extras:+[$extras]} into .venv"
pip_install --upgrade pip
pip_install "$TORCH"
pip_install -e ".${extras:+[$extras]}"
.venv/bin/python -W ignore -c "import torch, evotrainer" || { echo "setup: evotrainer does not import" >&2; exit 1; }
