"""Default LoRA targets of the family (``slmlab finetune --lora``; :mod:`slmlab.train.lora`).

NeoLLM: attention and MLP projections (FAN's periodic/linear projections where FAN is on, REPO's w_g and
w_c). A projection with learnable multipliers (RowMultipliedLinear, ``use_learnable_multipliers``) is not a
plain linear layer: LoRA's merge would not commute with its multiplier, so it is skipped.
"""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "periodic_proj", "linear_proj",
                "w_g", "w_c")
