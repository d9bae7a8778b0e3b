"""Continuous batching over a family's own cache: rows join and leave a decoding batch between steps.

Requests admitted at the same step are prefilled together (one forward of their left-padded
prompts, one new :class:`~slmlab.layers.cache.ModelCache`), then join the running batch: the two
caches are aligned on the right by left-padding the shorter one and concatenated on the batch axis,
and the batch's ``attention_mask`` marks the padding (every family derives positions from that mask,
so a padded row decodes exactly as it would alone). A finished
or abandoned row leaves by ``ModelCache.reorder_cache``; leading columns that no remaining row
uses are cut off, so the batch never grows longer than its longest live row.

:class:`DecodeBatch` is the shared :class:`~slmlab.generation.Decoder` pinned to the model-forward
path; the cache does the surgery (``ModelCache.join``, ``ModelCache.drop_leading``: each state pads,
joins and trims itself, or refuses). :func:`batching_refusal` runs a small join-and-decode
probe against separate decoding at start-up; a family that fails it is served one request at a time.
"""

from __future__ import annotations

import torch

from ..generation import Decoder
from ..generation.decoder import Sampler
from ..layers.cache import CannotBatch

__all__ = ["CannotBatch", "DecodeBatch", "batching_refusal"]


class DecodeBatch(Decoder):
    """The server's rows decoding together: a :class:`~slmlab.generation.Decoder` on the model-forward
    path, whose rows join (:meth:`~slmlab.generation.Decoder.join`) and leave
    (:meth:`~slmlab.generation.Decoder.keep`) between steps, picking tokens with ``sampler``.

    Args:
        model: an slmlab causal LM in eval mode.
        sampler: ``logits [B, V] -> tokens [B]`` (each row with its own settings; greedy by default).
    """

    def __init__(self, model, sampler: Sampler | None = None) -> None:
        super().__init__(model, sampler=sampler, use_plan=False)


def batching_refusal(model, tolerance: float = 1e-3) -> str | None:
    """Why ``model`` cannot be served by continuous batching, or None when it can.

    The probe: three prompts (5, 9 and 3 tokens) decoded alone, against the same rows in one
    :class:`DecodeBatch`: the first alone, then the other two prefilled together (left-padded) and
    joined after its first step (so the batch is padded too); the longest leaves before the last
    step (so leading columns are cut). Any join error, or logits that differ from decoding alone by
    more than ``tolerance``, refuses batching.
    """
    vocab = model.config.vocab_size
    limit = model.max_positions()
    if limit is not None and limit < 16:
        return f"the context ({limit} positions) is too short for the batching probe"
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (5, 9, 3)]
    feeds = torch.randint(0, vocab, (3, 4), generator=gen).to(model.device)

    def scripted(rows: list[int], seen: list[list[torch.Tensor]]) -> Sampler:
        """Record the logits of each of ``rows`` in ``seen`` and pick the row's next feed (the last
        pick of a row is never fed)."""
        def pick(logits: torch.Tensor) -> torch.Tensor:
            for j, i in enumerate(rows):
                seen[i].append(logits[j])
            return torch.stack([feeds[i, min(len(seen[i]), feeds.shape[1]) - 1] for i in rows])
        return pick

    alone, batched, rows = [[], [], []], [[], [], []], []
    try:
        for i, prompt in enumerate(prompts):
            solo = DecodeBatch(model, scripted([i], alone)).prefill([prompt])
            for _ in range(feeds.shape[1] + 1):
                solo.step()
        batch = DecodeBatch(model, scripted(rows, batched))

        def join(group: list[int]) -> None:
            prefilled = DecodeBatch(model, scripted(group, batched)).prefill([prompts[i] for i in group])
            prefilled.step()
            batch.join(prefilled)
            rows.extend(group)

        join([0]), batch.step(), join([1, 2]), batch.step(), batch.step()
        batch.keep([0, 2])
        rows.remove(1)
        batch.step()
    except (CannotBatch, ValueError, TypeError, RuntimeError) as err:
        return f"its cache cannot be joined into a padded batch ({err})"
    worst = max(float((a - b).abs().max()) for i in range(3) for a, b in zip(batched[i], alone[i]))
    if worst > tolerance:
        return f"a padded batch decodes differently from a single row (max |logit difference| {worst:.2e})"
    return None
