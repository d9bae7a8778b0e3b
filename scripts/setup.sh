#!/usr/bin/env bash
# Create .venv and install slmlab with the extras the tests use (train, transactions, export, onnx, eval, serve, finetune,
# demo), every package at the exact version of requirements.lock (a pip constraints file made by scripts/lock.sh from
# a green run), so a fresh clone gets what the suite was green with. torch==2.13.0 first: it is the CPU build (an
# unpinned torch would pull a multi-GB CUDA build). scripts/check_lock.py then fails the set-up on any difference.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOCK=requirements.lock
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c "$LOCK" "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -c "$LOCK" -e ".[test,train,transactions,export,onnx,eval,serve,finetune,demo]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python scripts/check_lock.py "$LOCK"
.venv/bin/python -c "import slmlab, torch, transformers; print('slmlab', slmlab.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
