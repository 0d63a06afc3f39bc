#!/usr/bin/env bash
# Set up .venv if needed, then run the embedded demo: a whole hubgrpo run on this machine with a local bucket.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m hubgrpo.cli run configs/demo.yaml "$@"
