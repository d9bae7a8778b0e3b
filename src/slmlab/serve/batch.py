"""Continuous batching over a family's own cache: rows join and leave a decoding batch between steps.

Requests admitted at the same step are prefilled together (one forward of their left-padded
prompts, one new :class:`ModelCache`), then join the running batch: the two caches are aligned on
the right by left-padding the shorter one and
concatenated on the batch axis, and the batch's ``attention_mask`` marks the padding (every family
derives positions from that mask, so a padded row decodes exactly as it would alone). A finished
or abandoned row leaves by :meth:`ModelCache.reorder_cache`; leading columns that no remaining row
uses are cut off, so the batch never grows longer than its longest live row.

The cache does the surgery (:meth:`ModelCache.join`, :meth:`ModelCache.drop_leading`: each state
pads, joins and trims itself, or refuses). :func:`batching_refusal` runs a small join-and-decode
probe against separate decoding at start-up; a family that fails it is served one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..layers.cache import CannotBatch, ModelCache


@dataclass
class Prefilled:
    """Prompts run through the model together: ``cache``, ``mask [k, L]`` (1 = real token, left
    padding) and the next-token ``logits [k, V]``."""

    cache: ModelCache
    mask: torch.Tensor
    logits: torch.Tensor


class DecodeBatch:
    """The rows decoding together: one cache, its left-padding mask and each row's last token.

    Args:
        model: an slmlab causal LM in eval mode.
    """

    def __init__(self, model) -> None:
        self.model = model
        self.cache: ModelCache | None = None
        self.mask: torch.Tensor | None = None  # [B, S] int64, 1 = real token
        self.last: torch.Tensor | None = None  # [B] the token each row feeds next

    def __len__(self) -> int:
        return 0 if self.last is None else self.last.shape[0]

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> Prefilled:
        """Run prompts together, left-padded to the longest: their cache, mask and next-token logits."""
        device = self.model.device
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(device), mask.to(device)
        padded = bool((mask == 0).any())
        out = self.model(input_ids=ids, attention_mask=mask if padded else None, use_cache=True, logits_to_keep=1)
        return Prefilled(out.cache, mask, out.logits[:, -1])

    def join(self, rows: Prefilled, tokens: torch.Tensor) -> None:
        """Append prefilled rows (and the ``[k]`` tokens they feed next) after the current ones.

        Raises:
            CannotBatch: the caches cannot be joined; the batch is unchanged (as after any other error).
        """
        cache, seen = rows.cache, rows.cache.seen_tokens
        if self.cache is None:
            self.cache, self.mask, self.last = cache, rows.mask, tokens.reshape(-1)
            return
        width = max(self.cache.seen_tokens, seen)
        pad_a, pad_b = width - self.cache.seen_tokens, width - seen
        self.cache.join(cache)
        self.mask = torch.cat((F.pad(self.mask, (pad_a, 0)), F.pad(rows.mask, (pad_b, 0))))
        self.last = torch.cat((self.last, tokens.reshape(-1)))

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order); cut the leading columns no kept row uses."""
        if not rows:
            self.cache = self.mask = self.last = None
            return
        if rows == list(range(len(self))):
            return
        index = torch.tensor(rows, dtype=torch.long, device=self.last.device)
        self.cache.reorder_cache(index)
        self.mask, self.last = self.mask[index], self.last[index]
        used = self.mask.any(0)
        lead = int(used.long().argmax()) if bool(used.any()) else 0
        if lead:
            self.cache.drop_leading(lead)
            self.mask = self.mask[:, lead:]

    @torch.inference_mode()
    def step(self) -> torch.Tensor:
        """Feed every row's last token: next-token logits ``[B, V]``."""
        self.mask = F.pad(self.mask, (0, 1), value=1)
        out = self.model(input_ids=self.last[:, None], attention_mask=self.mask, cache=self.cache, use_cache=True)
        self.cache = out.cache
        return out.logits[:, -1]


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
    feeds = torch.randint(0, vocab, (3, 4), generator=gen)
    device = model.device
    feeds = feeds.to(device)
    try:
        alone = []
        for prompt, row in zip(prompts, feeds):
            solo = DecodeBatch(model)
            first = solo.prefill([prompt])
            solo.join(first, row[:1])
            steps = [first.logits[0]]
            for k in range(feeds.shape[1]):
                solo.last = row[k : k + 1].clone()
                steps.append(solo.step()[0])
            alone.append(steps)
        batch, rows, count, pairs = DecodeBatch(model), [], [0, 0, 0], []

        def join(group: list[int]) -> None:
            prefilled = batch.prefill([prompts[i] for i in group])
            pairs.extend((prefilled.logits[j], alone[i][0]) for j, i in enumerate(group))
            batch.join(prefilled, feeds[group, 0])
            rows.extend(group)

        def feed() -> None:
            batch.last = torch.stack([feeds[i, count[i]] for i in rows])
            out = batch.step()
            for j, i in enumerate(rows):
                count[i] += 1
                pairs.append((out[j], alone[i][count[i]]))

        join([0]), feed(), join([1, 2]), feed(), feed()
        batch.keep([0, 2])
        rows.remove(1)
        feed()
    except (CannotBatch, ValueError, TypeError, RuntimeError) as err:
        return f"its cache cannot be joined into a padded batch ({err})"
    worst = max(float((a - b).abs().max()) for a, b in pairs)
    if worst > tolerance:
        return f"a padded batch decodes differently from a single row (max |logit difference| {worst:.2e})"
    return None
