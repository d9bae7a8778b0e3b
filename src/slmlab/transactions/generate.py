"""Next-transaction generation from the pretrained per-feature LM heads.

The pretraining objective makes flat position ``p`` predict token ``p + 1`` with head
``(p + 1) mod F``. A new transaction ``n`` is therefore filled field by field, ``f = 0 .. F-1``:
the distribution of field ``f`` is head ``f`` read at position ``n*F + f - 1`` (for ``f = 0``:
the previous transaction's last position, the cross-transaction step), and the chosen id is written
into the window before the next field is read. The backbone is causal, so the fields not yet
chosen (held as MASK) cannot influence the positions that are read.

Placement: the history is laid out as in training windows, newest transaction at ``t = T - 1`` of a
``T = max_transactions`` window, left padded; when the history already fills the window, its oldest
transactions are dropped. Each field costs one backbone pass over the whole window (naive recompute,
no cache): ``F`` passes of ``T*F`` tokens per new transaction, a few ms for ``lfm2_tiny``.

Ids that the fitted schema never assigned (a vocabulary with fewer distinct training values than its
``top_k``, quantile bins lost to duplicate edges) are never produced. Special ids: PAD (0) and MASK (1)
are never produced. UNK (2, "a value outside the fitted
vocabulary") is never produced either: it names no value a reader could act on. NONE (3, "not
applicable", e.g. no device on a card-present payment) is a real state and is kept. The excluded ids
get probability zero and the rest are renormalised, so reported probabilities are those of the
distribution actually sampled from (at temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .data.schema import MASK, PAD, UNK
from .model import TransactionEncoder, encoder_of, txn_mask_from

EXCLUDED_IDS = (PAD, MASK, UNK)


def _fitted(enc: TransactionEncoder):
    fitted = enc.config.fitted_schema
    if fitted is None:
        raise ValueError("the model has no fitted schema (schema.fitted.json), so generated ids cannot be decoded;"
                         " use a checkpoint pretrained on a bank (slmlab transactions pretrain)")
    return fitted


def _fixed_ids(enc: TransactionEncoder, fixed: dict[str, int] | None) -> dict[int, int]:
    """``feature name -> id`` validated into ``feature index -> id``."""
    out = {}
    for name, token in (fixed or {}).items():
        if name not in enc.feature_names:
            raise ValueError(f"fixed field {name!r} is not a feature; use one of {enc.feature_names}")
        f = enc.feature_names.index(name)
        v = enc.embedding.vocab_sizes[f]
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < v or token in (PAD, MASK):
            raise ValueError(f"fixed id of {name!r} must be an int in [2, {v}) (not PAD/MASK), got {token!r}")
        out[f] = token
    return out


def _window(enc: TransactionEncoder, history: torch.Tensor, txn_mask: torch.Tensor | None,
            n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` copies of the history in a ``max_transactions`` window with a new MASK row at the end:
    ids ``[n, T, F]`` and transaction mask ``[n, T]``."""
    F = enc.embedding.num_features
    if history.dim() == 2:
        history = history[None]
        txn_mask = None if txn_mask is None else txn_mask.reshape(1, -1)
    if history.dim() != 3 or history.shape[0] != 1 or history.shape[-1] != F:
        raise ValueError(f"history must be one customer's ids [T, {F}] or [1, T, {F}], got {tuple(history.shape)}")
    if history.dtype.is_floating_point:
        raise ValueError(f"history must hold integer ids, got {history.dtype}")
    mask = txn_mask_from(history, txn_mask)
    if not bool(mask.any()):
        raise ValueError("history has no transactions; give at least one real (non-PAD) transaction")
    T = enc.config.max_transactions
    ids, mask = history[0].long(), mask[0].bool()
    new = torch.full((1, F), MASK, dtype=torch.long, device=ids.device)
    ids = torch.cat([ids, new])[-T:]
    mask = torch.cat([mask, mask.new_ones(1)])[-T:]
    pad = T - len(ids)
    ids = torch.cat([ids.new_full((pad, F), PAD), ids])
    mask = torch.cat([mask.new_zeros(pad), mask])
    ids = torch.where(mask[:, None], ids, torch.full_like(ids, PAD))
    return ids[None].repeat(n, 1, 1), mask[None].repeat(n, 1)


def _field_logits(enc: TransactionEncoder, ids: torch.Tensor, mask: torch.Tensor, f: int) -> torch.Tensor:
    """Head ``f``'s logits ``[n, V_f]`` for field ``f`` of the last transaction, specials excluded."""
    F = ids.shape[-1]
    pos = (ids.shape[1] - 1) * F + f - 1
    hidden = enc.backbone_forward(ids, mask)[:, pos]
    logits = enc.lm_heads.logits(hidden, f).float()
    logits[:, list(EXCLUDED_IDS)] = float("-inf")
    fitted = enc.config.fitted_schema
    if fitted is not None:  # ids the fit never assigned name no value
        logits[:, fitted.num_assigned(f):] = float("-inf")
    return logits


@torch.no_grad()
def next_transaction_topk(model, history: torch.Tensor, fixed: dict[str, int] | None = None, k: int = 5,
                          txn_mask: torch.Tensor | None = None) -> list[list[tuple[int, float]]]:
    """Per field of the next transaction, the ``k`` most likely ids with their probabilities.

    Fields are chosen greedily in order (each field conditioned on the argmax of the earlier ones),
    except fields in ``fixed``, which are forced to the given id; their top-k is still reported.

    Args:
        model: a :class:`TransactionEncoder` or a fine-tuned model holding one (see :func:`encoder_of`).
        history: ``[T, F]`` or ``[1, T, F]`` ids of one customer, oldest first (left padding allowed).
        fixed: ``feature name -> id`` to force.
        k: ids reported per field.
        txn_mask: ``[T]`` / ``[1, T]`` (True = real); default: rows with any non-PAD id.
    Returns:
        ``F`` lists of ``(id, probability)``, probability descending (PAD, MASK and UNK excluded,
        the rest renormalised; fewer than ``k`` for a feature with fewer real ids).
    """
    enc = encoder_of(model)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k!r}")
    forced = _fixed_ids(enc, fixed)
    device = enc.embedding.tables.weight.device
    ids, mask = _window(enc, history.to(device), None if txn_mask is None else txn_mask.to(device), 1)
    was = enc.training
    enc.eval()
    out = []
    try:
        for f in range(ids.shape[-1]):
            probs = torch.softmax(_field_logits(enc, ids, mask, f), -1)[0]
            p, i = probs.topk(min(k, int((probs > 0).sum())))
            out.append([(int(a), float(b)) for a, b in zip(i, p)])
            ids[0, -1, f] = forced.get(f, int(probs.argmax()))
    finally:
        enc.train(was)
    return out


@dataclass(frozen=True)
class NextTransactions:
    """Generated transactions: ``ids`` ``[n_samples, F]`` and ``rows``, each a ``feature name ->
    readable value`` dict (``FittedSchema.decode``)."""

    ids: torch.Tensor
    rows: list[dict[str, str]]


def _sample(logits: torch.Tensor, temperature: float, top_k: int | None,
            generator: torch.Generator | None) -> torch.Tensor:
    """One id per row of ``logits [n, V]`` (``temperature = 0``: argmax)."""
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), -1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def generate_next_transaction(model, ids: torch.Tensor, n_samples: int = 1, temperature: float = 1.0,
                              top_k: int | None = None, fixed: dict[str, int] | None = None,
                              generator: torch.Generator | None = None) -> NextTransactions:
    """Sample ``n_samples`` next transactions after one customer's history.

    ``F`` sequential head steps per sample (the samples run as one batch); field ``f`` is sampled
    from head ``f`` at the position before it, at ``temperature`` (0 = argmax, deterministic),
    optionally restricted to the ``top_k`` most likely ids; fields in ``fixed`` are forced.

    Args:
        model: a :class:`TransactionEncoder` or a fine-tuned model holding one.
        ids: ``[T, F]`` or ``[1, T, F]`` history ids (left padding allowed).
        n_samples: transactions to draw.
        temperature: softmax temperature (``>= 0``).
        top_k: sample only among the ``top_k`` most likely ids (None = all).
        fixed: ``feature name -> id`` to force.
        generator: a ``torch.Generator`` for reproducible sampling (on the model's device).
    Returns:
        :class:`NextTransactions`.
    """
    enc = encoder_of(model)
    fitted = _fitted(enc)
    if n_samples < 1:
        raise ValueError(f"n_samples must be >= 1, got {n_samples!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k!r}")
    forced = _fixed_ids(enc, fixed)
    device = enc.embedding.tables.weight.device
    window, mask = _window(enc, ids.to(device), None, n_samples)
    was = enc.training
    enc.eval()
    try:
        for f in range(window.shape[-1]):
            if f in forced:
                window[:, -1, f] = forced[f]
                continue
            window[:, -1, f] = _sample(_field_logits(enc, window, mask, f), float(temperature), top_k, generator)
    finally:
        enc.train(was)
    out = window[:, -1].clone()
    rows = [{name: fitted.decode(f, int(out[s, f])) for f, name in enumerate(enc.feature_names)}
            for s in range(n_samples)]
    return NextTransactions(out, rows)
