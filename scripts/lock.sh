#!/usr/bin/env bash
# Write requirements.lock: the exact version of every package in .venv (slmlab itself left out), taken
# with `pip freeze` from an environment whose suite is green. scripts/setup.sh installs with it as a
# constraints file, so a fresh clone gets exactly these versions whatever is released tomorrow.
# Refresh it after `bash scripts/test-newest.sh` passes (docs/contributing.md, "Updating a dependency").
# Usage: bash scripts/lock.sh [VENV]   (default .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
{
  echo "# Exact versions scripts/setup.sh installs (a pip constraints file); made by scripts/lock.sh from"
  echo "# '$VENV' with $("$VENV/bin/python" --version 2>&1) on $(date -u +%Y-%m-%d). Local version labels"
  echo "# (torch's +cpu) are dropped: ==2.13.0 accepts the CPU build. Do not edit by hand."
  "$VENV/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
    | grep -v -i -E '^(slmlab|-e |#)' | sed -E 's/\+[A-Za-z0-9.]+$//' | LC_ALL=C sort -f
} > requirements.lock.tmp
mv requirements.lock.tmp requirements.lock
echo "wrote requirements.lock ($(grep -c -v '^#' requirements.lock) packages)"
