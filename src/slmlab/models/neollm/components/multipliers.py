"""Learnable Multipliers (Velikanov et al., "Learnable Multipliers: Freeing the Scale of Language
Model Matrix Layers", arXiv 2601.04890).

``W_eff = diag(r) · W · diag(c)``, i.e. ``y = r ⊙ ((x ⊙ c) Wᵀ) + b``: the matrix ``W`` keeps its
ordinary init and weight decay while the learnable row/column scales ``r``/``c`` (init 1, meant to be
kept in fp32 and out of weight decay) carry the layer's scale. At init the layer equals ``nn.Linear``
with the same ``W``. Parameter names ``row_multiplier`` / ``col_multiplier`` let an optimiser group
them apart.

Embedding multipliers (same paper): ``e_tok(t) = ρ_t · (W_E[t] ⊙ κ)`` with a vocabulary-row scale
``ρ ∈ R^V`` and a hidden-channel scale ``κ ∈ R^D``, both init 1; built only when
``embedding_multipliers_active(config)`` (learnable multipliers on, no token generator, untied head).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def embedding_multipliers_active(config) -> bool:
    """Embedding multipliers exist only with learnable multipliers, no generator and no tying
    (otherwise the config already warned that the flag is inactive)."""
    return bool(
        config.use_embedding_multipliers
        and config.use_learnable_multipliers
        and not config.use_token_generator
        and not config.tie_word_embeddings
    )


class RowMultipliedLinear(nn.Module):
    """``y = r ⊙ (x Wᵀ) + b`` with a learnable row (output-channel) multiplier ``r`` init 1.

    Holds ``weight`` / ``bias`` as ``nn.Linear`` does (same state-dict keys and init), but is *not* an
    ``nn.Linear``: an adapter library that adapts every linear layer (peft's LoRA) adds its update
    outside ``r`` and then merges it inside (``r ⊙ (x (W + ΔW)ᵀ)`` ≠ ``r ⊙ (x Wᵀ) + x ΔWᵀ``), so
    ``merge_and_unload`` would silently change the model. peft refuses a module it does not know by
    name ("Target module ... is not supported") and skips it under ``target_modules="all-linear"``;
    :meth:`fold_multipliers` turns the layer into a plain ``x Wᵀ + b`` for inference or quantization.

    Args:
        in_features / out_features: as ``nn.Linear``.
        bias: add a bias after the row scale.
    Shapes:
        x ``[..., in_features]`` -> ``[..., out_features]``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        reference = nn.Linear(in_features, out_features, bias=bias)  # nn.Linear's default init
        self.weight = nn.Parameter(reference.weight.detach())
        self.bias = nn.Parameter(reference.bias.detach()) if bias else None
        self.row_multiplier = nn.Parameter(torch.ones(out_features))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight) * self.row_multiplier.to(x.dtype)
        return y if self.bias is None else y + self.bias

    def reset_multipliers(self, init_module) -> None:
        """Set every multiplier to 1 with ``init_module`` (``transformers.initialization``)."""
        init_module.ones_(self.row_multiplier)

    @torch.no_grad()
    def fold_multipliers(self) -> None:
        """Write ``diag(r)·W`` into ``W`` and reset ``r`` to 1 (same outputs; for inference)."""
        self.weight.mul_(self.row_multiplier.to(self.weight.dtype)[:, None])
        self.row_multiplier.fill_(1.0)


class RowColMultipliedLinear(RowMultipliedLinear):
    """``y = r ⊙ ((x ⊙ c) Wᵀ) + b`` with row ``r`` and column (input-channel) ``c`` multipliers, init 1.
    Args and shapes as :class:`RowMultipliedLinear`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__(in_features, out_features, bias=bias)
        self.col_multiplier = nn.Parameter(torch.ones(in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x * self.col_multiplier.to(x.dtype))

    def reset_multipliers(self, init_module) -> None:
        super().reset_multipliers(init_module)
        init_module.ones_(self.col_multiplier)

    @torch.no_grad()
    def fold_multipliers(self) -> None:
        self.weight.mul_(self.col_multiplier.to(self.weight.dtype)[None, :])
        self.col_multiplier.fill_(1.0)
        super().fold_multipliers()


class EmbeddingMultipliers(nn.Module):
    """``(e_tok, ids) ↦ ρ[ids] · (e_tok ⊙ κ)`` with ``ρ ∈ R^V`` (``row_multiplier``) and ``κ ∈ R^D``
    (``col_multiplier``), both init 1 (``V + D`` parameters).

    Args:
        vocab_size: ``V``; hidden_size: ``D``.
    Shapes:
        e_tok ``[B, T, D]``, ids ``[B, T]`` -> ``[B, T, D]``.
    """

    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.row_multiplier = nn.Parameter(torch.ones(vocab_size))
        self.col_multiplier = nn.Parameter(torch.ones(hidden_size))

    @classmethod
    def from_config(cls, config, layer_idx: int | None = None) -> nn.Module:
        """The multipliers when ``embedding_multipliers_active(config)``, else :class:`NoEmbeddingMultipliers`."""
        if not embedding_multipliers_active(config):
            return NoEmbeddingMultipliers()
        return cls(config.vocab_size, config.hidden_size)

    def reset_parameters_with(self, init_module) -> None:
        init_module.ones_(self.row_multiplier)
        init_module.ones_(self.col_multiplier)

    def forward(self, e_tok: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        rho = self.row_multiplier[ids].to(e_tok.dtype).unsqueeze(-1)
        return rho * (e_tok * self.col_multiplier.to(e_tok.dtype))


class NoEmbeddingMultipliers(nn.Module):
    """Embedding multipliers off: ``e_tok`` passes through."""

    def forward(self, e_tok: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return e_tok


def multiplied_linear(
    in_features: int, out_features: int, *, row: bool, col: bool = False, enabled: bool = True, bias: bool = False
) -> nn.Linear:
    """The factory the blocks use: a plain ``nn.Linear`` (state-dict key ``weight`` only) when the
    multipliers are disabled or not placed on this layer, otherwise the multiplied variant.

    Args:
        row / col: place row / column multipliers on this projection (``col`` needs ``row``).
        enabled: ``config.use_learnable_multipliers``.
    """
    if col and not row:
        raise ValueError("a column multiplier is only placed together with a row multiplier (row=True)")
    if not enabled or not row:
        return nn.Linear(in_features, out_features, bias=bias)
    cls = RowColMultipliedLinear if col else RowMultipliedLinear
    return cls(in_features, out_features, bias=bias)
