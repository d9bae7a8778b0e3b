"""LFM2Small: the shared family suite plus transformers parity, streaming cache, config rules, audit."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from transformers import Lfm2ForCausalLM

from family_tester import ATOL, FamilyTester, decode_stepwise, left_pad
from slmlab.generation import generate
from slmlab.layers import AttentionBias, ConvState, KVState, RotaryEmbedding, apply_rotary
from slmlab.models.lfm2 import (
    Lfm2SmallBackbone,
    Lfm2SmallConfig,
    Lfm2SmallForCausalLM,
    audit_parameters,
    config_from_transformers,
    config_to_transformers,
    from_transformers,
)

TINY = dict(
    vocab_size=97, hidden_size=32, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
    num_layers=4, layer_order=["conv", "attn", "conv", "attn"], block_multiple_of=16, max_position_embeddings=64,
)


class TestLfm2Family(FamilyTester):
    family = "lfm2"
    config_kwargs = TINY
    bad_configs = [
        (dict(num_layers=6), "layer_order has 4 entries but num_layers=6"),
        (dict(layer_order=["conv", "attn"]), "layer_order has 2 entries but num_layers=4"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "divisible by num_key_value_heads"),
        (dict(hidden_size=250), r"hidden_size \(250\) must be divisible"),
        (dict(layer_order=["conv"] * 3 + ["mamba"]), "must be one of"),
        (dict(block_ffn_dim_multiplier=0.0), "block_ffn_dim_multiplier must be > 0"),
        (dict(conv_kernel_size=0), "conv_kernel_size must be a positive integer"),
        (dict(vocab_size=0), "vocab_size must be a positive integer"),
    ]
    has_decode_plan = True
    supports_assisted_decoding = True  # K/V crop; conv windows record their inputs while drafting
    draft_overrides = dict(num_layers=2, layer_order=["conv", "attn"])

    def attention_shapes(self, model, b, t, s):
        """One entry per attention layer: conv layers have no attention weights (as in transformers' LFM2)."""
        return [(b, model.config.num_attention_heads, t, s)] * model.config.layer_order.count("attn")


def hf_twin(seed: int = 0, **kw) -> Lfm2ForCausalLM:
    torch.manual_seed(seed)
    return Lfm2ForCausalLM(config_to_transformers(Lfm2SmallConfig(**{**TINY, **kw}))).eval()


@pytest.mark.parametrize(
    "order, kernel, kv_heads, conv_bias",
    [
        (["conv", "attn", "conv", "attn"], 3, 2, False),
        (["attn", "conv", "conv", "attn"], 4, 1, False),
        (["conv", "conv", "conv", "attn"], 3, 4, True),
        (["attn", "attn", "conv", "conv"], 4, 4, False),
    ],
)
def test_parity_with_transformers_lfm2(order, kernel, kv_heads, conv_bias):
    hf = hf_twin(layer_order=order, conv_kernel_size=kernel, num_key_value_heads=kv_heads, conv_bias=conv_bias)
    ours = from_transformers(hf).eval()
    assert ours.config.layer_order == order and ours.config.conv_kernel_size == kernel
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    ids = torch.randint(0, 97, (2, 14))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got = ours(input_ids=ids).logits
    assert (got - ref).abs().max() <= ATOL


def test_hidden_states_match_transformers_lfm2():
    hf = hf_twin(layer_order=["conv", "attn", "conv", "attn"], conv_kernel_size=3)
    ours = from_transformers(hf).eval()
    ids = torch.randint(0, 97, (2, 13))
    with torch.no_grad():
        ref = hf(input_ids=ids, output_hidden_states=True).hidden_states
        got = ours(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(got) == len(ref) == 5
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def test_parity_with_transformers_left_padded():
    hf = hf_twin(layer_order=["conv", "attn", "conv", "attn"], conv_kernel_size=3)
    ours = from_transformers(hf).eval()
    ids, mask = left_pad([torch.randint(1, 97, (n,)) for n in (12, 7)])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = ours(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    assert (got[real] - ref[real]).abs().max() <= ATOL


def test_state_dict_names_match_transformers_and_seed():
    hf = hf_twin()
    ours = Lfm2SmallForCausalLM(config_from_transformers(hf.config))
    assert set(ours.state_dict()) == set(hf.state_dict())
    backbone = Lfm2SmallBackbone(Lfm2SmallConfig())
    names = set(backbone.state_dict())
    # the seed's LFM2Small backbone names (layer 0 conv, layer 2 attention)
    for n in ("layers.0.conv.in_proj.weight", "layers.0.conv.conv.weight", "layers.0.conv.out_proj.weight",
              "layers.2.self_attn.q_layernorm.weight", "layers.2.self_attn.out_proj.weight",
              "layers.7.feed_forward.w3.weight", "layers.7.operator_norm.weight", "layers.7.ffn_norm.weight",
              "embedding_norm.weight"):
        assert n in names
    assert backbone.layers[0].conv.conv.weight.shape == (256, 1, 3)


def test_hf_generate_same_tokens_as_transformers():
    hf = hf_twin()
    ours = from_transformers(hf).eval()
    ids = torch.randint(1, 97, (1, 6))
    ref = hf.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert torch.equal(generate(ours, ids, 10), ref)
    assert torch.equal(ours.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False), ref)


@pytest.mark.parametrize("kernel", [2, 3, 4])
def test_conv_layer_never_sees_the_future(kernel):
    torch.manual_seed(1)
    layer = Lfm2SmallForCausalLM(Lfm2SmallConfig(**{**TINY, "conv_kernel_size": kernel})).model.layers[0].conv
    x = torch.randn(2, 10, 32)
    for t in range(9):
        y = x.clone()
        y[:, t + 1 :] = torch.randn_like(y[:, t + 1 :])
        torch.testing.assert_close(layer(y, None)[:, : t + 1], layer(x, None)[:, : t + 1], atol=0, rtol=0)
        assert (layer(y, None)[:, t + 1 :] - layer(x, None)[:, t + 1 :]).abs().max() > 0


def test_streaming_cache_holds_k_minus_1_inputs_and_decode_matches():
    model = Lfm2SmallForCausalLM(Lfm2SmallConfig(**{**TINY, "conv_kernel_size": 4})).eval()
    ids = torch.randint(1, 97, (2, 40))
    full = model(input_ids=ids, use_cache=False).logits
    with torch.no_grad():
        out = model(input_ids=ids[:, :30], use_cache=True)
    cache = out.cache
    assert [type(s) for s in cache] == [ConvState, KVState, ConvState, KVState]
    assert cache[0].window.shape == (2, 32, 3) and cache[1].length == 30
    with torch.no_grad():
        for t in range(30, 40):  # the conv state stays K-1 wide: a step costs O(K), not O(context)
            model(input_ids=ids[:, t : t + 1], cache=cache)
    assert cache[0].window.shape == (2, 32, 3) and cache[1].length == 40 and cache.seen_tokens == 40
    step = decode_stepwise(model, ids, prefill=30)
    torch.testing.assert_close(step, full, atol=ATOL, rtol=0)


def test_padding_never_enters_the_conv_state():
    model = Lfm2SmallForCausalLM(Lfm2SmallConfig(**{**TINY, "conv_bias": True})).eval()
    row = torch.randint(1, 97, (6,))
    ids, mask = left_pad([torch.randint(1, 97, (11,)), row])
    padded = model(input_ids=ids, attention_mask=mask).cache
    alone = model(input_ids=row[None]).cache
    torch.testing.assert_close(padded[0].window[1], alone[0].window[0], atol=ATOL, rtol=0)
    step = decode_stepwise(model, ids, mask, prefill=3)
    full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(step[mask.bool()], full[mask.bool()], atol=ATOL, rtol=0)
    torch.testing.assert_close(full[1, -6:], model(input_ids=row[None]).logits[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "intermediate, auto, multiple, mult, expected",
    [
        (1024, True, 256, 1.0, 768),   # the seed's default: int(2048/3)=682 -> 768
        (2048, True, 256, 1.0, 1536),  # 1365 -> 1536
        (1024, False, 256, 1.0, 1024),
        (1024, True, 64, 1.0, 704),
        (1024, True, 256, 1.5, 1024),  # int(1.5 * 682) = 1023 -> 1024
        (96, True, 16, 1.0, 64),
        (12288, True, 256, 1.0, 8192),  # LFM2-1.2B
        (1024, True, 256, None, 682),  # transformers: no multiplier, no rounding
    ],
)
def test_effective_intermediate_size(intermediate, auto, multiple, mult, expected):
    cfg = Lfm2SmallConfig(
        intermediate_size=intermediate, block_auto_adjust_ff_dim=auto, block_multiple_of=multiple, block_ffn_dim_multiplier=mult
    )
    assert cfg.effective_intermediate_size == expected
    assert Lfm2SmallForCausalLM(Lfm2SmallConfig(**{**TINY, "intermediate_size": intermediate, "block_multiple_of": multiple,
                                                  "block_auto_adjust_ff_dim": auto, "block_ffn_dim_multiplier": mult})
                                ).model.layers[0].feed_forward.w1.out_features == expected


def test_config_defaults_aliases_and_yaml(tmp_path, caplog):
    cfg = Lfm2SmallConfig()
    assert (cfg.hidden_size, cfg.effective_intermediate_size, cfg.head_dim, cfg.num_kv_groups) == (256, 768, 64, 2)
    assert cfg.layer_order == ["conv", "conv", "attn", "conv", "attn", "conv", "attn", "conv"]
    assert (cfg.num_hidden_layers, cfg.norm_eps, cfg.conv_L_cache) == (8, 1e-6, 3)
    assert (cfg.rope_theta, cfg.max_position_embeddings, cfg.initializer_range) == (1e6, 4096, 0.02)
    assert Lfm2SmallConfig(num_layers=2, full_attn_idxs=[1]).layer_order == ["conv", "attn"]
    (tmp_path / "model.yaml").write_text(
        "backbone:\n  hidden_size: 128\n  num_layers: 2\n  layer_order: [conv, attn]\n  max_position_embeddings: 512\n"
        "  mystery: 1\nsequence:\n  num_transactions: 32\n  features_per_transaction: 12\n"
    )
    with caplog.at_level(logging.WARNING):
        y = Lfm2SmallConfig.from_yaml(tmp_path / "model.yaml")
    assert "mystery" in caplog.text
    assert (y.hidden_size, y.layer_order, y.max_position_embeddings) == (128, ["conv", "attn"], 512)
    assert (y.num_transactions, y.num_features, y.intermediate_size) == (32, 12, 1024)
    back = config_from_transformers(config_to_transformers(y))
    fields = ("hidden_size", "intermediate_size", "num_layers", "layer_order", "conv_kernel_size", "rms_norm_eps",
              "rope_theta", "max_position_embeddings", "num_key_value_heads", "block_ffn_dim_multiplier")
    assert {f: getattr(back, f) for f in fields} == {f: getattr(y, f) for f in fields}


def test_audit_gives_the_seed_backbone_budget():
    rows = audit_parameters(Lfm2SmallForCausalLM(Lfm2SmallConfig()))
    assert rows["Backbone (blocks + embedding_norm)"] == 6_627_712
    assert rows["Conv blocks"] == 5 * (3 * 256 * 256 + 256 * 3 + 256 * 256 + 3 * 256 * 768 + 2 * 256)
    assert rows["Tied embedding table"] == 2048 * 256
    assert rows["Total"] == 6_627_712 + 2048 * 256
    assert sum(p.numel() for p in Lfm2SmallBackbone(Lfm2SmallConfig()).parameters()) == 6_627_712


def test_backbone_takes_inputs_embeds():
    backbone = Lfm2SmallBackbone(Lfm2SmallConfig(**TINY)).eval()
    x = torch.randn(2, 9, 32)
    out = backbone(x, use_cache=False)
    assert out.last_hidden_state.shape == (2, 9, 32) and out.cache is None
    with pytest.raises(ValueError, match="inputs_embeds must have shape"):
        backbone(torch.randn(2, 9, 31))


def test_fused_projections_equal_separate_linears_values_and_gradients():
    torch.manual_seed(2)
    layer = Lfm2SmallForCausalLM(Lfm2SmallConfig(**TINY)).model.layers[1]
    mlp, attn = layer.feed_forward, layer.self_attn
    x = torch.randn(2, 7, 32, requires_grad=True)
    ref = mlp.w2(torch.nn.functional.silu(mlp.w1(x)) * mlp.w3(x))
    got = mlp(x)
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    g_ref = torch.autograd.grad(ref.square().sum(), (x, mlp.w1.weight, mlp.w3.weight))
    g_got = torch.autograd.grad(got.square().sum(), (x, mlp.w1.weight, mlp.w3.weight))
    for a, b in zip(g_got, g_ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    cos, sin = RotaryEmbedding(8, 1e6)(torch.arange(7)[None].expand(2, 7))

    def attn_ref():  # separate projections, the plain path
        q = attn.q_layernorm(attn.q_proj(x).view(2, 7, 4, 8)).transpose(1, 2)
        k = attn.k_layernorm(attn.k_proj(x).view(2, 7, 2, 8)).transpose(1, 2)
        v = attn.v_proj(x).view(2, 7, 2, 8).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return attn.out_proj(o.transpose(1, 2).reshape(2, 7, 32))

    ref, got = attn_ref(), attn(x, cos, sin, AttentionBias(None, True))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=0)
    params = (x, attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
    for a, b in zip(torch.autograd.grad(got.square().sum(), params), torch.autograd.grad(ref.square().sum(), params)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_fused_weight_cache_follows_in_place_updates():
    model = Lfm2SmallForCausalLM(Lfm2SmallConfig(**TINY)).eval()
    ids = torch.randint(1, 97, (2, 9))
    with torch.inference_mode():
        before = model(input_ids=ids).logits
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    with torch.no_grad():
        after = model(input_ids=ids).logits
    fresh = Lfm2SmallForCausalLM(Lfm2SmallConfig(**TINY)).eval()
    fresh.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(after, fresh(input_ids=ids).logits, atol=ATOL, rtol=0)
    assert (after - before).abs().max() > 1e-3
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.model.layers[1].feed_forward.w3.weight.zero_()
        assert (clone(input_ids=ids).logits - after).abs().max() > 1e-4
        torch.testing.assert_close(model(input_ids=ids).logits, after, atol=0, rtol=0)
