"""Model FLOPs of a training step, counted from the operations a forward runs, and MFU.

``forward_flops(model, batch)`` runs one forward under ``torch.utils.flop_counter`` and returns what it
counted: every matmul (``mm``/``addmm``/``bmm``), convolution (depthwise included) and
scaled-dot-product attention. So each family is counted from its own layers (attention, gated
convolutions, retrieval, state tokens), with no formula per family to keep in step with the code.
A training step is ``3 x`` that (:func:`model_flops_per_step`): the backward of a matmul or a
convolution is two of them (the input's gradient and the weight's). Attention counts the whole
``T x T`` score matrix (no causal discount). This is the usual model-FLOPs convention (PaLM, Chowdhery
et al., arXiv:2204.02311, Appendix B: ``6N + 12·L·H·Q·T`` per token for a transformer): work a kernel
does again (flash attention recomputes its scores in backward, checkpointing a whole forward) is not
credited, and element-wise work (norms, activations, the loss, cumulative sums) and FFTs are not counted.

``mfu = model FLOPs per step / seconds per step / peak FLOP/s``, the peak a bf16 matmul measured in
the same run (:func:`matmul_peak_flops`): the anchor is this machine's own measured limit, not a
datasheet.
"""

from __future__ import annotations

import time

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop, sdpa_flop

aten = torch.ops.aten


def _as_registered(formula):
    """A formula of torch's registry (already taking tensors) as a ``custom_mapping`` entry."""
    def count(*args, **kwargs):
        return formula(*args, **kwargs)

    count._get_raw = True  # the counter must not wrap it a second time
    return count


# CPU attention runs its own kernel, which torch's counter does not know; it computes what CUDA's
# flash / efficient kernels compute, so it is counted by the same formulas.
CPU_ATTENTION = {
    aten._scaled_dot_product_flash_attention_for_cpu: _as_registered(sdpa_flop),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _as_registered(sdpa_backward_flop),
}


def forward_flops(model: torch.nn.Module, batch: dict) -> int:
    """FLOPs of one forward of ``model`` on ``batch`` (``input_ids``, ``labels``, family inputs; no gradient)."""
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        model(**batch, use_cache=False)
    return counter.get_total_flops()


def model_flops_per_step(model: torch.nn.Module, batch: dict) -> int:
    """Model FLOPs of one training step (forward + backward) on ``batch``: ``3 x`` :func:`forward_flops`."""
    return 3 * forward_flops(model, batch)


def mfu(flops_per_step: float, seconds_per_step: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the peak FLOP/s."""
    return flops_per_step / seconds_per_step / peak_flops


def matmul_peak_flops(device: torch.device | str, dtype: torch.dtype = torch.bfloat16, n: int = 8192,
                      repeats: int = 20, trials: int = 3) -> float:
    """The best FLOP/s of an ``n x n`` matmul in ``dtype`` on ``device`` over ``trials`` timings of
    ``repeats`` products (CUDA is synchronised around each timing)."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    a @ b
    sync()
    best = float("inf")
    for _ in range(trials):
        t0 = time.perf_counter()
        for _ in range(repeats):
            a @ b
        sync()
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 * repeats / best


def linear_flops_per_token(model: torch.nn.Module) -> int:
    """``2 · in · out`` summed over every ``nn.Linear`` of ``model`` (the LM head included): one
    token's forward matmul FLOPs, what ``6N`` approximates (with ``N`` the linear weights)."""
    return sum(2 * m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
