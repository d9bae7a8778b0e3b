import os
import sys

import pytest
import torch

# tests/ mirrors src/slmlab in folders; shared helpers (family_tester, import_graph, ...) and test
# modules that others reuse import by name from any folder. Module basenames are unique across the
# folders (pytest's default import mode requires it; test_architecture.py checks it).
_HERE = os.path.dirname(os.path.abspath(__file__))
for _folder in sorted({os.path.dirname(os.path.join(root, f)) for root, _, files in os.walk(_HERE) for f in files
                       if f.endswith(".py") and "__pycache__" not in root}, reverse=True):
    if _folder not in sys.path:
        sys.path.insert(0, _folder)
# One thread: tiny test tensors gain nothing from more, and on a small shared machine OpenMP threads
# that wait on each other stall (a 2-thread op measured 25 ms vs 3 us with one thread under load).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


# The tiny synthetic bank of the transactions tests (module-scoped: each module generates its own).
@pytest.fixture(scope="module")
def bank_data():
    pytest.importorskip("pandas")
    pytest.importorskip("sklearn")
    from slmlab.transactions.data.synth import SynthConfig, generate
    from test_transactions_pipeline import SMALL

    return generate(SynthConfig.from_preset("tiny", **SMALL))


@pytest.fixture(scope="module")
def bank(bank_data):
    from slmlab.transactions.data import prepare_bank
    from slmlab.transactions.model import preset_schema

    return prepare_bank(bank_data.transactions, preset_schema("lfm2_tiny"), bank_data.customers)
