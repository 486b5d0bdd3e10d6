#!/usr/bin/env bash
# The test suite: set up with the dev extras, then pytest. pytest's exit 5 (no tests collected)
# is a failure here, as is any other non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dev
exec .venv/bin/python -m pytest "$@"
