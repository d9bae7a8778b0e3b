"""NanoHammer's state stream: the holographic rotation, the state update cell and the state token.

Maths (seed 003, with its defects fixed). For state channels ``x`` of width ``S``, channel pair
``j = (x_{2j}, x_{2j+1})`` at position ``p`` is rotated by the angle ``p * θ_j``, ``θ_j = base^(-2j/S)``
(a complex multiplication by ``e^{i p θ_j}``, as in RoPE, Su et al. 2021, arXiv:2104.09864). The model
integrates ``C_t = Σ_{i<=t} R(i) W x_i`` (a cumulative sum), so that the exact inverse rotation
``R(-t) C_t = Σ_{i<=t} R(i - t) W x_i`` depends on the offsets ``i - t`` only (translation invariance).
"""

from __future__ import annotations

import torch
from torch import nn

from ...layers.norm import RMSNorm


class HolographicRotation(nn.Module):
    """Per-pair rotation of the state channels by ``p * θ_j`` and its exact inverse.

    ``rotate``: ``(a, b) -> (a cos φ - b sin φ, a sin φ + b cos φ)``, ``φ = p θ_j``, on the interleaved
    pairs ``(x_{2j}, x_{2j+1})``; ``unrotate`` applies ``-φ``. Norm-preserving and
    ``rotate(rotate(x, p), q) == rotate(x, p + q)``. No buffers: frequencies are computed on use.

    Args:
        dim: state width ``S`` (even).
        base: frequency base (10000 in the seed).
    Shapes:
        x ``[B, T, S]``, position_ids ``[B, T]`` -> ``[B, T, S]`` in ``x.dtype``.
    """

    def __init__(self, dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"state width {dim} must be even for the holographic rotation")
        self.dim = dim
        self.base = float(base)

    def inv_freq(self, device: torch.device | None = None) -> torch.Tensor:
        """``θ_j = base^(-2j/S)`` for ``j < S/2``, fp32."""
        idx = torch.arange(0, self.dim, 2, dtype=torch.float32, device=device)
        return 1.0 / (self.base ** (idx / self.dim))

    def _angles(self, position_ids: torch.Tensor) -> torch.Tensor:
        return position_ids.to(torch.float32)[..., None] * self.inv_freq(position_ids.device)

    def _turn(self, x: torch.Tensor, position_ids: torch.Tensor, sign: float) -> torch.Tensor:
        ang = self._angles(position_ids)
        cos, sin = ang.cos().to(x.dtype), (sign * ang.sin()).to(x.dtype)
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)

    def rotate(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self._turn(x, position_ids, 1.0)

    def unrotate(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self._turn(x, position_ids, -1.0)


class SeedHolographicMap(HolographicRotation):
    """The seed's ``HolographicRotaryEmbedding`` maths, kept for checkpoints trained with it.

    Pair ``j`` turns its first member by the frequency ``θ_{2j mod S/2}`` and its second by
    ``θ_{(2j+1) mod S/2}`` (the seed indexes a duplicated frequency vector with stride 2):
    ``(a, b) -> (a cos φ_a - b sin φ_a, a sin φ_b + b cos φ_b)``. This is not a rotation (norms change)
    and the seed's "inverse" is the very same map, so ``unrotate == rotate`` here.
    """

    def _seed_map(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        half = self.dim // 2
        pair = torch.arange(half, device=position_ids.device)
        freq = self.inv_freq(position_ids.device)
        pos = position_ids.to(torch.float32)[..., None]
        ang_a, ang_b = pos * freq[(2 * pair) % half], pos * freq[(2 * pair + 1) % half]
        a, b = x[..., 0::2], x[..., 1::2]
        first = a * ang_a.cos().to(x.dtype) - b * ang_a.sin().to(x.dtype)
        second = a * ang_b.sin().to(x.dtype) + b * ang_b.cos().to(x.dtype)
        return torch.stack((first, second), dim=-1).flatten(-2)

    def rotate(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self._seed_map(x, position_ids)

    def unrotate(self, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        return self._seed_map(x, position_ids)


ROTATIONS = {"rotation": HolographicRotation, "seed": SeedHolographicMap}


class StateUpdateCell(nn.Module):
    """Multi-head Euler step on the state: ``s' = RMSNorm_post(s + α_h ⊙ MLP(RMSNorm_pre(s)))``.

    ``MLP = Linear(S, 4S) -> SiLU -> Linear(4S, S)`` (no biases), ``α_h`` a learnable step per head
    (``S / num_heads`` channels each), initialised to 0.1. Pointwise in time; maps 0 to 0.
    Parameter names follow the seed (``pre_norm``, ``mlp.0``, ``mlp.2``, ``post_norm``, ``step_size``).

    Args:
        state_size: ``S``.
        num_heads: number of step sizes (``S % num_heads == 0``).
        eps: RMSNorm epsilon.
    Shapes:
        state ``[B, T, S]`` -> ``[B, T, S]``.
    """

    def __init__(self, state_size: int, num_heads: int, eps: float) -> None:
        super().__init__()
        if state_size % num_heads:
            raise ValueError(f"state_hidden_size ({state_size}) must be divisible by num_state_heads ({num_heads})")
        self.num_heads = num_heads
        self.pre_norm = RMSNorm(state_size, eps)
        self.mlp = nn.Sequential(
            nn.Linear(state_size, 4 * state_size, bias=False), nn.SiLU(), nn.Linear(4 * state_size, state_size, bias=False)
        )
        self.post_norm = RMSNorm(state_size, eps)
        self.step_size = nn.Parameter(torch.full((num_heads,), 0.1))

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        delta = self.mlp(self.pre_norm(state))
        shape = (*state.shape[:-1], self.num_heads, -1)
        stepped = state.view(shape) + self.step_size[:, None] * delta.view(shape)
        return self.post_norm(stepped.flatten(-2))


class StateTokenProjection(nn.Module):
    """``token = RMSNorm(W s)``: a relative state ``[B, T, S]`` becomes a state token ``[B, T, d]``.

    Args:
        state_size: ``S``.
        hidden_size: ``d``.
        eps: RMSNorm epsilon.
    """

    def __init__(self, state_size: int, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.state_to_hidden = nn.Linear(state_size, hidden_size, bias=False)
        self.norm = RMSNorm(hidden_size, eps)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.norm(self.state_to_hidden(state))


def shift_right(state: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    """``[s_{-1}, s_0, ..., s_{T-2}]`` with ``s_{-1} = previous`` (zeros at the start of a sequence).

    Args:
        state: ``[B, T, S]``.
        previous: ``[B, 1, S]`` (the cached last state of the previous chunk) or ``None``.
    """
    if previous is None:
        previous = state.new_zeros(state.shape[0], 1, state.shape[2])
    return torch.cat((previous.to(state.dtype), state[:, :-1]), dim=1)
