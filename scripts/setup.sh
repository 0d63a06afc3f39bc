#!/usr/bin/env bash
# Create .venv (if missing) and install hubgrpo into it; `bash scripts/setup.sh test` adds the test extras.
# torch is installed FIRST and pinned to the CPU build that this kind of machine keeps on disk: an unpinned torch
# would pull a multi-GB CUDA build. On a GPU machine, install the torch build you want first (or set
# HUBGRPO_TORCH="torch"), then run this.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TORCH_SPEC=${HUBGRPO_TORCH:-torch==2.13.0}
EXTRAS=${1:-}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_PROGRESS_BAR=off
quiet_pip() {  # pip's own errors still reach the terminal; its notices and build-tool chatter do not
  local log; log=$(mktemp)
  if ! .venv/bin/python -m pip install -q "$@" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; return 1
  fi
  rm -f "$log"
}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PY" --version 2>&1)" >&2
  "$PY" -m venv .venv
  quiet_pip --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC (once)" >&2
  quiet_pip "$TORCH_SPEC"
fi
target="."
[ -n "$EXTRAS" ] && target=".[$EXTRAS]"
stamp=".venv/.hubgrpo-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $target"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then  # first run, pyproject.toml changed, or other extras
  echo "setup: installing hubgrpo${EXTRAS:+ with the $EXTRAS extras} and its dependencies" >&2
  quiet_pip -e "$target"
  echo "$want" > "$stamp"
fi
.venv/bin/python -c "import hubgrpo, torch, trl, peft; print('setup: hubgrpo', hubgrpo.__version__, 'torch', torch.__version__, 'trl', trl.__version__, 'peft', peft.__version__)" >&2
