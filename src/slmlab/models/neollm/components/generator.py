"""The Leviathan continuous token generator (Batley & Saha, "A Separable Architecture for Continuous
Token Representation in Language Models", arXiv 2601.22040; basis from KHRONOS, arXiv 2505.13315):
the ``V × D`` input table is replaced by a separable function of a token's coordinates
(``docs/neollm.md#token-generator``).

With ``k = generator_k``, ``d = generator_d_seed``, ``M = generator_num_modes``,
``K = generator_num_knots`` and ``R = generator_krank``::

    b      = the least integer with b^k >= V                 (integer loop, no float root)
    c_j(t) = floor(t / b^j) mod b,  j = 0..k-1                # distinct tuples for distinct ids
    s(t)   = concat_j C_j[c_j(t)]                             # k codebooks C_j [b, d], init N(0, 1)
    per mode i:  z_i = sigmoid(½ γ_i ⊙ LN(W_i s))             # W_i [d, k·d]; LN without affine; γ_i init 1
                 B_i = normalised quadratic B-spline basis of z_i over K knots          [d, K]
                 y_i[r] = Π_j Σ_q B_i[j, q] (1 + WD_i[j, q, r])                        [R], fp32
    e_tok(t) = Σ_i H_i y_i                                    # H_i [D, R]

The basis (knots ``κ_q = q/(K-1)``, ``u = |z - κ_q|·(K-1)``): ``0.75 - u²`` for ``u < ½``,
``½(1.5 - u)²`` for ``½ <= u < 1.5``, else 0, divided by its sum over the knots (+1e-8), so every row
sums to one, including at the end knots where the raw sum is 0.875. ``WD_i ~ N(0, 0.02²)``: all zeros
would give every token the same embedding at step 0. Everything depends on the id only, so the
generator runs on the unique ids of a call, in chunks, and the rows are gathered back; decoding
needs no state. JTok-M reads mode 1's ``z̃ = z_1`` and ``B_1`` (:meth:`LeviathanGenerator.latents`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

BASIS_EPS = 1e-8


def latent_base(vocab_size: int, k: int) -> int:
    """The least ``b`` with ``b^k >= V``, by an integer loop (V = 64402, k = 3 gives 41)."""
    base = 1
    while base**k < vocab_size:
        base += 1
    return base


def latent_coordinates(ids: torch.Tensor, base: int, k: int) -> torch.Tensor:
    """``c_j(t) = floor(t / b^j) mod b`` for ``j = 0..k-1``: ``ids [...]`` -> ``[..., k]`` (int64)."""
    powers = base ** torch.arange(k, device=ids.device, dtype=torch.int64)
    return torch.div(ids.long()[..., None], powers, rounding_mode="floor") % base


def khronos_basis(z: torch.Tensor, num_knots: int) -> torch.Tensor:
    """The quadratic B-spline basis of ``z ∈ [0, 1]`` at ``K`` uniform knots, normalised over the knots.

    Only the nearest knot ``c = round(z (K-1))`` and its two neighbours can be non-zero (every other
    knot is at least 1.5 spacings away), so the three values are computed and scattered into the
    ``K`` slots: the same numbers as evaluating all ``K``, with a tenth of the elementwise work.

    Shapes:
        z ``[...]`` -> ``[..., K]`` (the dtype of ``z``).
    """
    x = z * (num_knots - 1)
    knot = x.detach().round().long()[..., None] + torch.arange(-1, 2, device=z.device)  # [..., 3]
    u = (x[..., None] - knot.to(x.dtype)).abs()
    raw = torch.where(u < 0.5, 0.75 - u * u, torch.where(u < 1.5, 0.5 * (1.5 - u) ** 2, torch.zeros_like(u)))
    raw = raw * ((knot >= 0) & (knot < num_knots)).to(raw.dtype)  # knots beyond the ends do not exist
    values = raw / (raw.sum(-1, keepdim=True) + BASIS_EPS)
    slots = knot.clamp(0, num_knots - 1)  # a clamped slot receives a zero: scatter_add leaves it intact
    return torch.zeros(*z.shape, num_knots, device=z.device, dtype=z.dtype).scatter_add(-1, slots, values)


@dataclass
class TokenLatents:
    """Mode 1's latent coordinate of the tokens of one forward, on their unique ids (what every JTok-M
    layer reads from the :class:`~.context.ForwardContext`).

    Attributes:
        inverse: ``[B, T]`` index of each token's id in the unique ids.
        z: ``[U, d]`` the latent coordinate ``z̃`` (fp32).
        basis: ``[U, d, K]`` its normalised basis values ``B(z̃)`` (fp32).
    """

    inverse: torch.Tensor
    z: torch.Tensor
    basis: torch.Tensor


class LeviathanGenerator(nn.Module):
    """Token ids -> input embeddings through a separable continuous generator (no ``V × D`` table).

    Parameters (``k·b·d + M·(d·k·d + d + d·K·R + D·R)``; 2,769,280 at the seed's defaults against
    32,973,824 for the dense table): ``codebooks [k, b, d]``, ``seed_proj [M, d, k·d]`` (the ``W_i``),
    ``scale [M, d]`` (the ``γ_i``), ``delta [M, d, K, R]`` (the ``WD_i``), ``out_proj [M, D, R]`` (the
    ``H_i``). No multipliers.

    Args:
        vocab_size: ``V``; hidden_size: ``D``; k: coordinates per id; d_seed: ``d``; num_modes: ``M``;
        num_knots: ``K``; krank: ``R``; eps: the LayerNorm epsilon; std: the init σ of ``W_i`` and ``H_i``
        (truncated at ±2σ); chunk_size: unique ids evaluated at once.
    Shapes:
        ids ``[B, T]`` -> ``[B, T, D]`` (the parameters' dtype).
    """

    def __init__(
        self, vocab_size: int, hidden_size: int, k: int = 3, d_seed: int = 128, num_modes: int = 8, num_knots: int = 32,
        krank: int = 64, eps: float = 1e-6, std: float = 0.02, chunk_size: int = 512,
    ) -> None:
        super().__init__()
        self.vocab_size, self.hidden_size, self.k, self.d_seed = vocab_size, hidden_size, k, d_seed
        self.num_knots, self.eps, self.std, self.chunk_size = num_knots, eps, std, chunk_size
        self.base = latent_base(vocab_size, k)
        self.codebooks = nn.Parameter(torch.randn(k, self.base, d_seed))
        self.seed_proj = nn.Parameter(torch.empty(num_modes, d_seed, k * d_seed))
        self.scale = nn.Parameter(torch.ones(num_modes, d_seed))
        self.delta = nn.Parameter(torch.empty(num_modes, d_seed, num_knots, krank))
        self.out_proj = nn.Parameter(torch.empty(num_modes, hidden_size, krank))
        self.reset_parameters_with(nn.init)

    @classmethod
    def from_config(cls, config) -> LeviathanGenerator:
        return cls(
            config.vocab_size, config.hidden_size, k=config.generator_k, d_seed=config.generator_d_seed,
            num_modes=config.generator_num_modes, num_knots=config.generator_num_knots, krank=config.generator_krank,
            eps=config.rms_norm_eps, std=config.initializer_range,
        )

    def reset_parameters_with(self, init_module) -> None:
        """Codebooks N(0, 1), ``W_i`` and ``H_i`` truncated normal (σ, ±2σ), ``γ = 1``, ``WD ~ N(0, 0.02²)``."""
        init_module.normal_(self.codebooks, mean=0.0, std=1.0)
        for w in (self.seed_proj, self.out_proj):
            init_module.trunc_normal_(w, mean=0.0, std=self.std, a=-2 * self.std, b=2 * self.std)
        init_module.ones_(self.scale)
        init_module.normal_(self.delta, mean=0.0, std=0.02)

    # -- maths on unique ids -----------------------------------------------------------------
    def seed(self, ids: torch.Tensor) -> torch.Tensor:
        """``s(t) = concat_j C_j[c_j(t)]``: ``ids [U]`` -> ``[U, k·d]`` (fp32)."""
        coords = latent_coordinates(ids, self.base, self.k)
        rows = self.codebooks.float()[torch.arange(self.k, device=ids.device), coords]  # [U, k, d]
        return rows.flatten(-2)

    def mode_latents(self, seed: torch.Tensor, modes: slice = slice(None)) -> torch.Tensor:
        """``z_i = sigmoid(½ γ_i ⊙ LN(W_i s))`` for the selected modes: ``[U, k·d]`` -> ``[U, m, d]`` (fp32)."""
        a = torch.einsum("us,mds->umd", seed, self.seed_proj[modes].float())
        a = F.layer_norm(a, (self.d_seed,), eps=self.eps)
        return torch.sigmoid(0.5 * self.scale[modes].float() * a)

    def _embed_unique(self, ids: torch.Tensor) -> torch.Tensor:
        z = self.mode_latents(self.seed(ids)).permute(1, 2, 0)  # [M, d, U]: (mode, seed dim) batches the products
        m, d, u = z.shape
        basis = khronos_basis(z, self.num_knots).view(m * d, u, self.num_knots)
        phi = torch.bmm(basis, (1.0 + self.delta.float()).view(m * d, self.num_knots, -1))  # [M·d, U, R]
        y = phi.view(m, d, u, -1).prod(dim=1)  # [M, U, R]: the product over the d seed dimensions
        return torch.einsum("mur,mhr->uh", y, self.out_proj.float())

    def embed_unique(self, ids: torch.Tensor) -> torch.Tensor:
        """Embeddings of distinct ids ``[U]`` -> ``[U, D]`` (the parameters' dtype), in chunks, in fp32."""
        with torch.autocast(ids.device.type, enabled=False):
            rows = [self._embed_unique(ids[i : i + self.chunk_size]) for i in range(0, ids.shape[0], self.chunk_size)]
        return torch.cat(rows).to(self.out_proj.dtype)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        return self.embed_unique(unique)[inverse].view(*ids.shape, self.hidden_size)

    def latents(self, ids: torch.Tensor) -> TokenLatents:
        """Mode 1's ``z̃`` and ``B(z̃)`` on the unique ids of ``ids [B, T]`` (JTok-M's inputs; the
        gradient reaches the codebooks and mode 1's ``W_1`` and ``γ_1``)."""
        unique, inverse = torch.unique(ids.reshape(-1), return_inverse=True)
        with torch.autocast(ids.device.type, enabled=False):
            z = self.mode_latents(self.seed(unique), slice(0, 1))[:, 0]
            basis = khronos_basis(z, self.num_knots)
        return TokenLatents(inverse.view(ids.shape), z, basis)

    def extra_repr(self) -> str:
        m, d, k_knots, r = self.delta.shape
        return f"V={self.vocab_size}, b={self.base}, k={self.k}, d_seed={d}, modes={m}, knots={k_knots}, krank={r}, D={self.hidden_size}"


def no_latents(ids: torch.Tensor | None) -> None:
    """What the model passes to the layers as ``ForwardContext.latents`` without JTok-M."""
    return None


__all__ = ["LeviathanGenerator", "TokenLatents", "khronos_basis", "latent_base", "latent_coordinates", "no_latents"]
