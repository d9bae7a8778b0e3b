"""Unit tests of the shared layers, each against a plain reference written here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from slmlab.layers import (
    CausalDepthwiseConv1d,
    CausalSelfAttention,
    ConvState,
    KVState,
    ModelCache,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    TensorState,
    apply_rotary,
    causal_bias,
    position_ids_from_mask,
)

ATOL = 1e-5


def test_rmsnorm_matches_formula_and_keeps_dtype():
    norm = RMSNorm(8, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 8))
    x = torch.randn(3, 5, 8)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    torch.testing.assert_close(norm(x), ref, atol=ATOL, rtol=0)
    assert norm(x.to(torch.bfloat16)).dtype == torch.float32  # fp32 weight * bf16 -> promotes, as transformers
    assert norm.half()(x.half()).dtype == torch.float16


def test_rotary_is_a_rotation_with_relative_positions():
    rope = RotaryEmbedding(16, base=10000.0)
    q, k = torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)

    def score(i, j):
        cq, sq = rope(torch.tensor([[i]]))
        ck, sk = rope(torch.tensor([[j]]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum(-1)

    torch.testing.assert_close(score(7, 3), score(107, 103), atol=1e-4, rtol=0)
    cos, sin = rope(torch.tensor([[5]]))
    torch.testing.assert_close(apply_rotary(q, cos, sin).norm(dim=-1), q.norm(dim=-1), atol=ATOL, rtol=0)


def test_rotary_matches_pairwise_formula_and_partial_factor():
    rope = RotaryEmbedding(8, base=100.0, partial_rotary_factor=0.5)
    assert rope.rotary_dim == 4
    x = torch.randn(1, 1, 3, 8)
    pos = torch.tensor([[0, 1, 9]])
    out = apply_rotary(x, *rope(pos))
    torch.testing.assert_close(out[..., 4:], x[..., 4:])  # pass-through channels
    theta = 100.0 ** (-torch.arange(2).float() * 2 / 4)
    for t, p in enumerate(pos[0].tolist()):
        for j in range(2):
            a, b = x[0, 0, t, j], x[0, 0, t, j + 2]
            c, s = math.cos(p * theta[j]), math.sin(p * theta[j])
            assert abs(out[0, 0, t, j] - (a * c - b * s)) < ATOL
            assert abs(out[0, 0, t, j + 2] - (b * c + a * s)) < ATOL


def test_rotary_tables_grow_on_demand():
    rope = RotaryEmbedding(8, max_position_embeddings=4)
    cos, _ = rope(torch.tensor([[1000]]))
    assert cos.shape == (1, 1, 8)
    assert rope._cos.shape[0] >= 1001
    with pytest.raises(ValueError, match="rotates no channel"):
        RotaryEmbedding(8, partial_rotary_factor=0.1)


def test_position_ids_from_left_padded_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    torch.testing.assert_close(position_ids_from_mask(mask, 0, 5, 2, mask.device), torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]))
    torch.testing.assert_close(position_ids_from_mask(mask, 4, 1, 2, mask.device), torch.tensor([[2], [4]]))
    torch.testing.assert_close(position_ids_from_mask(None, 3, 2, 1, mask.device), torch.tensor([[3, 4]]))


def test_causal_bias_cases():
    dev = torch.device("cpu")
    assert causal_bias(None, 5, 5, dev).is_causal and causal_bias(None, 5, 5, dev).mask is None
    assert causal_bias(None, 1, 9, dev).mask is None and not causal_bias(None, 1, 9, dev).is_causal
    chunk = causal_bias(None, 2, 5, dev).mask[0, 0]
    assert chunk.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    win = causal_bias(None, 4, 4, dev, sliding_window=2).mask[0, 0]
    assert win.tolist() == [[True, False, False, False], [True, True, False, False], [False, True, True, False], [False, False, True, True]]
    pad = causal_bias(torch.tensor([[0, 1, 1]]), 3, 3, dev).mask[0, 0]
    assert pad[1:].tolist() == [[False, True, False], [False, True, True]]
    assert pad[0].all()  # a padded query row sees everything, so SDPA stays finite


def reference_attention(attn: CausalSelfAttention, x, pos):
    b, t, _ = x.shape
    h, kvh, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q = attn.q_proj(x).view(b, t, h, d).transpose(1, 2)
    k = attn.k_proj(x).view(b, t, kvh, d).transpose(1, 2)
    v = attn.v_proj(x).view(b, t, kvh, d).transpose(1, 2)
    rope = RotaryEmbedding(d)
    cos, sin = rope(pos)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    k, v = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(d) + torch.full((t, t), float("-inf")).triu(1)
    return attn.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_attention_matches_reference_and_decodes_through_cache(kv_heads):
    attn = CausalSelfAttention(32, 4, kv_heads).eval()
    rope = RotaryEmbedding(8)
    x = torch.randn(2, 7, 32)
    pos = torch.arange(7).expand(2, 7)
    full = attn(x, *rope(pos), causal_bias(None, 7, 7, x.device))
    torch.testing.assert_close(full, reference_attention(attn, x, pos), atol=ATOL, rtol=0)
    state, steps = KVState(), []
    for t in range(7):
        steps.append(attn(x[:, t : t + 1], *rope(pos[:, t : t + 1]), causal_bias(None, 1, t + 1, x.device), state))
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=ATOL, rtol=0)
    assert state.length == 7


def test_attention_qk_norm_and_padding():
    attn = CausalSelfAttention(32, 4, 2, qk_norm=True).eval()
    assert isinstance(attn.q_norm, RMSNorm)
    rope = RotaryEmbedding(8)
    x = torch.randn(1, 5, 32)
    alone = attn(x[:, 2:], *rope(torch.arange(3)[None]), causal_bias(None, 3, 3, x.device))
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    padded = attn(x, *rope(position_ids_from_mask(mask, 0, 5, 1, x.device)), causal_bias(mask, 5, 5, x.device))
    torch.testing.assert_close(padded[:, 2:], alone, atol=ATOL, rtol=0)


def test_kv_state_grows_and_supports_beam_reorder():
    state = KVState()
    k = torch.arange(2 * 1 * 70 * 1, dtype=torch.float32).view(2, 1, 70, 1)
    keys, _ = state.update(k[:, :, :60], k[:, :, :60])
    keys, _ = state.update(k[:, :, 60:], k[:, :, 60:])
    torch.testing.assert_close(keys, k)
    cache = ModelCache([state])
    cache.advance(70)
    cache.reorder_cache(torch.tensor([1, 1]))
    torch.testing.assert_close(state.keys[0, :, :70], k[1])
    cache.crop(10)
    assert state.length == 10


def test_swiglu_formula():
    mlp = SwiGLU(8, 12)
    x = torch.randn(2, 3, 8)
    ref = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), ref)
    assert {n for n, _ in mlp.named_parameters()} == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}


@pytest.mark.parametrize("kernel", [1, 3, 4])
def test_causal_conv_matches_padded_conv1d_and_streams(kernel):
    conv = CausalDepthwiseConv1d(6, kernel)
    ref_conv = torch.nn.Conv1d(6, 6, kernel, groups=6, padding=kernel - 1)
    ref_conv.load_state_dict(conv.state_dict())
    x = torch.randn(2, 6, 9)
    full = conv(x)
    torch.testing.assert_close(full, ref_conv(x)[..., :9], atol=ATOL, rtol=0)
    state = ConvState()
    chunks = [conv(x[..., :4], state)] + [conv(x[..., t : t + 1], state) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(chunks, -1), full, atol=ATOL, rtol=0)
    assert state.window.shape == (2, 6, kernel - 1)


@pytest.mark.parametrize("kernel", [1, 3, 4])
def test_conv_state_rolls_back_after_recording(kernel):
    """Assisted decoding's pattern: feed a draft, crop the rejected tokens, feed the accepted ones."""
    conv = CausalDepthwiseConv1d(6, kernel)
    x, wrong = torch.randn(2, 6, 9), torch.randn(2, 6, 3)
    state = ConvState()
    conv(x[..., :4], state)
    assert state.crop_refusal() is not None  # not recording: only the last K-1 inputs are kept
    cache = ModelCache([state])
    cache.advance(4)
    with pytest.raises(ValueError, match="activate_past_recording"):
        cache.crop(-1)
    cache.activate_past_recording()
    assert cache.is_croppable and cache.crop_refusal() is None
    conv(torch.cat((x[..., 4:6], wrong), -1), state)  # two right tokens, three drafted wrong ones
    cache.advance(5)
    cache.crop(-3)
    assert cache.seen_tokens == state.seen == 6
    rest = torch.cat([conv(x[..., t : t + 1], state) for t in range(6, 9)], -1)
    torch.testing.assert_close(rest, conv(x)[..., 6:], atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="only 5 were recorded"):
        state.crop(state.seen - 6)
    cache.stop_past_recording()  # what generate() does when it returns the cache
    assert state.history is None and not cache.is_croppable and state.window.shape == (2, 6, kernel - 1)


def test_model_cache_crop_follows_transformers_conventions():
    state = KVState()
    state.update(torch.randn(1, 1, 8, 2), torch.randn(1, 1, 8, 2))
    cache = ModelCache([state])
    cache.advance(8)
    assert cache.is_linear == [False] and cache.get_max_length() == -1 and not cache.is_compileable
    cache.crop(0)  # transformers: remove no token
    assert cache.seen_tokens == state.length == 8
    cache.crop(-3)  # remove the last three
    assert cache.seen_tokens == state.length == 5
    cache.crop(2)  # a positive length: keep the first two
    assert cache.seen_tokens == state.length == 2
    frozen = ModelCache([TensorState()])
    frozen.advance(4)
    assert not frozen.is_croppable and "layer 0 (TensorState)" in frozen.crop_refusal()
    with pytest.raises(ValueError, match="cannot be cropped: layer 0"):
        frozen.crop(-1)


def test_model_cache_past_recording_follows_both_transformers_contracts():
    """transformers <= 5.24 calls ``activate_past_recording()``; 5.25 passes ``recurrent_states_to_keep``
    (the most tokens a draft rolls back) and reads ``get_recurrent_states_to_keep()`` back."""
    conv = CausalDepthwiseConv1d(4, 3)
    state = ConvState()
    cache = ModelCache([state, KVState()])
    assert not cache.is_recording_past(0) and cache.get_recurrent_states_to_keep() == 0
    cache.activate_past_recording(recurrent_states_to_keep=5)
    assert cache.is_recording_past(1) and state.recording
    assert cache.get_recurrent_states_to_keep() == cache.get_recurrent_states_to_keep(0) == 5
    cache.activate_past_recording(recurrent_states_to_keep=2)  # a second caller never lowers the number
    assert cache.get_recurrent_states_to_keep() == 5
    conv(torch.randn(1, 4, 6), state)
    cache.advance(6)
    cache.crop(-4)  # more than recurrent_states_to_keep: a conv state records every input, so it still rolls back
    assert cache.seen_tokens == state.seen == 2
    cache.stop_past_recording()
    assert not cache.is_recording_past() and cache.get_recurrent_states_to_keep() == 0 and not state.recording
    cache.activate_past_recording()  # the 5.24 call
    assert state.recording and cache.get_recurrent_states_to_keep() == 0


def test_causal_conv_never_sees_the_future():
    conv = CausalDepthwiseConv1d(4, 3)
    x = torch.randn(1, 4, 10)
    y = x.clone()
    y[..., 6:] = torch.randn(1, 4, 4)
    torch.testing.assert_close(conv(x)[..., :6], conv(y)[..., :6])


def test_concatenated_weights_cache_only_inside_frozen_blocks():
    from slmlab.layers import ConcatenatedWeights, frozen_weights

    a, b = torch.nn.Parameter(torch.randn(3, 4)), torch.nn.Parameter(torch.randn(2, 4))
    cat = ConcatenatedWeights()
    with torch.no_grad():
        assert cat(a, b) is not cat(a, b)  # outside a frozen block: rebuilt every call
        with frozen_weights():
            first = cat(a, b)
            assert cat(a, b) is first  # cached while the weights are promised not to change
        a.data.add_(1.0)  # an update that does not bump the version counter (like fused optimisers)
        with frozen_weights():
            torch.testing.assert_close(cat(a, b), torch.cat([a, b]))  # a new block never reuses the old cache
    with frozen_weights():
        cat(a, b).sum().backward()  # with autograd, gradients reach both weights
    assert a.grad is not None and b.grad is not None


@pytest.mark.parametrize("bias", [False, True])
def test_fused_projections_equal_separate_linears(bias):
    attn = CausalSelfAttention(16, 4, 2, bias=bias)
    x = torch.randn(2, 3, 16)
    ref = torch.cat([attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)], -1)
    torch.testing.assert_close(attn.project_qkv(x), ref, atol=ATOL, rtol=0)
    mlp = SwiGLU(16, 8, bias=bias)
    torch.testing.assert_close(mlp(x), mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x)), atol=ATOL, rtol=0)
