"""The decode paths a :class:`~slmlab.generation.decoder.Decoder` steps through after its prefill.

Every family steps through its own ``forward`` and cache. Families with a decode plan
(:mod:`slmlab.generation.plan`; Lumen and LFM2) step through the plan instead when the batch has no
padding and no family inputs (:func:`plan_refusal`, :func:`plan_decoder`): the model's forward runs
the prompt, the plan runs each new token. ``compile=True`` runs the plan's step compiled: on a CPU
packaged ahead of time by AOTInductor (:mod:`.packaged`; tens of CPU-seconds the first time a layout
is met, then loaded from the user's cache folder in about a second by every later process),
elsewhere ``torch.compile``. A caller that holds :func:`~slmlab.layers.fused.frozen_weights` across
many calls (a server, a benchmark) has the plan's arranged weights built once (:func:`weights_frozen`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Iterator

import torch

from ..layers.fused import frozen_epoch, frozen_weights
from .packaged import packaged_step
from .plan import DecodePlan, StepFn

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


Advance = Callable[[torch.Tensor, int], torch.Tensor]  # (tokens [B, 1], step) -> next logits [B, V]


def plan_decoder(model: torch.nn.Module, cache, prompt_len: int, max_new_tokens: int, compile: bool) -> Advance | None:
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
