"""Decoding caches: a container of typed per-layer states.

Every family decodes through one :class:`ModelCache`. Each layer owns the entry at its index and
reads/updates only that entry; the state type says what it supports. ``generate()`` of transformers
and :mod:`slmlab.generation` both pass the same object back into ``forward(cache=...)``.

State types:
    * :class:`KVState`  – keys/values of an attention layer, in a buffer that grows by doubling
      (appending one token is O(1) amortised, no per-step ``torch.cat`` of the whole history).
    * :class:`ConvState` – the last ``kernel - 1`` inputs of a causal convolution (O(kernel) per step).
    * :class:`TensorState` – any fixed-size per-row tensors (running sums, last outputs, ...).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


class LayerState:
    """Base class: a per-layer state whose tensors all have the batch on dim 0."""

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

    def crop(self, length: int) -> None:
        raise ValueError(f"{type(self).__name__} cannot be cropped (it summarises the whole past).")

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
    step and returns views of the filled part.
    """

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

    def crop(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))

    def held_tensors(self) -> list[torch.Tensor]:
        """The keys and values of the seen positions (not the spare capacity), plus any other tensor
        a subclass keeps (e.g. a running state)."""
        out = [getattr(self, n) for n in self._tensor_names() if n not in ("keys", "values")]
        if self.keys is not None:
            out += [self.keys[:, :, : self.length], self.values[:, :, : self.length]]
        return out


class ConvState(LayerState):
    """The last ``kernel - 1`` inputs ``[B, C, K-1]`` of a causal depthwise convolution."""

    def __init__(self) -> None:
        self.window: torch.Tensor | None = None


class TensorState(LayerState):
    """A bag of named per-row tensors for recurrent summaries (set attributes freely)."""


class ModelCache:
    """Per-layer decoding states for one model, plus the number of tokens seen.

    Args:
        states: one :class:`LayerState` per layer, in layer order.
        extra: model-level states (e.g. a running cumulative sum), by name.
    """

    is_compileable = False

    def __init__(self, states: list[LayerState], extra: dict[str, LayerState] | None = None) -> None:
        self.layers = list(states)
        self.extra = dict(extra or {})
        self.seen_tokens = 0

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
        if length < 0:
            length = self.seen_tokens + length
        for state in self._all_states():
            state.crop(length)
        self.seen_tokens = min(self.seen_tokens, length)

    def __repr__(self) -> str:
        kinds = ", ".join(type(s).__name__ for s in self.layers)
        return f"ModelCache(seen_tokens={self.seen_tokens}, layers=[{kinds}])"
