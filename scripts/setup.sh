#!/usr/bin/env bash
# Creates .venv and installs EvoTrainer into it. torch goes first and pinned: installed after
# anything that depends on it, pip would pull a multi-GB CUDA build instead of the CPU one.
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh dev
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH=${EVOTRAINER_TORCH:-torch==2.13.0}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q "$TORCH" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch" || { echo "torch did not install; set EVOTRAINER_TORCH to a pip requirement that fits this machine" >&2; exit 1; }
extras=${1:-}
.venv/bin/python -m pip install -q -e ".${extras:+[$extras]}" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import evotrainer" || { echo "evotrainer did not install" >&2; exit 1; }
