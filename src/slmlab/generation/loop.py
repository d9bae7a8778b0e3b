"""The lean streaming decode loop shared by every family.

Prefill once, then feed one token per step through the model's cache. No logits processors, no
stopping-criteria objects, no per-step re-slicing of the whole prompt: per step it costs one forward
of one token plus a sampling step on the last logits. ``transformers``' ``generate()`` works too;
this loop is the fast path the CLI uses.

Families with a decode plan (:mod:`slmlab.generation.plan`; Lumen and LFM2) decode through it when
the batch has no padding and no family inputs: the model's forward runs the prompt, the plan runs
each new token. ``compile=True`` also compiles the plan's step with ``torch.compile`` (one compile
per shape per process, about 5-15 s on a CPU; worth it for long generations). The path that ran is
the returned tensor's ``decode_path`` and one ``DEBUG`` line of the ``slmlab.generation`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..layers.fused import frozen_weights
from .plan import DecodePlan

logger = logging.getLogger("slmlab.generation")

PLAN, COMPILED_PLAN, MODEL_FORWARD = "plan", "compiled plan", "model forward"

_COMPILED: dict = {}


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


class GeneratedTokens(torch.Tensor):
    """The ``[B, T + n]`` tensor :func:`generate` returns, which also says how it was decoded.

    It is an ordinary tensor everywhere (indexing, ``tolist``, ``torch.equal``; operations on it
    return plain tensors); ``decode_path`` is ``"plan"``, ``"compiled plan"`` or ``"model forward"``,
    or None when nothing was decoded (``max_new_tokens=0``).
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # ops return plain tensors
    decode_path: str | None = None


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
    use_plan: bool = True,
    compile: bool = False,
) -> GeneratedTokens:
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
        use_plan: decode through the family's decode plan when it has one and the call allows it
            (no padding, no family inputs); False always steps through ``model.forward``.
        compile: compile the plan's step with ``torch.compile`` (ignored without a plan).
    Returns:
        ``[B, T + n]`` prompt followed by the generated tokens, a :class:`GeneratedTokens` whose
        ``decode_path`` says which step ran: ``"plan"``, ``"compiled plan"`` or ``"model forward"``
        (also logged at ``DEBUG`` by the ``slmlab.generation`` logger).
    """
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    sampling = sampling or SamplingConfig()
    stop = torch.tensor(sorted(set(int(s) for s in stop_tokens)), dtype=torch.long, device=input_ids.device)
    tokens = [input_ids]
    if max_new_tokens == 0:
        return _result(input_ids, None)
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=True, **(model_kwargs or {}))
    logits = out.logits[:, -1]
    advance, path, reason = None, MODEL_FORWARD, plan_refusal(use_plan, attention_mask, model_kwargs, step_kwargs)
    if reason is None:
        advance = plan_decoder(model, out.cache, input_ids.shape[1], max_new_tokens, compile)
        if advance is None:
            reason = "the model has no decode plan for this call (family, half precision or length)"
        else:
            path = COMPILED_PLAN if compile else PLAN
    if advance is None:
        advance = forward_decoder(model, out.cache, attention_mask, step_kwargs)
    logger.debug("generate: %d new tokens, batch %d, through the %s%s", max_new_tokens, input_ids.shape[0], path,
                 f" ({reason})" if reason else "")
    done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
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
        logits = advance(nxt[:, None], step)
    return _result(torch.cat(tokens, dim=1), path)


def _result(tokens: torch.Tensor, path: str | None) -> GeneratedTokens:
    out = tokens.as_subclass(GeneratedTokens)
    out.decode_path = path
    return out


def plan_refusal(use_plan: bool, attention_mask: torch.Tensor | None, model_kwargs: dict | None,
                 step_kwargs: Callable[[int], dict] | None) -> str | None:
    """Why this call must step through ``model.forward`` rather than a decode plan, or None."""
    if not use_plan:
        return "use_plan=False"
    if model_kwargs or step_kwargs is not None:
        return "family inputs"
    if attention_mask is not None and not bool(attention_mask.all()):
        return "padded batch"
    return None


Decoder = Callable[[torch.Tensor, int], torch.Tensor]  # (tokens [B, 1], step) -> next logits [B, V]


def forward_decoder(model: torch.nn.Module, cache, attention_mask: torch.Tensor | None,
                    step_kwargs: Callable[[int], dict] | None) -> Decoder:
    """Steps through ``model.forward`` and its cache (every family; padding and family inputs)."""
    mask = attention_mask

    def advance(tokens: torch.Tensor, step: int) -> torch.Tensor:
        nonlocal cache, mask
        if mask is not None:
            mask = torch.cat((mask, mask.new_ones(mask.shape[0], 1)), dim=1)
        extra = step_kwargs(step) if step_kwargs is not None else {}
        out = model(input_ids=tokens, attention_mask=mask, cache=cache, use_cache=True, **extra)
        cache = out.cache
        return out.logits[:, -1]

    return advance


def plan_decoder(model: torch.nn.Module, cache, prompt_len: int, max_new_tokens: int, compile: bool) -> Decoder | None:
    """Steps through the family's decode plan, taking over the prefilled ``cache``; None without a plan."""
    plan = build_plan(model, prompt_len + max_new_tokens)
    if plan is None:
        return None
    plan.start(cache)
    position = torch.tensor([prompt_len], device=plan.device)
    step_fn = compiled_step(plan) if compile else None

    def advance(tokens: torch.Tensor, step: int) -> torch.Tensor:
        logits = plan.step(tokens, position, step_fn)
        position.add_(1)
        return logits

    return advance


def build_plan(model: torch.nn.Module, capacity: int) -> DecodePlan | None:
    """The model's decode plan for ``capacity`` positions, or None (no plan, a half-precision model,
    or beyond its length)."""
    if not hasattr(model, "decode_plan"):
        return None
    if next(model.get_input_embeddings().parameters()).dtype not in (torch.float32, torch.float64):  # a table or a generator
        return None  # RoPE as a complex multiply needs fp32/fp64 pairs (no bfloat16 complex type)
    limit = model.max_positions()
    if limit is not None and capacity > limit:
        return None  # the model's own path raises its length error at the step that crosses it
    return model.decode_plan(capacity)


def compiled_step(plan: DecodePlan):
    """``torch.compile`` of the plan's step function, shared by every plan of that function.

    Shapes are static (the plan's buffers have a fixed size), so each (batch, capacity) compiles once;
    on CPU the C++ wrapper removes the Python overhead between kernels.
    """
    fn = plan.step_fn
    if fn not in _COMPILED:
        options = {"cpp_wrapper": True} if plan.device.type == "cpu" else None
        _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True, options=options)
    return _COMPILED[fn]
