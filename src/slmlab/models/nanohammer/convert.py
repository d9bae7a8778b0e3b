"""How NanoHammer leaves slmlab (:data:`EXPORT`): transformers and llama.cpp implement no NanoHammer
(holographic state tokens beside Llama attention), so ``--to hf`` writes remote code (the model's
own source beside the weights) and there is no ``--to gguf``."""

from __future__ import annotations

from ..export_info import ExportInfo

EXPORT = ExportInfo(
    display_name="NanoHammer",
    hf_reason="transformers has no Llama attention with rotated cumulative-sum state tokens (NanoHammer)",
)
