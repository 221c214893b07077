#!/usr/bin/env bash
# The GPU check (bench/gpu_check.py: what it measures, its options): prints one JSON object.
#
#   bench/gpu_check.sh                 # a GPU machine, about 5-6 minutes
#   bench/gpu_check.sh --cpu-smoke     # every part at tiny sizes on the CPU
#   bench/gpu_check.sh --prepare       # .gpu_check/ for a machine without the default model or network
#
# It also runs on a machine that got only this checkout and a Python with PyTorch and
# transformers: spa comes from src/ where it is not installed, and the wheels --prepare saved
# into .gpu_check/wheels are installed into a temporary folder where their packages are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
if ! "$PYTHON" -c "import spa" 2>/dev/null; then
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
if compgen -G ".gpu_check/wheels/*.whl" >/dev/null && ! "$PYTHON" -c "import gymnasium" 2>/dev/null; then
    site="${TMPDIR:-/tmp}/gpu_check-site"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --upgrade --target "$site" .gpu_check/wheels/*.whl
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec "$PYTHON" bench/gpu_check.py "$@"
