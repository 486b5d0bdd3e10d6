#!/usr/bin/env bash
# The main job: set up, then the co-evolution loop on reasoning-gym arithmetic with the tiny default policy.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/evotrainer run examples/math.yaml "$@"
