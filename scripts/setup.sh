#!/usr/bin/env bash
# Create .venv (if missing) and install hubgrpo with its test extras. torch is installed FIRST and pinned to the
# CPU build that this kind of machine keeps on disk: an unpinned torch would pull a multi-GB CUDA build.
# On a GPU machine, install the torch build you want first (or set HUBGRPO_TORCH="torch"), then run this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${HUBGRPO_TORCH:-torch==2.13.0}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "is ignored" || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC" >&2
  .venv/bin/python -m pip install -q "$TORCH_SPEC" 2>&1 | grep -v "is ignored" || true
fi
.venv/bin/python -m pip install -q -e ".[test]" 2>&1 | grep -v -e "is ignored" -e "^ *$" || true
.venv/bin/python -c "import hubgrpo, torch, trl, peft; print('setup: hubgrpo', hubgrpo.__version__, 'torch', torch.__version__, 'trl', trl.__version__, 'peft', peft.__version__)"
