"""Default LoRA targets of the family (``slmlab finetune --lora``; :mod:`slmlab.train.lora`).

PGSM: every block's state mixer and feed-forward (state_mix, state_gate, ff_in, ff_out) and the
retriever's projections (q, k, v, out, gate). Convolution kernels and the tied embedding stay frozen.
"""

LORA_TARGETS = ("state_mix", "state_gate", "ff_in", "ff_out", "q", "k", "v", "out", "gate")
