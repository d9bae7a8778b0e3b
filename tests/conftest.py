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


# Every cache location slmlab reads (grep CACHE in src/slmlab): data, token caches and tokenizers
# ($SLMLAB_CACHE, slmlab.data.paths), the `slmlab models` table ($SLMLAB_CACHE_DIR, else $XDG_CACHE_HOME,
# slmlab.bench.family_table). XDG_CACHE_HOME also moves other libraries' default caches off the home folder.


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """One cache folder per test session, under pytest's temporary folder: the suite never writes into
    the user's ~/.cache/slmlab. Set in os.environ, so every subprocess a test starts inherits it
    (tests/commands/test_cli_cache_isolation.py checks both)."""
    root = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        for name, folder in (("SLMLAB_CACHE", root / "slmlab"), ("SLMLAB_CACHE_DIR", root / "slmlab"),
                             ("XDG_CACHE_HOME", root)):
            patch.setenv(name, str(folder))
        yield root


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
