"""Decoding caches: a container of typed per-layer states.

Every family decodes through one :class:`ModelCache`. Each layer owns the entry at its index and
reads/updates only that entry; the state type says what it supports. ``generate()`` of transformers
and :mod:`slmlab.generation` both pass the same object back into ``forward(cache=...)``.

State types:
    * :class:`KVState`  – keys/values of an attention layer, in a buffer that grows by doubling
      (appending one token is O(1) amortised, no per-step ``torch.cat`` of the whole history).
    * :class:`ConvState` – the last ``kernel - 1`` inputs of a causal convolution (O(kernel) per step).
    * :class:`TensorState` – any fixed-size per-row tensors (running sums, last outputs, ...).

Rolling back (``crop``, which transformers' assisted and prompt-lookup decoding call after each
draft): :class:`KVState` always can; :class:`ConvState` can after ``activate_past_recording()``
(it then keeps the inputs it saw, as transformers' linear-attention layers do); a state that
summarises the whole past cannot, and :meth:`LayerState.crop_refusal` says why.

Batch surgery (continuous batching: rows join and leave a decoding batch between steps) is each
state's own: :meth:`LayerState.left_pad`, :meth:`LayerState.join` and
:meth:`LayerState.drop_leading` are abstract, so a new state type cannot be built without them, and
:meth:`LayerState.batch_refusal` says when a state cannot do them now. :class:`ModelCache` applies
them to every state at once (:meth:`ModelCache.join` aligns two caches and leaves both unchanged
when any state refuses).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch
import torch.nn.functional as F


class CannotBatch(ValueError):
    """A batch operation a state refuses, or two caches whose states cannot be joined (different
    types, shapes or frozen settings)."""


def join_rows(a: torch.Tensor | None, b: torch.Tensor | None, what: str) -> torch.Tensor | None:
    """The rows of ``a`` followed by those of ``b`` (batch on dim 0; ``b`` cast to ``a``'s dtype);
    None when both are None. Raises :class:`CannotBatch` naming ``what`` when only one is set or
    their other dimensions differ."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        raise CannotBatch(f"{what} is set in one cache only")
    if a.shape[1:] != b.shape[1:]:
        raise CannotBatch(f"{what} shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return torch.cat((a, b.to(a.dtype)))


def same_setting(a, b, what: str) -> None:
    """Raise :class:`CannotBatch` unless two states share a setting (a frozen window, a mode flag)."""
    if a != b:
        raise CannotBatch(f"{what} differs: {a!r} vs {b!r}")


class LayerState(ABC):
    """Base class: a per-layer state whose tensors all have the batch on dim 0.

    Every state implements the batch surgery a decoding batch needs (:meth:`left_pad`, :meth:`join`,
    :meth:`drop_leading`). They replace tensors and never write into them, so :meth:`snapshot` (a
    shallow copy of the fields) is enough to undo them.
    """

    def _tensor_names(self) -> list[str]:
        return [k for k, v in vars(self).items() if isinstance(v, torch.Tensor)]

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep/reorder batch rows (beam search reordering, batch selection)."""
        for name in self._tensor_names():
            setattr(self, name, getattr(self, name).index_select(0, index.to(getattr(self, name).device)))

    def repeat_batch(self, repeats: int) -> None:
        """Repeat every row ``repeats`` times (``generate(num_return_sequences>1)``)."""
        for name in self._tensor_names():
            setattr(self, name, getattr(self, name).repeat_interleave(repeats, dim=0))

    def crop_refusal(self) -> str | None:
        """Why :meth:`crop` cannot roll this state back, or None when it can."""
        return f"{type(self).__name__} summarises the whole past in fixed-size tensors, which cannot be rolled back"

    def crop(self, length: int) -> None:
        """Keep the first ``length`` tokens (``length`` < tokens seen)."""
        raise ValueError(f"{type(self).__name__} cannot be cropped: {self.crop_refusal()}")

    def activate_past_recording(self, recurrent_states_to_keep: int | None = None) -> None:
        """Keep what :meth:`crop` needs to roll back later tokens (a no-op for states that need nothing
        or cannot be rolled back). ``recurrent_states_to_keep`` (transformers >= 5.25 passes how many
        tokens a draft may roll back) is accepted and not needed: a state that can roll back keeps every
        input it sees while recording."""
        return None

    def stop_past_recording(self) -> None:
        """Drop what :meth:`activate_past_recording` kept (a no-op for states that keep nothing)."""
        return None

    def batch_refusal(self) -> str | None:
        """Why :meth:`left_pad`, :meth:`join` and :meth:`drop_leading` cannot run now, or None when they can."""
        return None

    def check_batchable(self) -> None:
        """Raise :class:`CannotBatch` with :meth:`batch_refusal`'s reason, if any."""
        reason = self.batch_refusal()
        if reason is not None:
            raise CannotBatch(f"{type(self).__name__}: {reason}")

    @abstractmethod
    def left_pad(self, n: int) -> None:
        """Act as if ``n`` padding positions (masked out, zero inputs) came before every row's tokens."""

    @abstractmethod
    def join(self, other: LayerState) -> None:
        """Append the rows of ``other`` (a state of the same type covering as many positions, after
        :meth:`left_pad`) after this state's rows. Raises :class:`CannotBatch` when they cannot be joined."""

    @abstractmethod
    def drop_leading(self, n: int) -> None:
        """Forget the ``n`` oldest positions (leading padding that no remaining row uses)."""

    def snapshot(self) -> dict:
        """The state's fields as they are now (tensors shared, not copied), for :meth:`restore`."""
        return dict(self.__dict__)

    def restore(self, snapshot: dict) -> None:
        """Return to a :meth:`snapshot` (undoing batch operations since, which never write into tensors)."""
        self.__dict__.clear()
        self.__dict__.update(snapshot)

    def held_tensors(self) -> list[torch.Tensor]:
        """The tensors this state holds, restricted to their filled part (what inference must keep)."""
        return [getattr(self, name) for name in self._tensor_names()]

    def numel(self) -> int:
        """Floats held (the filled part; :class:`KVState` counts the seen positions, not its spare capacity)."""
        return sum(t.numel() for t in self.held_tensors())

    def nbytes(self) -> int:
        """Bytes held (the filled part)."""
        return sum(t.numel() * t.element_size() for t in self.held_tensors())


class KVState(LayerState):
    """Keys and values ``[B, H_kv, S, D]`` of one attention layer.

    Stored in a buffer with spare capacity on the sequence axis; :meth:`update` writes the new
    step and returns views of the filled part. ``slots_per_token`` sequence slots hold one token
    (1 here; a subclass that stores several entries per token says how many).
    """

    slots_per_token = 1

    def __init__(self) -> None:
        self.keys: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.length = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``k, v`` (``[B, H_kv, T, D]``) and return all keys/values so far."""
        t = k.shape[2]
        end = self.length + t
        if self.keys is None or end > self.keys.shape[2]:
            capacity = max(64, 1 << (end - 1).bit_length())
            keys = k.new_empty(k.shape[0], k.shape[1], capacity, k.shape[3])
            values = v.new_empty(v.shape[0], v.shape[1], capacity, v.shape[3])
            if self.keys is not None:
                keys[:, :, : self.length] = self.keys[:, :, : self.length]
                values[:, :, : self.length] = self.values[:, :, : self.length]
            self.keys, self.values = keys, values
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def crop_refusal(self) -> str | None:
        return None

    def crop(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))

    def left_pad(self, n: int) -> None:
        """Zero keys/values for ``n`` padding tokens before the filled part (the mask hides them)."""
        if self.keys is None or n <= 0:
            return
        pad = (0, 0, n * self.slots_per_token, 0)
        self.keys = F.pad(self.keys[:, :, : self.length], pad)
        self.values = F.pad(self.values[:, :, : self.length], pad)
        self.length = self.keys.shape[2]

    def join(self, other: KVState) -> None:
        if (self.keys is None) != (other.keys is None):
            raise CannotBatch(f"{type(self).__name__} holds keys in one cache and not the other")
        if self.keys is None:
            return
        name = type(self).__name__
        keys = join_rows(self.keys[:, :, : self.length], other.keys[:, :, : other.length], f"{name}.keys")
        values = join_rows(self.values[:, :, : self.length], other.values[:, :, : other.length], f"{name}.values")
        self.keys, self.values, self.length = keys, values, keys.shape[2]

    def drop_leading(self, n: int) -> None:
        if self.keys is None or n <= 0:
            return
        cut = n * self.slots_per_token
        self.keys, self.values = self.keys[:, :, cut:], self.values[:, :, cut:]
        self.length -= cut

    def held_tensors(self) -> list[torch.Tensor]:
        """The keys and values of the seen positions (not the spare capacity), plus any other tensor
        a subclass keeps (e.g. a running state)."""
        out = [getattr(self, n) for n in self._tensor_names() if n not in ("keys", "values")]
        if self.keys is not None:
            out += [self.keys[:, :, : self.length], self.values[:, :, : self.length]]
        return out


class ConvState(LayerState):
    """The last ``kernel - 1`` inputs ``window [B, C, K-1]`` of a causal depthwise convolution.

    After :meth:`activate_past_recording` it also keeps ``history [B, C, K-1 + n]``: the window at
    that moment followed by the ``n`` inputs seen since, so :meth:`crop` can restore the window of
    any earlier token (what assisted decoding needs after rejecting drafted tokens). ``seen`` counts
    the positions it has covered (padding included).
    """

    def __init__(self) -> None:
        self.window: torch.Tensor | None = None
        self.history: torch.Tensor | None = None
        self.recording = False
        self.seen = 0

    def keep(self, full: torch.Tensor, size: int) -> None:
        """Store the last ``size`` (= K-1) columns of ``full [B, C, size + T]`` (the previous window
        followed by this call's ``T`` inputs) as the window, and the new inputs in the history when
        recording."""
        self.window = full[..., full.shape[-1] - size :]
        if self.recording:
            self.history = full if self.history is None else torch.cat((self.history, full[..., size:]), dim=-1)
        self.seen += full.shape[-1] - size

    def activate_past_recording(self, recurrent_states_to_keep: int | None = None) -> None:
        self.recording = True

    def stop_past_recording(self) -> None:
        self.recording, self.history = False, None

    def crop_refusal(self) -> str | None:
        if self.recording:
            return None
        return "a convolution state keeps only its last K-1 inputs; call activate_past_recording() before the tokens to roll back"

    def crop(self, length: int) -> None:
        remove = self.seen - max(length, 0)
        if remove <= 0 or self.window is None:
            return
        if not self.recording:
            raise ValueError(f"ConvState cannot be cropped: {self.crop_refusal()}")
        size = self.window.shape[-1]
        kept = self.history.shape[-1] - remove
        if kept < size:
            raise ValueError(
                f"cannot roll a convolution state back by {remove} tokens: only {self.history.shape[-1] - size} were"
                " recorded since activate_past_recording()"
            )
        self.history = self.history[..., :kept]
        self.window = self.history[..., kept - size :]
        self.seen -= remove

    def batch_refusal(self) -> str | None:
        if self.recording:
            return "it records its inputs for crop() (activate_past_recording); call stop_past_recording() first"
        return None

    def left_pad(self, n: int) -> None:
        """Count ``n`` more positions; the window is unchanged (padded inputs are zeros, as an empty window is)."""
        self.check_batchable()
        self.seen += n

    def join(self, other: ConvState) -> None:
        self.check_batchable()
        other.check_batchable()
        self.window = join_rows(self.window, other.window, "ConvState.window")
        self.seen = max(self.seen, other.seen)

    def drop_leading(self, n: int) -> None:
        self.check_batchable()
        self.seen = max(self.seen - n, 0)


class TensorState(LayerState):
    """A bag of named per-row tensors for recurrent summaries (set attributes freely).

    Every tensor attribute holds one entry per row and no sequence axis, and every other attribute
    is a setting that rows decoding together share: so padding and dropped leading positions leave
    it unchanged, and a join concatenates the tensors and requires equal settings.
    """

    def left_pad(self, n: int) -> None:
        self.check_batchable()

    def join(self, other: TensorState) -> None:
        self.check_batchable()
        other.check_batchable()
        name = type(self).__name__
        joined = {}
        for key in sorted(set(self.__dict__) | set(other.__dict__)):
            a, b = getattr(self, key, None), getattr(other, key, None)
            if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
                joined[key] = join_rows(a, b, f"{name}.{key}")
            else:
                same_setting(a, b, f"{name}.{key}")
        self.__dict__.update(joined)

    def drop_leading(self, n: int) -> None:
        self.check_batchable()


class ModelCache:
    """Per-layer decoding states for one model, plus the number of tokens seen.

    Args:
        states: one :class:`LayerState` per layer, in layer order.
        extra: model-level states (e.g. a running cumulative sum), by name.
    """

    is_compileable = False  # shapes grow with the sequence; slmlab.generation's decode plans are the fixed-size path

    def __init__(self, states: list[LayerState], extra: dict[str, LayerState] | None = None) -> None:
        self.layers = list(states)
        self.extra = dict(extra or {})
        self.seen_tokens = 0
        self.recording_past = False
        self.recurrent_states_to_keep = 0

    def __getitem__(self, idx: int) -> LayerState:
        return self.layers[idx]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self) -> Iterator[LayerState]:
        return iter(self.layers)

    def _all_states(self) -> list[LayerState]:
        return self.layers + list(self.extra.values())

    def advance(self, tokens: int) -> None:
        """Count ``tokens`` more as seen (the forward frame calls this once per call, after every
        layer has written its state)."""
        self.seen_tokens += tokens

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    # -- the part of transformers' ``Cache`` interface that ``generate`` reads ------------------------
    @property
    def is_linear(self) -> list[bool]:
        """Per layer, whether transformers should treat it as a state without a sequence axis. Every
        slmlab layer state counts the tokens it has seen (``get_seq_length``), so none does: a
        continued ``generate`` feeds only the tokens the cache has not seen."""
        return [False] * len(self.layers)

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self.layers)

    def get_max_length(self) -> int:
        """-1: no maximum (the buffers grow)."""
        return -1

    def crop_refusal(self) -> str | None:
        """Why this cache cannot be rolled back, naming the first state that refuses, or None."""
        return self._first_refusal("crop_refusal")

    @property
    def is_croppable(self) -> bool:
        """Whether :meth:`crop` can roll back tokens (transformers' assisted decoding checks this)."""
        return self.crop_refusal() is None

    def activate_past_recording(self, recurrent_states_to_keep: int | None = None, **kwargs) -> None:
        """Keep what a later :meth:`crop` needs (conv windows); transformers calls this before
        assisted decoding: without arguments up to 5.24, with ``recurrent_states_to_keep`` (the most
        tokens one draft rolls back) from 5.25 on. slmlab's states record every input they see while
        recording, so the number is only kept for :meth:`get_recurrent_states_to_keep`; other keywords a
        later transformers may pass are ignored, as transformers' own layers do."""
        self.recording_past = True
        self.recurrent_states_to_keep = max(self.recurrent_states_to_keep, int(recurrent_states_to_keep or 0))
        for state in self._all_states():
            state.activate_past_recording(recurrent_states_to_keep)

    def stop_past_recording(self) -> None:
        """Free the recorded inputs (``generate`` calls this when it returns, so a cache kept for the
        next turn stays O(K) per conv layer)."""
        self.recording_past, self.recurrent_states_to_keep = False, 0
        for state in self._all_states():
            state.stop_past_recording()

    def is_recording_past(self, layer_idx: int | None = None) -> bool:
        """Whether :meth:`activate_past_recording` is in force (the same for every layer)."""
        return self.recording_past

    def get_recurrent_states_to_keep(self, layer_idx: int | None = None) -> int:
        """transformers >= 5.25 asks how many intermediate recurrent states a layer computes per step
        for a later roll-back; the number given to :meth:`activate_past_recording` while recording,
        else 0. No slmlab layer reads it: conv states record inputs, and summarising states refuse
        :meth:`crop` instead (:meth:`crop_refusal`)."""
        return self.recurrent_states_to_keep if self.recording_past else 0

    def state_floats(self) -> int:
        """Numbers the cache holds after the tokens seen so far: the inference memory a model needs
        besides its weights (``state_floats(T)`` of a benchmark run, after a prefill of ``T`` tokens)."""
        return sum(state.numel() for state in self._all_states())

    def nbytes(self) -> int:
        """Bytes the cache holds (filled parts only; growing buffers' spare capacity is not counted)."""
        return sum(state.nbytes() for state in self._all_states())

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        for state in self._all_states():
            state.select_batch(beam_idx)

    batch_select_indices = reorder_cache

    def batch_repeat_interleave(self, repeats: int) -> None:
        for state in self._all_states():
            state.repeat_batch(repeats)

    def crop(self, length: int) -> None:
        """Roll the cache back: ``length > 0`` keeps the first ``length`` tokens; ``length <= 0``
        removes the last ``-length`` tokens (transformers' convention; ``crop(0)`` removes nothing).
        Raises ``ValueError`` naming the state that cannot be rolled back."""
        if length <= 0:
            length = self.seen_tokens + length
        if length >= self.seen_tokens:
            return
        reason = self.crop_refusal()
        if reason is not None:
            raise ValueError(f"this cache cannot be cropped: {reason}")
        for state in self._all_states():
            state.crop(length)
        self.seen_tokens = length

    # -- batch surgery (continuous batching) ----------------------------------------------------------
    def _named_states(self) -> list[tuple[str, LayerState]]:
        return [(f"layer {i}", s) for i, s in enumerate(self.layers)] + [(f"'{k}'", s) for k, s in self.extra.items()]

    def batch_refusal(self) -> str | None:
        """Why this cache cannot be padded, joined or trimmed now, naming the first state that refuses, or None."""
        return self._first_refusal("batch_refusal")

    def _first_refusal(self, method: str) -> str | None:
        """The first state's answer to its refusal ``method`` (``crop_refusal`` or ``batch_refusal``) that is
        not None, with the state's name and type; None when every state agrees."""
        for name, state in self._named_states():
            reason = getattr(state, method)()
            if reason is not None:
                return f"{name} ({type(state).__name__}): {reason}"
        return None

    def _check_batchable(self) -> None:
        reason = self.batch_refusal()
        if reason is not None:
            raise CannotBatch(f"this cache cannot change its batch: {reason}")

    def left_pad(self, n: int) -> None:
        """Act as if ``n`` padding positions came before every row (the caller's attention mask marks them)."""
        self._check_batchable()
        for state in self._all_states():
            state.left_pad(n)
        self.seen_tokens += n

    def drop_leading(self, n: int) -> None:
        """Forget the ``n`` oldest positions (leading padding that no row uses any more)."""
        self._check_batchable()
        for state in self._all_states():
            state.drop_leading(n)
        self.seen_tokens -= n

    def join(self, other: ModelCache) -> None:
        """Append ``other``'s rows after this cache's: the one that has seen fewer positions is first
        left-padded to the other's, then each state joins its counterpart (so the batch's attention mask
        is the two masks, left-padded the same way, stacked).

        Raises:
            CannotBatch: the caches cannot be joined (different states, shapes or settings; a state that
                refuses). Both caches are then as they were, as after any other error (out of memory).
        """
        if len(self.layers) != len(other.layers) or set(self.extra) != set(other.extra):
            raise CannotBatch("the caches have different layers")
        pairs = list(zip(self.layers, other.layers)) + [(self.extra[k], other.extra[k]) for k in self.extra]
        for a, b in pairs:
            if type(a) is not type(b):
                raise CannotBatch(f"state types differ: {type(a).__name__} vs {type(b).__name__}")
        self._check_batchable()
        other._check_batchable()
        rows = _rows(self) + _rows(other)
        saved = [(s, s.snapshot()) for pair in pairs for s in pair]
        width = max(self.seen_tokens, other.seen_tokens)
        try:
            for a, b in pairs:
                a.left_pad(width - self.seen_tokens)
                b.left_pad(width - other.seen_tokens)
                a.join(b)
                left = next((t for t in a.held_tensors() if t.shape[0] != rows), None)
                if left is not None:
                    raise CannotBatch(f"{type(a).__name__}.join left a tensor of {left.shape[0]} rows, not {rows}:"
                                      " a state must join every tensor it holds")
        except Exception:  # CannotBatch, or a failing concatenation (out of memory): nothing changes
            for state, snapshot in saved:
                state.restore(snapshot)
            raise
        self.seen_tokens = width

    def __repr__(self) -> str:
        kinds = ", ".join(type(s).__name__ for s in self.layers)
        return f"ModelCache(seen_tokens={self.seen_tokens}, layers=[{kinds}])"


def _rows(cache: ModelCache) -> int:
    """The rows a cache holds (0 before any state holds a tensor)."""
    return next((t.shape[0] for state in cache._all_states() for t in state.held_tensors()), 0)
