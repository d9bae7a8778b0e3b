#!/usr/bin/env bash
# The README's test command: set up, then run the whole test suite (quick loop: add -m 'not slow').
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
