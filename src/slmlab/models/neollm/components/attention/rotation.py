"""Rotations of the first ``r_d`` channels of every head: the shared maths of integer partial RoPE
(docs/neollm-attention.md#positions), REPO (docs/neollm-attention.md#positions) and REPO-GRAPE (docs/neollm-attention.md#positions).

Rotate-half convention (HF): channel pair ``(i, i + r_d/2)`` of the rotated part turns by the angle
``φ_i``; channels ``[r_d:]`` pass through. The angle is ``pos · θ_i`` for integer RoPE and ``z · θ_i``
(a learned real coordinate, per KV head) for REPO / GRAPE. Frequencies ``θ_i = rope_theta^(-2i/r_d)``,
or transformers' ``ROPE_INIT_FUNCTIONS`` when ``rope_parameters`` (``rope_scaling``) names a scaled
``rope_type`` (with its attention scaling).
"""

from __future__ import annotations

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from .....layers.rotary import rotate_half


def rope_frequencies(config) -> tuple[tuple[float, ...], float]:
    """``(θ_0..θ_{r_d/2-1}, attention_scaling)`` for ``config`` as plain Python floats.

    Computed once at construction on the CPU (never as a buffer: ``from_pretrained`` builds modules
    on the meta device). ``rope_type="dynamic"`` changes the frequencies with the sequence length,
    which breaks decode == prefill, so it is refused.

    Raises:
        ValueError: for ``rope_type="dynamic"`` or an unknown rope type.
    """
    rot = int(config.head_dim * config.partial_rotary_factor)
    params = config.rope_parameters or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":  # a rope_parameters dict set after construction may carry its own theta
        base = float(params.get("rope_theta", config.rope_theta))
        return tuple(1.0 / base ** (i / rot) for i in range(0, rot, 2)), 1.0
    if rope_type == "dynamic" or rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"rope_scaling rope_type={rope_type!r} is not supported by NeoLLM attention (dynamic NTK rescales with the "
            f"sequence length and breaks decode == prefill); use one of {sorted(set(ROPE_INIT_FUNCTIONS) - {'dynamic'})}"
        )
    with torch.device("cpu"):
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")
    if inv_freq.numel() != rot // 2:
        raise ValueError(f"rope_scaling {params} gives {inv_freq.numel()} frequencies, expected {rot // 2}")
    return tuple(inv_freq.double().tolist()), float(scaling)


class FrequencyTable:
    """The frequencies as a tensor, materialised lazily per device (a plain attribute, not a buffer)."""

    def __init__(self, freqs: tuple[float, ...]) -> None:
        self.freqs = freqs
        self._cached: torch.Tensor | None = None

    def get(self, device: torch.device) -> torch.Tensor:
        if torch.compiler.is_compiling():  # a traced tensor must not outlive the trace: build, never cache
            return torch.tensor(self.freqs, dtype=torch.float32, device=device)
        if self._cached is None or self._cached.device != device:
            with torch.inference_mode(False):  # built under inference_mode, it could never join a backward later
                self._cached = torch.tensor(self.freqs, dtype=torch.float32, device=device)
        return self._cached


def cos_sin(angles: torch.Tensor, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``angles [..., r_d/2]`` (fp32) -> ``cos, sin [..., r_d]`` in the rotate-half layout, times
    the rope attention scaling."""
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def rotate_channels(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of ``x``.

    Args:
        x: ``[B, T, heads, P, D]``.
        cos, sin: fp32, broadcastable to ``[B, T, heads, P, r_d]``.
    Returns:
        ``[B, T, heads, P, D]`` in ``x.dtype``.
    """
    rot = cos.shape[-1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    head, tail = x[..., :rot], x[..., rot:]
    return torch.cat((head * cos + rotate_half(head) * sin, tail), dim=-1)
