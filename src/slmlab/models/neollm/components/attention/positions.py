"""Positional operators of a NeoLLM attention layer (step 6 of docs/neollm-attention.md#order-of-operations): one module per layer kind.

* :class:`IntegerRoPE` — partial RoPE on integer positions (Su et al., RoFormer, arXiv 2104.09864):
  angle ``φ_{t,i} = pos_t · θ_i`` on the first ``r_d`` channels (layers below ``repo_start_layer``).
* :class:`RepoRotation` — REPO (Li, Zhao, Cai, Sproat, arXiv 2512.14391): learned real positions
  ``z_t = (Swish(x_t W_g) ⊙ x_t W_c) · w_z`` replace ``pos_t``, so a score reads
  ``q_iᵀ R(z_j − z_i) k_j``; with REPO-GRAPE (Zhang et al., GRAPE, arXiv 2512.07805) the spectrum is
  learned too, ``θ_{g,i} = θ⁰_i · exp(s_{g,i})``.

Decisions (docs/neollm-attention.md#positions): ``z`` and the spectrum are per **KV head** (query head ``h`` uses its
group ``h // G``), so every cached key keeps one rotation under GQA; ``z`` is read from the block
input ``x`` (not the FAN features) and computed in fp32; planes are the rotate-half pairs.
Every IHA pseudo-slot of a token uses that token's own position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .....layers.fused import fusable
from .rotation import FrequencyTable, cos_sin, rope_frequencies, rotate_channels


class IntegerRoPE(nn.Module):
    """Integer partial RoPE; no parameters.

    Args:
        freqs: ``θ_i`` (``r_d/2`` floats, after ``rope_scaling``).
        scaling: rope attention scaling (1.0 without ``rope_scaling``).
    Shapes:
        x ``[B, T, d]`` (unused), position_ids ``[B, T]``, q ``[B, T, H, P, D]``, k ``[B, T, H_kv, P, D]``
        -> rotated q, k (same shapes) and ``None`` (no REPO coordinates on this layer).
    """

    def __init__(self, freqs: tuple[float, ...], scaling: float = 1.0) -> None:
        super().__init__()
        self.table = FrequencyTable(freqs)
        self.scaling = scaling

    def forward(self, x, position_ids, q, k):
        angles = position_ids.to(torch.float32)[..., None] * self.table.get(q.device)  # [B, T, r/2]
        cos, sin = cos_sin(angles, self.scaling)
        cos, sin = cos[:, :, None, None], sin[:, :, None, None]
        return rotate_channels(q, cos, sin), rotate_channels(k, cos, sin), None


class RepoCoordinates(nn.Module):
    """REPO's position network ``f_ϕ``: ``r = Swish(x W_g) ⊙ (x W_c)``, ``z^{(g)} = r · w_z^{(g)}``.

    Args:
        hidden_size: ``d``.
        d_p: width of ``r`` (``repo_d_p``).
        num_kv_heads: one coordinate per KV head.
        init_std: truncated-normal std of ``W_g``, ``W_c`` and ``w_z`` (``z ≈ 0`` at init: NoPE-like).
    Shapes:
        x ``[B, T, d]`` -> z ``[B, T, H_kv]`` in fp32 (:meth:`features` also returns ``r [B, T, d_p]``).
    """

    def __init__(self, hidden_size: int, d_p: int, num_kv_heads: int, init_std: float) -> None:
        super().__init__()
        if d_p <= 0:
            raise ValueError(f"repo_d_p must be positive, got {d_p}")
        self.init_std = init_std
        self.w_g = nn.Linear(hidden_size, d_p, bias=False)
        self.w_c = nn.Linear(hidden_size, d_p, bias=False)
        self.w_z = nn.Parameter(torch.empty(num_kv_heads, d_p))
        self.reset_parameters_with(nn.init)

    def reset_parameters_with(self, init_module) -> None:
        """Truncated normal (±2σ) for all three weights, through ``init_module`` (``torch.nn.init``
        or ``transformers.initialization``, which skips loaded weights)."""
        s = self.init_std
        for w in (self.w_g.weight, self.w_c.weight, self.w_z):
            init_module.trunc_normal_(w, mean=0.0, std=s, a=-2 * s, b=2 * s)

    def features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(r, z)``: the REPO features (read by the GOAT key-bias channel) and the coordinates."""
        xf = x.float()
        if fusable(self.w_g, self.w_c):
            r = F.silu(F.linear(xf, self.w_g.weight.float())) * F.linear(xf, self.w_c.weight.float())
        else:  # e.g. LoRA-wrapped: each its own forward (fp32 when the model is)
            r = F.silu(self.w_g(xf)) * self.w_c(xf)
        return r, self.coordinates(r)

    def coordinates(self, r: torch.Tensor) -> torch.Tensor:
        """``z = r · w_z`` per KV head."""
        return F.linear(r, self.w_z.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)[1]


class FixedSpectrum(nn.Module):
    """REPO alone: the RoPE frequencies, shared by every KV head. Shapes: -> ``[1, r_d/2]``."""

    def forward(self, freqs: torch.Tensor) -> torch.Tensor:
        return freqs[None]


class GrapeSpectrum(nn.Module):
    """GRAPE-M learned spectrum ``θ_{g,i} = θ⁰_i · exp(s_{g,i})``, ``s`` init 0 (== REPO at init).

    Args:
        num_kv_heads: ``H_kv``.
        num_planes: ``r_d / 2``.
    Shapes:
        freqs ``[r_d/2]`` -> ``[H_kv, r_d/2]`` (fp32).
    """

    def __init__(self, num_kv_heads: int, num_planes: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.zeros(num_kv_heads, num_planes))

    def reset_parameters_with(self, init_module) -> None:
        init_module.zeros_(self.log_scale)

    def forward(self, freqs: torch.Tensor) -> torch.Tensor:
        return freqs[None] * self.log_scale.float().exp()


class RepoRotation(nn.Module):
    """REPO / REPO-GRAPE rotation by learned per-KV-head coordinates.

    Args:
        hidden_size, d_p, num_kv_heads, init_std: see :class:`RepoCoordinates`.
        num_heads: query heads ``H`` (``G = H / H_kv`` heads share a coordinate).
        freqs, scaling: base frequencies ``θ⁰`` and rope attention scaling.
        learned_spectrum: REPO-GRAPE (:class:`GrapeSpectrum`) instead of the fixed RoPE spectrum.
    Shapes:
        x ``[B, T, d]``, position_ids (unused), q ``[B, T, H, P, D]``, k ``[B, T, H_kv, P, D]``
        -> rotated q, k and the coordinates ``(r, z)`` (the GOAT prior reads them).
    """

    def __init__(
        self,
        hidden_size: int,
        d_p: int,
        num_heads: int,
        num_kv_heads: int,
        freqs: tuple[float, ...],
        scaling: float,
        learned_spectrum: bool,
        init_std: float,
    ) -> None:
        super().__init__()
        self.groups = num_heads // num_kv_heads
        self.table = FrequencyTable(freqs)
        self.scaling = scaling
        self.coords = RepoCoordinates(hidden_size, d_p, num_kv_heads, init_std)
        self.spectrum = GrapeSpectrum(num_kv_heads, len(freqs)) if learned_spectrum else FixedSpectrum()

    @classmethod
    def from_config(cls, config, layer_idx: int) -> nn.Module:
        """REPO (or REPO-GRAPE) from ``repo_start_layer`` on, integer partial RoPE below it."""
        freqs, scaling = rope_frequencies(config)
        if not config.is_repo_layer(layer_idx):
            return IntegerRoPE(freqs, scaling)
        return cls(
            config.hidden_size,
            config.repo_d_p,
            config.num_attention_heads,
            config.num_key_value_heads,
            freqs,
            scaling,
            bool(config.use_repo_grape),
            config.initializer_range,
        )

    def forward(self, x, position_ids, q, k):
        r, z = self.coords.features(x)  # [B, T, d_p], [B, T, H_kv]
        theta = self.spectrum(self.table.get(x.device))  # [H_kv or 1, r/2]
        cos, sin = cos_sin(z[..., None] * theta, self.scaling)  # [B, T, H_kv, r]
        cos_k, sin_k = cos[:, :, :, None], sin[:, :, :, None]
        cos_q = cos_k.repeat_interleave(self.groups, dim=2)
        sin_q = sin_k.repeat_interleave(self.groups, dim=2)
        return rotate_channels(q, cos_q, sin_q), rotate_channels(k, cos_k, sin_k), (r, z)
