"""The lean streaming decode loop shared by every family.

Prefill once, then feed one token per step through the model's cache. No logits processors, no
stopping-criteria objects, no per-step re-slicing of the whole prompt: per step it costs one forward
of one token plus a sampling step on the last logits. ``transformers``' ``generate()`` works too;
this loop is the fast path the CLI uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from .layers.fused import frozen_weights


@dataclass
class SamplingConfig:
    """How to pick the next token.

    Args:
        temperature: 0 means greedy (argmax); otherwise logits are divided by it.
        top_k: keep only the ``k`` most likely tokens (0 = off).
        top_p: nucleus sampling: keep the smallest set whose probability reaches ``p`` (1.0 = off).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def sample_next(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row from ``logits [B, V]``; returns ``[B]`` int64."""
    if cfg.temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / cfg.temperature
    if cfg.top_k:
        kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= cfg.top_p  # keep the token that crosses p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.inference_mode()
@frozen_weights()
def generate(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: SamplingConfig | None = None,
    attention_mask: torch.Tensor | None = None,
    stop_tokens: Iterable[int] = (),
    callback: Callable[[torch.Tensor], None] | None = None,
    generator: torch.Generator | None = None,
    model_kwargs: dict | None = None,
    step_kwargs: Callable[[int], dict] | None = None,
) -> torch.Tensor:
    """Generate up to ``max_new_tokens`` after ``input_ids [B, T]``.

    Args:
        model: any slmlab causal LM (``forward(input_ids, attention_mask, cache, use_cache)``).
        input_ids: the prompt; left-pad a batch and pass ``attention_mask``.
        sampling: greedy by default.
        stop_tokens: a row stops after producing one of these; the loop ends when all rows stopped
            (finished rows are padded with their stop token).
        callback: called with the ``[B]`` new tokens after each step (streaming).
        model_kwargs: extra keyword arguments for the prefill call (e.g. PGSM's ``retrieval_positions``).
        step_kwargs: ``step -> kwargs`` for each decode call (family hooks; step counts from 0).
    Returns:
        ``[B, T + n]`` prompt followed by the generated tokens.
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    sampling = sampling or SamplingConfig()
    stop = torch.tensor(sorted(set(int(s) for s in stop_tokens)), dtype=torch.long, device=input_ids.device)
    tokens = [input_ids]
    if max_new_tokens == 0:
        return input_ids
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **(model_kwargs or {}))
    cache = out.cache
    logits = out.logits[:, -1]
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
    mask = attention_mask
    for step in range(max_new_tokens):
        nxt = sample_next(logits, sampling, generator)
        if stop.numel():
            nxt = torch.where(done, tokens[-1][:, -1] if step else nxt, nxt)
            done = done | torch.isin(nxt, stop)
        tokens.append(nxt[:, None])
        if callback is not None:
            callback(nxt)
        if step == max_new_tokens - 1 or (stop.numel() and bool(done.all())):
            break
        if mask is not None:
            mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), dim=1)
        extra = step_kwargs(step) if step_kwargs is not None else {}
        out = model(input_ids=nxt[:, None], attention_mask=mask, cache=cache, use_cache=True, **extra)
        cache = out.cache
        logits = out.logits[:, -1]
    return torch.cat(tokens, dim=1)
