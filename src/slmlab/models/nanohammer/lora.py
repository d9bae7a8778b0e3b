"""Default LoRA targets of the family (``slmlab finetune --lora``; :mod:`slmlab.train.lora`).

NanoHammer: attention and SwiGLU projections (Llama names) and the state path's projections
(token_to_state, state_to_hidden); the state cell's small MLP and the tied embedding stay frozen.
"""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "token_to_state",
                "state_to_hidden")
