"""The lean streaming decode loop shared by every family.

Prefill once, then feed one token per step through the model's cache. No logits processors, no
stopping-criteria objects, no per-step re-slicing of the whole prompt: per step it costs one forward
of one token plus a sampling step on the last logits. ``transformers``' ``generate()`` works too;
this loop is the fast path the CLI uses.

Families with a decode plan (:mod:`slmlab.generation.plan`; Lumen and LFM2) decode through it when
the batch has no padding and no family inputs: the model's forward runs the prompt, the plan runs
each new token. ``compile=True`` runs the plan's step compiled: on a CPU packaged ahead of time by
AOTInductor (:mod:`.packaged`; tens of CPU-seconds the first time a layout is met, then loaded from
the user's cache folder in about a second by every later process), elsewhere ``torch.compile``. A
caller that holds :func:`~slmlab.layers.fused.frozen_weights` across many calls (a server, a
benchmark) has the plan's arranged weights built once (:func:`weights_frozen`). The path that ran is
the returned tensor's ``decode_path`` and one ``DEBUG`` line of the ``slmlab.generation`` logger.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch

from ..layers.fused import frozen_epoch, frozen_weights
from .packaged import packaged_step
from .plan import DecodePlan, StepFn

logger = logging.getLogger("slmlab.generation")

PLAN, COMPILED_PLAN, MODEL_FORWARD = "plan", "compiled plan", "model forward"

_COMPILED: dict = {}
# model -> {(frozen-weights epoch, capacity): its decode plan (weights arranged, no states)}; only
# inside a frozen_weights() block that a caller holds across generate() calls (see weights_frozen)
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
PLANS_PER_MODEL = 4


@contextlib.contextmanager
def weights_frozen() -> Iterator[None]:
    """:func:`~slmlab.layers.fused.frozen_weights` for one :func:`generate` call, unless the caller
    already holds such a block (a server's worker, a benchmark, a script that generates many times
    from fixed weights): its promise then covers this call too, and what was arranged under it is
    reused across calls: fused projections, and the decode plan's arranged weights (q|k|v and
    gate|up concatenated and transposed: a copy of every weight, which for a 128-token generation
    of the quickstart model costs as much as ~20 of its tokens). A block this function opens
    forgets its plans when it closes."""
    if frozen_epoch() is not None:
        yield
        return
    with frozen_weights():
        epoch = frozen_epoch()
        try:
            yield
        finally:
            for plans in list(_PLANS.values()):
                for key in [k for k in plans if k[0] == epoch]:
                    del plans[key]


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
@weights_frozen()
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
        compile: compile the plan's step (ignored without a plan): on a CPU the AOTInductor package of
            :mod:`.packaged`, cached on disk; elsewhere ``torch.compile``.
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
    """Steps through the family's decode plan, taking over the prefilled ``cache``; None without a plan.

    Compiled, the plan's buffers get :func:`compiled_capacity` positions (a few sizes, so that a
    compiled step serves generations of many lengths)."""
    needed = prompt_len + max_new_tokens
    plan = frozen_plan(model, compiled_capacity(needed, model.max_positions()) if compile else needed)
    if plan is None:
        return None
    plan.start(cache)
    position = torch.tensor([prompt_len], device=plan.device)
    step = compiled_decoder(plan) if compile else plan.step

    def advance(tokens: torch.Tensor, step_index: int) -> torch.Tensor:
        logits = step(tokens, position)
        position.add_(1)
        return logits

    return advance


def compiled_capacity(needed: int, limit: int | None, smallest: int = 256) -> int:
    """Positions of a compiled plan's buffers: the power of two >= ``needed`` (at least ``smallest``),
    or ``limit`` (the model's positions) when that is fewer. Attention reads the whole buffer under a
    mask, so a larger buffer costs a little per token; a new size costs a compile."""
    size = max(smallest, 1 << max(needed - 1, 0).bit_length())
    return max(needed, min(size, limit)) if limit is not None else size


def frozen_plan(model: torch.nn.Module, capacity: int) -> DecodePlan | None:
    """:func:`build_plan`, reusing the weights of a plan built earlier in the same frozen-weights
    block (:func:`weights_frozen`; up to :data:`PLANS_PER_MODEL` capacities per model). Returns a
    plan of its own (no states yet), so calls never share buffers."""
    epoch = frozen_epoch()
    plans = _PLANS.setdefault(model, {})
    key = (epoch, capacity)
    if key not in plans:
        plan = build_plan(model, capacity)
        if plan is None or epoch is None:
            return plan
        for old in [k for k in plans if k[0] != epoch]:  # an earlier block's promise has ended
            del plans[old]
        while len(plans) >= PLANS_PER_MODEL:
            del plans[next(iter(plans))]
        plans[key] = plan
    return dataclasses.replace(plans[key], states=[])


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


def compiled_decoder(plan: DecodePlan) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``step(tokens [B, 1], position [1]) -> logits [B, V]`` of a started plan, compiled.

    On a CPU: the step packaged by AOTInductor (:mod:`.packaged`: compiled once per layout into the
    user's cache folder, loaded in milliseconds by later processes, no Python between its kernels).
    Elsewhere: ``torch.compile`` of the step (:func:`compiled_step`)."""
    if plan.device.type == "cpu":
        batch = next(t for state in plan.states for t in state if isinstance(t, torch.Tensor)).shape[0]
        return packaged_step(plan.step_fn, plan.weights, plan.states, batch).bind(plan.weights, plan.states)
    step_fn = compiled_step(plan)
    return lambda tokens, position: plan.step(tokens, position, step_fn)


def compiled_step(plan: DecodePlan) -> StepFn:
    """The plan's step function compiled: ``step(weights, states, tokens, position) -> logits``.

    On a CPU it runs the AOTInductor package of the inputs' layout (:func:`.packaged.packaged_step`,
    looked up on each call: for tests and tools; :func:`compiled_decoder` binds one plan once). Elsewhere
    ``torch.compile`` of the step function, shared by every plan of that function: shapes are static
    (the plan's buffers have a fixed size), so each (batch, capacity) compiles once.
    """
    fn = plan.step_fn
    if plan.device.type == "cpu":
        def packaged(weights, states: list, tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
            return packaged_step(fn, weights, states, tokens.shape[0])(weights, states, tokens, position)

        return packaged
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=False, fullgraph=True)
    return _COMPILED[fn]
