"""Batch surgery of cache states (``left_pad``, ``join``, ``drop_leading``): after each operation the
next decoding step equals a full forward over the equivalent padded, joined or trimmed batch; a state
that cannot do an operation refuses it, and a failed join leaves both caches as they were."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from serve_helpers import TINY
from slmlab.layers import ConvState, KVState, LayerState, ModelCache, TensorState
from slmlab.layers.cache import CannotBatch
from slmlab.models.registry import get_family

ATOL = 1e-5
VOCAB = 64
# Every state type a family defines: KVState (lumen, lfm2, pgsm), ConvState (lfm2, pgsm), PGSM's
# RetrievalMode (a TensorState), NanoHammer's HammerLayerState and RunningSum, NeoLLMAttentionState
# (interleaved pseudo-tokens with IHA, momentum's last-token state).
FAMILIES = {
    "lumen": ("lumen", None, TINY["lumen"]),
    "lfm2": ("lfm2", None, TINY["lfm2"]),
    "pgsm": ("pgsm", None, TINY["pgsm"]),
    "nanohammer": ("nanohammer", None, TINY["nanohammer"]),
    "neollm": ("neollm", "neollm-tiny", dict(use_spelling_bee_embeddings=False, use_iha=True)),
}


def build(name: str):
    family, preset, kwargs = FAMILIES[name]
    fam = get_family(family)
    torch.manual_seed(0)
    return fam.model_class(fam.make_config(preset, **{**kwargs, "vocab_size": VOCAB})).eval()


def padded(rows: list[list[int]], width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows left-padded (id 0) to ``width`` (default: the longest): ``ids, mask [B, width]``."""
    width = width or max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def full_next(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Next-token logits ``[B, V]`` of one forward over the whole batch."""
    return model(input_ids=ids, attention_mask=mask).logits[:, -1]


def prefill(model, ids: torch.Tensor, mask: torch.Tensor | None = None) -> ModelCache:
    return model(input_ids=ids, attention_mask=mask, use_cache=True).cache


def decode(model, cache: ModelCache, mask: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """Feed one token per row through ``cache``: next-token logits ``[B, V]``."""
    mask = F.pad(mask, (0, 1), value=1)
    return model(input_ids=torch.tensor(tokens)[:, None], attention_mask=mask, cache=cache, use_cache=True).logits[:, -1]


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):
    return build(request.param)


@torch.no_grad()
def test_decode_after_left_pad_equals_the_padded_forward(model):
    prompt, nxt = tokens(6, 1), tokens(1, 2)
    cache = prefill(model, torch.tensor([prompt]))
    cache.left_pad(3)
    assert cache.seen_tokens == 9
    ids, mask = padded([prompt + nxt], width=10)
    got = decode(model, cache, mask[:, :-1], nxt)
    torch.testing.assert_close(got, full_next(model, ids, mask), atol=ATOL, rtol=0)


@pytest.mark.parametrize("order", ["shorter first", "longer first"])
@torch.no_grad()
def test_decode_after_join_equals_the_forward_of_both_rows_left_padded(model, order):
    rows = [tokens(7, 3), tokens(4, 4)]
    if order == "shorter first":
        rows.reverse()
    nxt = [tokens(1, 5)[0], tokens(1, 6)[0]]
    cache = prefill(model, torch.tensor([rows[0]]))
    cache.join(prefill(model, torch.tensor([rows[1]])))
    assert cache.seen_tokens == 7 and all(t.shape[0] == 2 for s in cache._all_states() for t in s.held_tensors())
    ids, mask = padded([rows[0] + nxt[:1], rows[1] + nxt[1:]])
    got = decode(model, cache, mask[:, :-1], nxt)
    torch.testing.assert_close(got, full_next(model, ids, mask), atol=ATOL, rtol=0)


@torch.no_grad()
def test_decode_after_drop_leading_equals_the_forward_of_the_trimmed_batch(model):
    rows, nxt = [tokens(5, 7), tokens(7, 8)], [tokens(1, 9)[0], tokens(1, 10)[0]]
    ids, mask = padded(rows, width=9)  # two leading columns no row uses
    cache = prefill(model, ids, mask)
    cache.drop_leading(2)
    assert cache.seen_tokens == 7
    ids, mask = padded([rows[0] + nxt[:1], rows[1] + nxt[1:]])
    got = decode(model, cache, mask[:, :-1], nxt)
    torch.testing.assert_close(got, full_next(model, ids, mask), atol=ATOL, rtol=0)


def test_a_recording_conv_state_refuses_batch_operations_and_a_refused_join_changes_nothing():
    conv = ConvState()
    conv.window = torch.zeros(1, 3, 2)
    kv = KVState()
    kv.update(torch.randn(1, 1, 4, 2), torch.randn(1, 1, 4, 2))
    ours = ModelCache([kv, conv])
    ours.advance(4)
    conv.activate_past_recording()
    assert "layer 1 (ConvState)" in ours.batch_refusal() and "stop_past_recording" in ours.batch_refusal()
    for op in (lambda: conv.left_pad(1), lambda: conv.drop_leading(1), lambda: ours.left_pad(1)):
        with pytest.raises(CannotBatch, match="stop_past_recording"):
            op()
    theirs = ModelCache([KVState(), ConvState()])
    theirs.layers[0].update(torch.randn(1, 1, 2, 2), torch.randn(1, 1, 2, 2))
    theirs.layers[1].window = torch.zeros(1, 3, 2)
    theirs.advance(2)
    keys = kv.keys
    with pytest.raises(CannotBatch, match="layer 1 \\(ConvState\\)"):
        ours.join(theirs)
    assert kv.keys is keys and kv.length == 4 and ours.seen_tokens == 4 and theirs.layers[0].length == 2
    conv.stop_past_recording()
    assert ours.batch_refusal() is None


def test_a_join_that_fails_part_way_restores_both_caches():
    """The first layers joined, a later one's shapes differ: every state is back as it was."""
    def cache(channels: int, length: int) -> ModelCache:
        kv, conv = KVState(), ConvState()
        kv.update(torch.randn(1, 1, length, 2), torch.randn(1, 1, length, 2))
        conv.window, conv.seen = torch.zeros(1, channels, 2), length
        made = ModelCache([kv, conv])
        made.advance(length)
        return made

    ours, theirs = cache(3, 5), cache(4, 2)
    before = [(s.keys, s.length) for s in (ours.layers[0], theirs.layers[0])]
    with pytest.raises(CannotBatch, match="ConvState.window shapes differ"):
        ours.join(theirs)
    assert [(s.keys, s.length) for s in (ours.layers[0], theirs.layers[0])] == before
    assert (ours.layers[1].seen, theirs.layers[1].seen, ours.seen_tokens, theirs.seen_tokens) == (5, 2, 5, 2)


def test_explicit_retrieval_positions_refuse_batch_operations():
    model = build("pgsm")
    ids = torch.tensor([tokens(6, 11)])
    cache = model(input_ids=ids, use_cache=True, retrieval_positions=torch.tensor([[2]])).cache
    assert "explicit retrieval positions" in cache.batch_refusal()
    with pytest.raises(CannotBatch, match="'retrieval' \\(RetrievalMode\\)"):
        cache.left_pad(1)
    assert prefill(model, ids).batch_refusal() is None


def test_states_that_disagree_on_a_setting_or_type_cannot_join():
    a, b = TensorState(), TensorState()
    a.mode, b.mode = "x", "y"
    with pytest.raises(CannotBatch, match="TensorState.mode differs: 'x' vs 'y'"):
        a.join(b)
    with pytest.raises(CannotBatch, match="state types differ: KVState vs ConvState"):
        ModelCache([KVState()]).join(ModelCache([ConvState()]))


def test_a_new_state_type_must_implement_the_batch_operations():
    class Forgetful(LayerState):
        def left_pad(self, n: int) -> None:
            pass

    with pytest.raises(TypeError, match="drop_leading"):
        Forgetful()

    class HalfJoin(TensorState):
        def join(self, other) -> None:  # joins `a`, forgets `b`
            self.a = torch.cat((self.a, other.a))

    ours, theirs = HalfJoin(), HalfJoin()
    ours.a = ours.b = theirs.a = theirs.b = torch.zeros(1, 3)
    with pytest.raises(CannotBatch, match="must join every tensor it holds"):
        ModelCache([ours]).join(ModelCache([theirs]))
    assert ours.a.shape[0] == 1  # restored
