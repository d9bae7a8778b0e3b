#!/usr/bin/env bash
# Create .venv and install slmlab with the extras the tests use (train, transactions, export, onnx, eval, serve, finetune, demo). torch==2.13.0 first: it is the CPU
# build (an unpinned torch would pull a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q "torch==2.13.0" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -e ".[test,train,transactions,export,onnx,eval,serve,finetune,demo]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import slmlab, torch, transformers; print('slmlab', slmlab.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)"
