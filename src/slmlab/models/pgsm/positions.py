"""Where PGSM retrieves: the seed's resolution order, vectorised and generalised to ``[B, Q]``.

Order (seed 001): explicit ``retrieval_positions`` > the last ``query_token_id`` of each row (when
``auto_retrieve_on_query_token``; a row without one uses its last token) > the last token (when
``retrieve_at_last_token_if_unspecified``) > no retrieval. During cached decoding the last-token rule
applies to each forward call, and query-token detection retrieves only at query tokens (see
``docs/pgsm.md``).
"""

from __future__ import annotations

import torch


def validate_retrieval_positions(positions, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """Check explicit positions and return them as ``[B, Q]`` int64 (``-1`` = none).

    Args:
        positions: ``[B]`` or ``[B, Q]`` integer column indices into the sequence.
        batch: ``B``.
        length: every position must be in ``[-1, length)``: past + current tokens without a cache,
            ``block_size`` when decoding through a cache (later calls reach the later positions).
    """
    positions = torch.as_tensor(positions, device=device)
    if positions.is_floating_point() or positions.dtype == torch.bool:
        raise ValueError(f"retrieval_positions must be an integer tensor, got dtype {positions.dtype}")
    if positions.dim() == 1:
        positions = positions[:, None]
    if positions.dim() != 2 or positions.shape[0] != batch:
        raise ValueError(f"retrieval_positions must have shape [batch] or [batch, Q] with batch={batch}, got {tuple(positions.shape)}")
    positions = positions.long()
    if positions.numel():
        lo, hi = int(positions.min()), int(positions.max())
        if lo < -1 or hi >= length:
            raise ValueError(
                f"retrieval_positions must lie in [-1, {length}) (-1 pads a row; without a cache a position must fall on"
                f" one of the {length} input tokens, with one below block_size), got {lo if lo < -1 else hi}"
            )
        ordered = positions.sort(dim=1).values
        if bool(((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any()):
            raise ValueError("retrieval_positions repeats a position within a row; list each position once (pad with -1)")
    return positions


def last_query_token_positions(
    input_ids: torch.Tensor, query_token_id: int, real: torch.Tensor | None, fallback_last: bool = True
) -> torch.Tensor:
    """The column of the last ``query_token_id`` per row; a row without one gets its last column
    (the seed's rule) when ``fallback_last``, else ``-1``.

    Args:
        input_ids: ``[B, T]``.
        real: ``[B, T]`` bool (padding never counts as a query token) or None.
        fallback_last: use the last column for rows without a query token.
    Returns:
        ``[B, 1]`` int64 columns in ``[0, T)`` (or ``-1``).
    """
    t = input_ids.shape[1]
    matches = input_ids.eq(int(query_token_id))
    if real is not None:
        matches = matches & real
    cols = torch.arange(t, device=input_ids.device).expand_as(matches)
    last = torch.where(matches, cols, torch.full_like(cols, -1)).amax(dim=1, keepdim=True)
    return torch.where(last >= 0, last, torch.full_like(last, t - 1 if fallback_last else -1))


def resolve_retrieval_positions(
    config,
    explicit,
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    past: int,
    batch: int,
    t: int,
    device: torch.device,
    limit: int | None = None,
) -> torch.Tensor | None:
    """The ``[B, Q]`` absolute retrieval columns of one forward call, or None (no retrieval).

    Args:
        config: a :class:`PGSMConfig`.
        explicit: the caller's ``retrieval_positions`` (``[B]``/``[B, Q]``) or None.
        input_ids: ``[B, T]`` current tokens (needed by query-token detection) or None.
        attention_mask: ``[B, past + T]`` or None.
        past, batch, t: cached tokens, ``B``, ``T``.
        limit: upper bound (exclusive) of explicit positions (default ``past + T``).
    """
    if not config.use_sparse_retrieval:
        return None
    if explicit is not None:
        return validate_retrieval_positions(explicit, batch, past + t if limit is None else limit, device)
    if config.auto_retrieve_on_query_token and config.query_token_id is not None:
        if input_ids is None:
            raise ValueError("auto_retrieve_on_query_token needs input_ids (got inputs_embeds); pass retrieval_positions")
        real = None if attention_mask is None else attention_mask[:, -t:].bool()
        # the first call (training, prefill) follows the seed; later cached calls (decoding) retrieve
        # only at query tokens, as the model was trained to
        cols = last_query_token_positions(input_ids, config.query_token_id, real, fallback_last=past == 0)
        return torch.where(cols >= 0, cols + past, cols)
    if config.retrieve_at_last_token_if_unspecified:
        return torch.full((batch, 1), past + t - 1, dtype=torch.long, device=device)
    return None
