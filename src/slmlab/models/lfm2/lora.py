"""Default LoRA targets of the family (``slmlab finetune --lora``; :mod:`slmlab.train.lora`).

LFM2: attention (q, k, v, out_proj), the gated short convolutions' in/out projections (in_proj,
out_proj) and the SwiGLU (w1, w3, w2). The convolution kernels, norms and tied embedding stay frozen.
"""

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "out_proj", "in_proj", "w1", "w2", "w3")
