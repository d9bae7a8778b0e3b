"""The one steppable decoder: ``prefill`` once, then ``step`` one token per row while not ``done``.

:func:`generate`, the chat session (:mod:`.chat`), the server's lone requests and its continuous
batch all decode through :class:`Decoder`. No logits processors, no stopping-criteria objects, no
per-step re-slicing of the whole prompt: a step costs one forward of one token (through the model's
cache or the family's decode plan, :mod:`.loop`) plus a sampling step on the last logits.
``transformers``' ``generate()`` works too; this is the fast path the CLI uses.

Stopping is a value, never an exception: :attr:`Decoder.done` turns True when every row has produced
a stop token or the token limit is reached, and a caller that stops earlier (a stop string, a client
gone away, another request waiting) simply takes no further step. That costs nothing: a step feeds
the previous step's token first, so the last token picked is never run through the model for nothing.
Rows of the model-forward path can join and leave between steps (:meth:`Decoder.join`,
:meth:`Decoder.keep`: continuous batching over the cache's own batch surgery).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F

from ..layers.cache import CannotBatch
from .loop import COMPILED_PLAN, MODEL_FORWARD, PLAN, plan_decoder, plan_refusal, weights_frozen
from .sampling import SamplingConfig, sample_next

logger = logging.getLogger("slmlab.generation")

Sampler = Callable[[torch.Tensor], torch.Tensor]  # logits [B, V] -> tokens [B]


class GeneratedTokens(torch.Tensor):
    """The ``[B, T + n]`` tensor :func:`generate` returns, which also says how it was decoded.

    It is an ordinary tensor everywhere (indexing, ``tolist``, ``torch.equal``; operations on it
    return plain tensors); ``decode_path`` is ``"plan"``, ``"compiled plan"`` or ``"model forward"``,
    or None when nothing was decoded (``max_new_tokens=0``).
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # ops return plain tensors
    decode_path: str | None = None


class Decoder:
    """Decodes a batch of rows: :meth:`prefill` the prompts, then each :meth:`step` picks one token
    per row (after feeding the previous step's tokens); iterating steps until :attr:`done`.

    Args:
        model: any slmlab causal LM (``forward(input_ids, attention_mask, cache, use_cache)``).
        sampling: how tokens are picked (greedy by default).
        generator: the random generator ``sampling`` draws from.
        sampler: ``logits [B, V] -> tokens [B]``, used instead of ``sampling`` (per-row settings).
        stop_tokens: a row stops after producing one of these; a stopped row repeats its stop token.
        use_plan: step through the family's decode plan when it has one and the prefill allows it
            (no padding, no family inputs, a token limit); False always steps through ``model.forward``.
        compile: compile the plan's step (ignored without a plan): on a CPU the AOTInductor package
            of :mod:`.packaged`, cached on disk; elsewhere ``torch.compile``.
    Attributes:
        path: the decode path chosen at prefill: ``"plan"``, ``"compiled plan"`` or ``"model forward"``
            (None before a prefill, or when ``max_new_tokens=0``).
        logits: the next-token logits ``[B, V]`` the next step picks from, or None when that step
            must first feed :attr:`last`.
        last: ``[B]`` the tokens picked by the last step.
    """

    def __init__(self, model: torch.nn.Module, sampling: SamplingConfig | None = None, *,
                 generator: torch.Generator | None = None, sampler: Sampler | None = None,
                 stop_tokens: Iterable[int] = (), use_plan: bool = True, compile: bool = False) -> None:
        self.model = model
        cfg = sampling or SamplingConfig()
        self.sample: Sampler = sampler or (lambda logits: sample_next(logits, cfg, generator))
        self.stop_tokens = sorted(set(int(s) for s in stop_tokens))
        self.use_plan, self.compile = use_plan, compile
        self.max_new_tokens: int | None = None
        self._clear()

    def _clear(self) -> None:
        """No rows (before a prefill, or after every row left)."""
        self.cache = self.mask = self.logits = self.last = self.stopped = self.path = None
        self.rows = self.steps = self.fed = 0
        self._stop = self._plan_step = self._step_kwargs = None

    def __len__(self) -> int:
        return self.rows

    @property
    def done(self) -> bool:
        """Whether no step is left: no rows, ``max_new_tokens`` picked, or every row has stopped."""
        if not self.rows or (self.max_new_tokens is not None and self.steps >= self.max_new_tokens):
            return True
        return bool(self.stop_tokens) and bool(self.stopped.all())

    def __iter__(self) -> Iterator[torch.Tensor]:
        """:meth:`step` until :attr:`done`."""
        while not self.done:
            yield self.step()

    @torch.inference_mode()
    def prefill(self, prompts: torch.Tensor | list[list[int]], attention_mask: torch.Tensor | None = None, *,
                max_new_tokens: int | None = None, model_kwargs: dict | None = None,
                step_kwargs: Callable[[int], dict] | None = None, next_tokens: torch.Tensor | None = None) -> Decoder:
        """Run the prompts through the model (one forward) and choose the decode path; returns ``self``.

        Args:
            prompts: ``input_ids [B, T]`` (left-pad a batch and pass ``attention_mask``), or token-id
                lists, left-padded here (their mask reaches the model only when some row is padded).
            max_new_tokens: the most tokens :meth:`step` picks (None: no limit, and no decode plan).
            model_kwargs: extra keyword arguments for the prefill (e.g. PGSM's ``retrieval_positions``).
            step_kwargs: ``step -> kwargs`` for each decoding forward (family hooks; counts from 0).
            next_tokens: ``[B]`` tokens already chosen to follow the prompts (a row continued from
                elsewhere): the first step feeds them instead of picking from the prefill's logits.
        """
        if max_new_tokens is not None and max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        self._clear()
        if isinstance(prompts, torch.Tensor):
            input_ids, self.mask, seen = prompts, attention_mask, attention_mask
        else:
            input_ids, self.mask = _left_padded(prompts, self.model.device)
            seen = None if bool(self.mask.all()) else self.mask  # unpadded: the model sees no mask, the steps do
        self.rows, self.max_new_tokens = input_ids.shape[0], max_new_tokens
        self.stopped = torch.zeros(self.rows, dtype=torch.bool, device=input_ids.device)
        self._stop = torch.tensor(self.stop_tokens, dtype=torch.long, device=input_ids.device)
        if max_new_tokens == 0:
            return self
        out = self.model(input_ids=input_ids, attention_mask=seen, use_cache=True, logits_to_keep=1, **(model_kwargs or {}))
        self.cache, self.logits, self._step_kwargs = out.cache, out.logits[:, -1], step_kwargs
        self._choose_path(input_ids.shape[1], seen, model_kwargs)
        if next_tokens is not None:
            self.last, self.logits = next_tokens.reshape(-1).to(input_ids.device), None
        return self

    def _choose_path(self, prompt_len: int, mask: torch.Tensor | None, model_kwargs: dict | None) -> None:
        reason = plan_refusal(self.use_plan, mask, model_kwargs, self._step_kwargs)
        if reason is None and self.max_new_tokens is None:
            reason = "no token limit"
        self.path = MODEL_FORWARD
        if reason is None:
            self._plan_step = plan_decoder(self.model, self.cache, prompt_len, self.max_new_tokens, self.compile)
            if self._plan_step is None:
                reason = "the model has no decode plan for this call (family, half precision or length)"
            else:
                self.path = COMPILED_PLAN if self.compile else PLAN
        limit = "no limit of" if self.max_new_tokens is None else f"{self.max_new_tokens}"
        logger.debug("decode: %s new tokens, batch %d, through the %s%s", limit, self.rows, self.path,
                     f" ({reason})" if reason else "")

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """Feed the previous step's tokens (unless the prefill's logits are still unread), then pick
        the next token of every row: ``[B]`` int64.

        Raises:
            RuntimeError: the decoder is :attr:`done`.
        """
        if self.done:
            raise RuntimeError("the decoder is done: no rows left, or every row has stopped or reached max_new_tokens")
        if self.logits is None:
            self.logits = self._advance(self.last[:, None])
        nxt = self.sample(self.logits)
        if self.stop_tokens:
            if self.steps:
                nxt = torch.where(self.stopped, self.last, nxt)
            self.stopped = self.stopped | torch.isin(nxt, self._stop)
        self.last, self.logits = nxt, None
        self.steps += 1
        return nxt

    def _advance(self, tokens: torch.Tensor) -> torch.Tensor:
        """Run ``tokens [B, 1]`` through the decode path: next-token logits ``[B, V]``."""
        step, self.fed = self.fed, self.fed + 1
        if self._plan_step is not None:
            return self._plan_step(tokens, step)
        if self.mask is not None:
            self.mask = F.pad(self.mask, (0, 1), value=1)
        extra = self._step_kwargs(step) if self._step_kwargs is not None else {}
        out = self.model(input_ids=tokens, attention_mask=self.mask, cache=self.cache, use_cache=True, **extra)
        self.cache = out.cache
        return out.logits[:, -1]

    # -- rows joining and leaving (the model-forward path) ------------------------------------------
    def _full_mask(self) -> torch.Tensor:
        """``[B, S]`` the positions the cache holds, 1 = a real token (all real without a mask)."""
        if self.mask is not None:
            return self.mask
        return torch.ones(self.rows, self.cache.seen_tokens, dtype=torch.long, device=self.last.device)

    def _check_joinable(self) -> None:
        if self.rows and (self._plan_step is not None or self.logits is not None):
            raise CannotBatch("only rows stepping through the model's forward, each with its next token picked, can"
                              " join or leave a batch")

    def join(self, other: Decoder) -> None:
        """Append ``other``'s rows after this decoder's (an empty decoder takes them over). Both step
        through the model's forward and have their next tokens picked (a step taken since the prefill,
        or ``next_tokens``); the shorter cache is left-padded to the longer one.

        Raises:
            CannotBatch: the rows cannot decode together; both decoders are then unchanged.
        """
        self._check_joinable()
        other._check_joinable()
        if not self.rows:
            self.cache, self.mask, self.last, self.stopped = other.cache, other._full_mask(), other.last, other.stopped
            self.rows, self.path, self._stop = other.rows, other.path, other._stop
            return
        ours, theirs = self._full_mask(), other._full_mask()
        width = max(self.cache.seen_tokens, other.cache.seen_tokens)
        pads = width - self.cache.seen_tokens, width - other.cache.seen_tokens
        self.cache.join(other.cache)
        self.mask = torch.cat((F.pad(ours, (pads[0], 0)), F.pad(theirs, (pads[1], 0))))
        self.last = torch.cat((self.last, other.last))
        self.stopped = torch.cat((self.stopped, other.stopped))
        self.rows += other.rows

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order); forget the leading positions no kept row uses."""
        self._check_joinable()
        if not rows:
            self._clear()
            return
        if rows == list(range(self.rows)):
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.last.device)
        self.cache.reorder_cache(index)
        mask, self.last, self.stopped = self._full_mask()[index], self.last[index], self.stopped[index]
        used = mask.any(0)
        lead = int(used.long().argmax()) if bool(used.any()) else 0
        if lead:
            self.cache.drop_leading(lead)
            mask = mask[:, lead:]
        self.mask, self.rows = mask, len(rows)


def _left_padded(prompts: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id lists left-padded to the longest: ``input_ids, attention_mask [B, T]`` on ``device``."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


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
    """Generate up to ``max_new_tokens`` after ``input_ids [B, T]`` (a :class:`Decoder` run to its end).

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
    decoder = Decoder(model, sampling, generator=generator, stop_tokens=stop_tokens, use_plan=use_plan, compile=compile)
    decoder.prefill(input_ids, attention_mask, max_new_tokens=max_new_tokens, model_kwargs=model_kwargs,
                    step_kwargs=step_kwargs)
    tokens = [input_ids]
    for nxt in decoder:
        tokens.append(nxt[:, None])
        if callback is not None:
            callback(nxt)
    out = torch.cat(tokens, dim=1).as_subclass(GeneratedTokens)
    out.decode_path = decoder.path
    return out
