#!/usr/bin/env bash
# The README's main job: install slmlab, train the default model (a SAGE-Lumen-size decoder with a
# 2048-token BPE on the Shakespeare corpus for 1,500 steps, ~10 minutes on 2 idle CPU cores) with a
# progress bar, then print the run report: validation bits per byte and a sample. Extra arguments
# are config overrides (key=value). Running it again continues runs/quickstart, or re-reports it
# when finished.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/slmlab train configs/quickstart.yaml --resume "$@"
