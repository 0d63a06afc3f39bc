#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite (slow tests are skipped; run them with: scripts/test.sh -m slow).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test || exit 1
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-m "not slow")
.venv/bin/python -m pytest -q "${args[@]}"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests — treating that as a failure" >&2
  exit 1
fi
exit $rc
