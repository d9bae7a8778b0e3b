#!/usr/bin/env bash
# The check against tomorrow: build a separate venv (.venv-newest) with the NEWEST versions pyproject.toml's
# ranges allow (no lock), run the dependency-facing part of the suite in it, and print which packages differ
# from requirements.lock. Green: refresh the lock from it in the same commit
#   bash scripts/lock.sh .venv-newest
# Red: fix slmlab, or narrow the range in pyproject.toml with a comment naming the breaking release.
# torch stays at the lock's 2.13.0 (from PyPI a newer torch is the multi-GB CUDA build); NEWEST_TORCH=1 lets it
# rise too, where a CPU wheel of the newest torch is at hand (this project's machines have 2.14.1).
# Usage: bash scripts/test-newest.sh [pytest arguments]   (default: the subset below, without slow tests)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-newest
# what a new release of transformers, peft, trl, lm-eval, tokenizers, safetensors, gguf, onnx, fastapi breaks
SUBSET=(tests/models tests/layers tests/generation tests/export tests/evaluate tests/serve tests/commands -m "not slow")
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
"$VENV/bin/python" -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
KEEP=()
if [ "${NEWEST_TORCH:-0}" != 1 ]; then
  grep -E '^torch==' requirements.lock > "$VENV/keep-torch.txt"
  KEEP=(-c "$VENV/keep-torch.txt")
fi
"$VENV/bin/python" -m pip install -q --upgrade --upgrade-strategy eager "${KEEP[@]}" \
  -e ".[test,train,transactions,export,onnx,eval,serve,finetune,demo]" 2>&1 | grep -v "^WARNING: Location" || true
echo "== packages that differ from requirements.lock =="
"$VENV/bin/python" scripts/check_lock.py requirements.lock --report
echo "== tests, newest versions: ${*:-${SUBSET[*]}} =="
status=0
if [ $# -gt 0 ]; then "$VENV/bin/python" -m pytest "$@" || status=$?; else "$VENV/bin/python" -m pytest "${SUBSET[@]}" || status=$?; fi
# the editable install of the newest venv re-pointed nothing of .venv (each venv has its own .pth)
if [ $status -eq 0 ]; then
  echo "test-newest: green; refresh the lock with: bash scripts/lock.sh $VENV"
else
  echo "test-newest: red (pytest exit $status); fix it or narrow the range in pyproject.toml naming the release"
fi
exit $status
