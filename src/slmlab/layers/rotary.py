"""Rotary position embeddings (Su et al. 2021, arXiv:2104.09864), rotate-half convention.

For a channel pair ``(x_j, x_{j+r/2})`` of the rotated part (``r`` channels) at position ``p``:
``x'_j = x_j cos(p θ_j) - x_{j+r/2} sin(p θ_j)``, ``θ_j = base^(-2j/r)``. With a partial factor only
the first ``r = factor * head_dim`` channels are rotated; the rest pass through unchanged.
"""

from __future__ import annotations

import torch
from torch import nn


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] -> [-x2, x1]`` on the last axis."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` channels of ``x``.

    Args:
        x: ``[B, H, T, D]``.
        cos, sin: ``[B, T, R]`` with ``R <= D`` (broadcast over heads).
    Returns:
        ``[B, H, T, D]`` in ``x.dtype``.
    """
    cos = cos.unsqueeze(1).to(x.dtype)
    sin = sin.unsqueeze(1).to(x.dtype)
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for explicit position ids, cached and grown on demand.

    Args:
        head_dim: per-head channel count ``D``.
        base: the frequency base (``rope_theta``).
        partial_rotary_factor: fraction of ``D`` that is rotated (rounded down to an even number).
        max_position_embeddings: initial table length; the table doubles when a larger position is asked.
    Shapes:
        position_ids ``[B, T]`` (int) -> cos, sin ``[B, T, R]`` in fp32.
    """

    def __init__(
        self,
        head_dim: int,
        base: float = 10000.0,
        partial_rotary_factor: float = 1.0,
        max_position_embeddings: int = 2048,
    ) -> None:
        super().__init__()
        rot = int(head_dim * partial_rotary_factor)
        rot -= rot % 2
        if rot <= 0:
            raise ValueError(f"partial_rotary_factor={partial_rotary_factor} rotates no channel of head_dim={head_dim}")
        self.rotary_dim = rot
        self.base = float(base)
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None
        self._initial_len = max(int(max_position_embeddings), 1)

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """``θ_j = base^(-2j/R)``, ``j < R/2``, in fp32. Computed on use, never stored as a buffer:
        transformers' ``from_pretrained`` builds models on the meta device and would leave a
        non-persistent buffer uninitialised."""
        idx = torch.arange(0, self.rotary_dim, 2, dtype=torch.float32, device=device)
        return 1.0 / (self.base ** (idx / self.rotary_dim))

    def _compute(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[length, R]`` in fp32 for positions ``0 .. length-1``."""
        t = torch.arange(length, device=device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def _build(self, length: int, device: torch.device) -> None:
        self._cos, self._sin = self._compute(length, device)

    def tables(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Return cos/sin tables of at least ``length`` rows on ``device``."""
        if self._cos is None or self._cos.shape[0] < length or self._cos.device != device:
            size = max(self._initial_len, 1 << (max(length, 1) - 1).bit_length())
            self._build(size, device)
        return self._cos, self._sin

    def forward(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():
            # A captured graph (torch.export, ONNX, torch.compile) cannot size a table from the
            # positions' values: it computes a table of the static max_position_embeddings rows (the
            # frame refuses longer sequences) and caches nothing (no traced tensor outlives the trace).
            cos, sin = self._compute(self._initial_len, position_ids.device)
        else:
            cos, sin = self.tables(int(position_ids.max()) + 1 if position_ids.numel() else 1, position_ids.device)
        return cos[position_ids], sin[position_ids]
