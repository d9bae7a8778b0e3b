"""What the transactions configs saved before they were typed (issue 44; written at commit 5f48a81 by
each config class's own ``__init__``): per case (``<kind>/default``: the class's defaults;
``<kind>/tiny``: ``from_preset("lfm2_tiny")``; ``<kind>/non_default``: that preset with ``kwargs``),
the ``config.json`` that ``save_pretrained`` wrote, less its ``schema`` (one of ``SCHEMAS``, named by
the case's ``schema``), the attributes of the config loaded back that the JSON does not show, and the
names of all its attributes; each config class's signature (name, default); and a digest of the
output of a model built from the saved config with ``torch.manual_seed(0)`` (``OUTPUTS``: the
encoder's last hidden state, the fraud and sequence logits, the customer embeddings, the forecast
logits of every target joined) on ids drawn with ``torch.Generator().manual_seed(0)``.

Read by tests/transactions/test_transactions_saved_configs.py. Literal data: regenerate it only from
code that writes the same files (a change here is a change of the saved format).

The data is saved_txn_configs.json beside this module (data, not code: written once, read by the tests).
"""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads(Path(__file__).with_suffix(".json").read_text())
SIGNATURES, SCHEMAS, CASES, OUTPUTS = (_DATA["SIGNATURES"], _DATA["SCHEMAS"], _DATA["CASES"], _DATA["OUTPUTS"])
