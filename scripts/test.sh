#!/usr/bin/env bash
# Set up .venv if needed, check hubgrpo/ (ruff lint and format, mypy; config in pyproject.toml), then run the test
# suite (slow tests are skipped; run them with: scripts/test.sh -m slow).
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test || exit 1
check() {  # a check that fails the run, saying which one and how to fix it
  local what=$1 fix=$2; shift 2
  if ! "$@"; then
    echo "test.sh: $what failed ($*); $fix" >&2
    exit 1
  fi
}
check "lint" "fix what it lists (many with: .venv/bin/ruff check --fix hubgrpo)" .venv/bin/ruff check hubgrpo
check "formatting" "run: .venv/bin/ruff format hubgrpo" .venv/bin/ruff format --check hubgrpo
check "type check" "fix the errors it lists" .venv/bin/mypy hubgrpo
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(-m "not slow")
.venv/bin/python -m pytest -q "${args[@]}"
rc=$?
if [ $rc -eq 5 ]; then
  echo "test.sh: pytest collected no tests — treating that as a failure" >&2
  exit 1
fi
exit $rc
