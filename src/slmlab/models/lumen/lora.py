"""Default LoRA targets of the family (``slmlab finetune --lora``; :mod:`slmlab.train.lora`).

SAGE-Lumen: every projection of attention (q, k, v, o) and of the SwiGLU (gate, up, down), transformers'
Llama names. The tied embedding / LM head stays frozen.
"""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
