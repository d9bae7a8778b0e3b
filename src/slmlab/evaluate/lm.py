"""Validation metrics: loss, perplexity, bits per byte, and accuracy on scored positions.

Labels follow the transformers convention (aligned with ``input_ids``; the prediction made at
position ``p`` is scored against ``labels[p + 1]``; -100 is not scored). Loss is the token-weighted
mean cross entropy in nats; perplexity ``exp(loss)``; bits per byte (tokenizer-independent, as in
Gao et al., The Pile, arXiv:2101.00027) ``loss / ln 2 / bytes_per_token``. Accuracy follows Zoology
(Arora et al., arXiv:2312.04927): per example the mean of ``argmax == label`` over its scored
positions, then the mean over examples; ``token_acc`` pools all scored positions; ``exact`` is the
fraction of examples with every scored position right; ``acc_by_group`` splits ``acc`` by the batch's
``group`` entry (sequence length or distance bucket) when the data provides it.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch
import torch.nn.functional as F


def family_forward_inputs(model) -> tuple[str, ...]:
    """The family's documented extra forward inputs; a model outside the registry may name its own in
    an ``extra_forward_inputs`` attribute (e.g. the joint-fusion fraud model's ``tabular``), else none."""
    from ..models.registry import get_family

    own = getattr(model, "extra_forward_inputs", None)
    if own is not None:
        return tuple(own)
    try:
        return tuple(get_family(model.config.model_type).extra_forward_inputs)
    except ValueError:
        return ()


def model_inputs(batch: dict, forward_inputs: Iterable[str], device: torch.device) -> dict:
    """The keyword arguments a model gets from a data batch: ids, mask, and the family's documented
    extra inputs (``Family.extra_forward_inputs``) when the batch carries them."""
    kwargs = {"input_ids": batch["input_ids"].to(device)}
    if batch.get("attention_mask") is not None:
        kwargs["attention_mask"] = batch["attention_mask"].to(device)
    for name in forward_inputs:
        if batch.get(name) is not None:
            kwargs[name] = batch[name].to(device)
    return kwargs


@torch.no_grad()
def evaluate_batches(
    model: torch.nn.Module,
    batches: Iterable[dict],
    forward_inputs: Iterable[str] = (),
    device: torch.device | str = "cpu",
    autocast=None,
    keep_rows: bool = False,
    progress: Callable[[int, int, float], None] | None = None,
) -> dict:
    """Loss / perplexity / accuracy of ``model`` over ``batches``.

    Args:
        model: a causal LM returning ``.logits [B, T, V]``.
        batches: dicts with ``input_ids [B, T]``, ``labels [B, T]`` (aligned), optional
            ``attention_mask``, ``group [B]`` and family extras.
        forward_inputs: names of family-specific inputs to pass through.
        device: where to run.
        autocast: a context-manager factory or None (fp32); the trainer and ``slmlab eval`` pass
            ``slmlab.train.precision.autocast_factory(device, precision)``, one choice for both.
        keep_rows: also return ``rows``: per example with a scored position, ``correct`` and
            ``scored`` counts (and ``group``), for confidence intervals over examples.
        progress: called after every batch with ``(batches done, the batch's input tokens, its
            seconds)``; ``slmlab eval`` draws its progress from it (:class:`slmlab.train.progress.Progress`).
    Returns:
        ``{"loss", "ppl", "tokens", "acc", "token_acc", "exact", "examples"}`` plus
        ``acc_by_group`` when batches carry ``group`` and ``rows`` when asked.
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    total_nll, total_tokens, correct_tokens = 0.0, 0, 0
    per_example: list[float] = []
    exact: list[bool] = []
    groups: dict[int, list[float]] = defaultdict(list)
    rows_out: dict[str, list[int]] = {"correct": [], "scored": [], "group": []}
    try:
        for done, batch in enumerate(batches, 1):
            start = time.perf_counter()
            ctx = autocast() if autocast is not None else nullcontext()
            with ctx:
                out = model(**model_inputs(batch, forward_inputs, device), use_cache=False)
            logits = out.logits[:, :-1].float()
            target = batch["labels"][:, 1:].to(device)
            scored = target != -100
            if progress is not None:
                mask = batch.get("attention_mask")
                progress(done, int(mask.sum()) if mask is not None else batch["input_ids"].numel(),
                         time.perf_counter() - start)
            if not scored.any():
                continue
            safe = target.clamp(min=0)
            nll = F.cross_entropy(logits.transpose(1, 2), safe, reduction="none")
            total_nll += float(nll[scored].sum())
            total_tokens += int(scored.sum())
            hit = (logits.argmax(-1) == safe) & scored
            correct_tokens += int(hit.sum())
            n_scored = scored.sum(-1)
            rows = n_scored > 0
            row_acc = (hit.sum(-1).float() / n_scored.clamp(min=1))[rows]
            per_example.extend(row_acc.tolist())
            exact.extend((hit.sum(-1) == n_scored)[rows].tolist())
            if keep_rows:
                rows_out["correct"].extend(hit.sum(-1)[rows].tolist())
                rows_out["scored"].extend(n_scored[rows].tolist())
                if batch.get("group") is not None:
                    rows_out["group"].extend(batch["group"].to(device)[rows].tolist())
            if batch.get("group") is not None:
                for g, a in zip(batch["group"].to(device)[rows].tolist(), row_acc.tolist()):
                    groups[int(g)].append(a)
    finally:
        model.train(was_training)
    if total_tokens == 0:
        raise ValueError("evaluation saw no scored positions (every label is -100 or the split is empty)")
    loss = total_nll / total_tokens
    result = {
        "loss": loss,
        "ppl": math.exp(min(loss, 700.0)),
        "tokens": total_tokens,
        "acc": sum(per_example) / len(per_example),
        "token_acc": correct_tokens / total_tokens,
        "exact": sum(exact) / len(exact),
        "examples": len(per_example),
    }
    if groups:
        result["acc_by_group"] = {g: sum(v) / len(v) for g, v in sorted(groups.items())}
    if keep_rows:
        result["rows"] = rows_out
    return result


def bits_per_byte(loss_nats_per_token: float, bytes_per_token: float | None) -> float | None:
    """``loss / ln 2 / bytes_per_token`` (None when the data has no byte length, e.g. synthetic tasks)."""
    if not bytes_per_token:
        return None
    return loss_nats_per_token / math.log(2) / bytes_per_token


def evaluate_source(
    model: torch.nn.Module,
    source,
    split: str = "validation",
    batch_size: int = 16,
    max_batches: int | None = None,
    forward_inputs: Iterable[str] = (),
    device: torch.device | str = "cpu",
    autocast=None,
    progress: Callable[[int, int, float], None] | None = None,
    sample: int | None = None,
) -> dict:
    """:func:`evaluate_batches` over ``source.eval_batches(split, ...)``, plus ``bits_per_byte`` for
    text corpora (from ``source.bytes_per_token(split)``); ``progress`` as in :func:`evaluate_batches`
    (:func:`count_eval_batches` is its total); ``sample``: a fixed seeded sample of that many rows
    (:meth:`~slmlab.data.sources.DataSource.eval_batches`)."""
    batches = (source.eval_batches(split, batch_size, max_batches) if sample is None
               else source.eval_batches(split, batch_size, max_batches, sample))  # duck-typed sources: 3 arguments
    result = evaluate_batches(model, batches, forward_inputs, device, autocast, progress=progress)
    bpb = bits_per_byte(result["loss"], source.bytes_per_token(split))
    if bpb is not None:
        result["bits_per_byte"] = bpb
    return result


def count_eval_batches(source, split: str = "validation", batch_size: int = 16, max_batches: int | None = None,
                       sample: int | None = None) -> int:
    """How many batches ``evaluate_source`` will run (a progress display's total): from the source's row
    count when it has one (:class:`~slmlab.data.sources.DataSource`), else one pass without the model."""
    if not hasattr(source, "n_eval_rows"):
        return sum(1 for _ in source.eval_batches(split, batch_size, max_batches))
    rows = source.n_eval_rows(split)
    rows = min(rows, int(sample)) if sample is not None else rows
    batches = -(-rows // batch_size)
    return batches if max_batches is None else min(batches, int(max_batches))
