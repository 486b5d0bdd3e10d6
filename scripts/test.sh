#!/usr/bin/env bash
# The test suite: set up with the dev extras, then ruff and pytest. pytest's exit 5 (no tests collected)
# is a failure here, as is any other non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
# Lint and format first (ruff, configured in pyproject.toml): seconds, and a failure is cheaper to read here.
.venv/bin/ruff check evotrainer tests benchmarks
.venv/bin/ruff format --check evotrainer tests benchmarks
exec .venv/bin/python -m pytest "$@"
