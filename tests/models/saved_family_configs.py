"""What the family configs saved before they were typed (issue 44; written at commit 5f48a81 by each
config class's own ``__init__``): per case, the keywords given to ``Family.make_config`` (a preset's
name when the case is a preset), the ``config.json`` that ``save_pretrained`` wrote, the attributes
of the config loaded back that the JSON does not show (aliases, derived properties; transformers'
own bookkeeping attributes are left out: they equal a bare ``PretrainedConfig``'s) and the names of
all its attributes; each config class's signature (name, default) and the keys it accepted
(:func:`slmlab.models.registry.config_keys` less what transformers passes to any config); and a
digest of the logits of a model built from the saved config with ``torch.manual_seed(0)`` on the ids
``(7 * arange(10) + 3) % vocab_size`` (``OUTPUTS``).

Read by tests/models/test_models_saved_configs.py. Literal data: regenerate it only from code that
writes the same files (a change here is a change of the saved format).

The data is saved_family_configs.json beside this module (data, not code: written once, read by the tests).
"""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads(Path(__file__).with_suffix(".json").read_text())
SIGNATURES, KEYS, CASES, OUTPUTS = (_DATA["SIGNATURES"], _DATA["KEYS"], _DATA["CASES"], _DATA["OUTPUTS"])
