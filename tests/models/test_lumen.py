"""SAGE-Lumen: the shared family suite plus Llama parity, seed parity and the audit."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from family_tester import ATOL, FamilyTester, left_pad
from slmlab.models.lumen import LumenConfig, LumenForCausalLM, audit_parameters, convert_seed_state_dict


class TestLumenFamily(FamilyTester):
    family = "lumen"
    config_kwargs = dict(vocab_size=97, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=48, max_seq_len=64)
    bad_configs = [
        (dict(num_heads=4, num_kv_heads=3), "divisible by num_key_value_heads"),
        (dict(hidden_dim=30, num_heads=4), "hidden_size .30. must be divisible"),
        (dict(hidden_dim=24, num_heads=8, num_kv_heads=1), "must be even"),
        (dict(vocab_size=0), "vocab_size must be a positive"),
        (dict(intermediate_dim=-1), "intermediate_dim must be >= 0"),
    ]
    has_decode_plan = True
    supports_assisted_decoding = True
    draft_overrides = dict(num_layers=1)


class TestLumenAttentionOnly(FamilyTester):
    """``intermediate_dim=0``: attention-only blocks (Zoology's MQAR convention) pass the whole suite."""

    family = "lumen"
    config_kwargs = dict(TestLumenFamily.config_kwargs, intermediate_dim=0)
    has_decode_plan = True
    supports_assisted_decoding = True
    draft_overrides = dict(num_layers=1)


def test_attention_only_equals_a_full_block_with_a_silent_mlp():
    full = LumenForCausalLM(LumenConfig(**TestLumenFamily.config_kwargs)).eval()
    bare = LumenForCausalLM(LumenConfig(**TestLumenAttentionOnly.config_kwargs)).eval()
    for layer in full.model.layers:
        torch.nn.init.zeros_(layer.mlp.down_proj.weight)
    missing, unexpected = bare.load_state_dict(full.state_dict(), strict=False)
    assert not missing
    assert sorted({k.split(".", 3)[-1] for k in unexpected}) == [
        "mlp.down_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "post_attention_layernorm.weight",
    ]
    ids = torch.randint(0, 97, (2, 10))
    torch.testing.assert_close(bare(ids).logits, full(ids).logits, atol=ATOL, rtol=0)
    mlp_params = sum(p.numel() for layer in full.model.layers for p in (*layer.mlp.parameters(), *layer.post_attention_layernorm.parameters()))
    assert sum(p.numel() for p in bare.parameters()) == sum(p.numel() for p in full.parameters()) - mlp_params


def llama_twin(cfg: LumenConfig) -> LlamaForCausalLM:
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_dim,
            intermediate_size=cfg.intermediate_dim,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=cfg.max_seq_len,
            rms_norm_eps=cfg.rms_norm_eps,
            rope_theta=cfg.rope_theta,
            tie_word_embeddings=True,
            attn_implementation="eager",
        )
    ).eval()


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("padded", [False, True])
def test_parity_with_transformers_llama(kv_heads, padded):
    cfg = LumenConfig(vocab_size=101, hidden_dim=64, num_layers=2, num_heads=4, num_kv_heads=kv_heads, intermediate_dim=96)
    torch.manual_seed(0)
    llama = llama_twin(cfg)
    ours = LumenForCausalLM(cfg).eval()
    ours.load_state_dict(llama.state_dict(), strict=True)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    rows = [torch.randint(0, 101, (n,)) for n in ((10, 10) if not padded else (10, 6))]
    ids, mask = left_pad(rows)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = llama(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        got = ours(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    real = mask.bool()
    assert (got[real] - ref[real]).abs().max() <= ATOL


def test_hidden_states_match_transformers_llama():
    cfg = LumenConfig(vocab_size=101, hidden_dim=64, num_layers=3, num_heads=4, num_kv_heads=2, intermediate_dim=96)
    torch.manual_seed(0)
    llama = llama_twin(cfg)
    ours = LumenForCausalLM(cfg).eval()
    ours.load_state_dict(llama.state_dict(), strict=True)
    ids = torch.randint(0, 101, (2, 11))
    with torch.no_grad():
        ref = llama(input_ids=ids, output_hidden_states=True).hidden_states
        got = ours(input_ids=ids, output_hidden_states=True).hidden_states
    assert len(got) == len(ref) == cfg.num_layers + 1
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_weights_match_transformers_llama_eager(kv_heads, padded):
    """``output_attentions=True``: every layer's ``[B, H, T, T]`` weights equal Llama's eager ones."""
    cfg = LumenConfig(vocab_size=101, hidden_dim=64, num_layers=3, num_heads=4, num_kv_heads=kv_heads, intermediate_dim=96)
    torch.manual_seed(0)
    llama = llama_twin(cfg)
    ours = LumenForCausalLM(cfg).eval()
    ours.load_state_dict(llama.state_dict(), strict=True)
    ids, mask = left_pad([torch.randint(0, 101, (n,)) for n in ((11, 11) if not padded else (11, 7))])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = llama(input_ids=ids, attention_mask=mask, position_ids=pos, output_attentions=True).attentions
        got = ours(input_ids=ids, attention_mask=mask, position_ids=pos, output_attentions=True).attentions
    assert len(got) == len(ref) == cfg.num_layers
    real = mask.bool()  # rows of padded query positions are never read; compare the real ones
    for a, b in zip(got, ref, strict=True):
        assert a.shape == b.shape == (2, 4, 11, 11)
        assert (a.transpose(1, 2)[real] - b.transpose(1, 2)[real]).abs().max() <= ATOL


def test_generate_attentions_match_transformers_llama_eager():
    cfg = LumenConfig(vocab_size=101, hidden_dim=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_dim=96)
    torch.manual_seed(0)
    llama = llama_twin(cfg)
    ours = LumenForCausalLM(cfg).eval()
    ours.load_state_dict(llama.state_dict(), strict=True)
    ids = torch.randint(0, 101, (1, 7))
    kw = dict(max_new_tokens=5, min_new_tokens=5, do_sample=False, return_dict_in_generate=True, output_attentions=True)
    ref, got = llama.generate(ids, **kw), ours.generate(ids, **kw)
    assert torch.equal(got.sequences, ref.sequences)
    for step_got, step_ref in zip(got.attentions, ref.attentions, strict=True):
        for a, b in zip(step_got, step_ref, strict=True):
            assert a.shape == b.shape and (a - b).abs().max() <= ATOL


def seed_reference_logits(sd: dict, cfg: LumenConfig, ids: torch.Tensor) -> torch.Tensor:
    """The seed's maths written out independently: pre-norm MQA/GQA + RoPE + SwiGLU, tied head."""

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

    b, t = ids.shape
    h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.hidden_dim // cfg.num_heads
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2).float() / d))
    ang = torch.outer(torch.arange(t).float(), inv)
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(x):
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = sd["embed_tokens.weight"][ids]
    causal = torch.full((t, t), float("-inf")).triu(1)
    for i in range(cfg.num_layers):
        p = f"layers.{i}."
        a = rms(x, sd[p + "input_layernorm.weight"])
        q = (a @ sd[p + "attention.q_proj.weight"].T).view(b, t, h, d).transpose(1, 2)
        k = (a @ sd[p + "attention.k_proj.weight"].T).view(b, t, kvh, d).transpose(1, 2)
        v = (a @ sd[p + "attention.v_proj.weight"].T).view(b, t, kvh, d).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
        att = ((q @ k.transpose(-1, -2)) / d**0.5 + causal).softmax(-1) @ v
        x = x + att.transpose(1, 2).reshape(b, t, -1) @ sd[p + "attention.o_proj.weight"].T
        m = rms(x, sd[p + "post_attention_layernorm.weight"])
        g = torch.nn.functional.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)
        x = x + g @ sd[p + "mlp.down_proj.weight"].T
    return rms(x, sd["norm.weight"]) @ sd["embed_tokens.weight"].T


def test_seed_state_dict_converts_and_matches_seed_maths():
    cfg = LumenConfig(vocab_size=64, hidden_dim=32, num_layers=2, num_heads=4, num_kv_heads=1, intermediate_dim=40)
    g = torch.Generator().manual_seed(1)
    shapes = {"embed_tokens.weight": (64, 32), "norm.weight": (32,)}
    for i in range(2):
        p = f"layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (32,),
                p + "post_attention_layernorm.weight": (32,),
                p + "attention.q_proj.weight": (32, 32),
                p + "attention.k_proj.weight": (8, 32),
                p + "attention.v_proj.weight": (8, 32),
                p + "attention.o_proj.weight": (32, 32),
                p + "mlp.gate_proj.weight": (40, 32),
                p + "mlp.up_proj.weight": (40, 32),
                p + "mlp.down_proj.weight": (32, 40),
            }
        )
    sd = {k: torch.randn(s, generator=g) * 0.2 + (1.0 if k.endswith("norm.weight") else 0.0) for k, s in shapes.items()}
    sd["lm_head.weight"] = sd["embed_tokens.weight"]
    model = LumenForCausalLM(cfg).eval()
    model.load_state_dict(convert_seed_state_dict(sd), strict=True)
    ids = torch.randint(0, 64, (2, 9), generator=g)
    with torch.no_grad():
        got = model(input_ids=ids).logits
    ref = seed_reference_logits(sd, cfg, ids)
    assert (got - ref).abs().max() <= ATOL


def test_audit_prints_the_true_budget():
    rows = audit_parameters(LumenForCausalLM(LumenConfig()))
    assert rows["Total"] == 2_754_816
    assert rows["Unique (without embedding table)"] == 2_230_528
    assert rows["Tied embedding table"] == 2048 * 256
    assert rows["Final norm"] == 256
    assert rows["Decoder blocks"] + rows["Final norm"] + rows["Tied embedding table"] == rows["Total"]
