"""NanoHammer: the shared family suite in both modes, rotation maths, seed parity, cache, config."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from family_tester import ATOL, FamilyTester, decode_stepwise, left_pad
from slmlab.generation import generate
from slmlab.models.nanohammer import NanoHammerConfig, NanoHammerForCausalLM, audit_parameters, cache_nbytes
from slmlab.models.nanohammer.holographic import HolographicRotation, SeedHolographicMap

TINY = dict(
    vocab_size=61,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_state_heads=3,
    state_hidden_size=12,
    max_position_embeddings=96,
    bos_token_id=None,
    eos_token_id=None,
)
SEED_MODE = dict(rotation_style="seed", hidden_attends_self=False)


def hammer_attention_shapes(model, b, t, s):
    """Hidden queries over the interleaved state and hidden keys: ``[B, H, T, 2 S]`` per layer."""
    return [(b, model.config.num_attention_heads, t, 2 * s)] * model.config.num_hidden_layers


class TestNanoHammerFamily(FamilyTester):
    family = "nanohammer"
    config_kwargs = TINY
    draft_overrides = dict(num_hidden_layers=1)

    def attention_shapes(self, model, b, t, s):
        return hammer_attention_shapes(model, b, t, s)
    bad_configs = [
        (dict(state_hidden_size=10, num_state_heads=4), r"state_hidden_size \(10\) must be divisible by num_state_heads \(4\)"),
        (dict(state_hidden_size=9, num_state_heads=3), r"state_hidden_size \(9\) must be even"),
        (dict(state_hidden_size=8.5), "state_hidden_size must be a positive integer"),
        (dict(rotation_style="complex"), "rotation_style must be one of"),
        (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling=.* is not supported"),
        (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "divisible by num_key_value_heads"),
        (dict(vocab_size=0), "vocab_size must be a positive integer"),
    ]
    bad_inputs = [
        (
            dict(input_ids=torch.zeros(1, 4, dtype=torch.long), position_ids=torch.zeros(1, 3, dtype=torch.long)),
            ValueError,
            "position_ids must have shape",
        ),
    ]


class TestNanoHammerSeedModeFamily(FamilyTester):
    family = "nanohammer"
    config_kwargs = {**TINY, **SEED_MODE}
    draft_overrides = dict(num_hidden_layers=1)

    def attention_shapes(self, model, b, t, s):
        return hammer_attention_shapes(model, b, t, s)


def tiny_model(**overrides) -> NanoHammerForCausalLM:
    torch.manual_seed(0)
    return NanoHammerForCausalLM(NanoHammerConfig(**{**TINY, **overrides})).eval()


# -- rotation -------------------------------------------------------------------------------------


def test_rotation_is_a_rotation_with_exact_inverse_and_composes():
    rot = HolographicRotation(16)
    x = torch.randn(3, 7, 16)
    p = torch.randint(0, 5000, (3, 7))
    q = torch.randint(0, 5000, (3, 7))
    y = rot.rotate(x, p)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rot.unrotate(y, p), x, atol=1e-5, rtol=0)
    # pairwise norms are preserved too: each channel pair turns on its own circle
    torch.testing.assert_close(y.view(3, 7, 8, 2).norm(dim=-1), x.view(3, 7, 8, 2).norm(dim=-1), atol=1e-5, rtol=1e-5)
    p, q = p % 50, q % 50  # small angles keep fp32 composition exact to 1e-5
    torch.testing.assert_close(rot.rotate(x, p + q), rot.rotate(rot.rotate(x, p), q), atol=1e-5, rtol=0)


def test_rotation_matches_complex_multiplication():
    rot = HolographicRotation(10, base=100.0)
    x = torch.randn(2, 5, 10)
    p = torch.arange(5).expand(2, 5)
    theta = 100.0 ** (-torch.arange(0, 10, 2).float() / 10)
    ref = torch.view_as_real(torch.view_as_complex(x.view(2, 5, 5, 2)) * torch.polar(torch.ones(5), p[..., None] * theta))
    torch.testing.assert_close(rot.rotate(x, p), ref.flatten(-2), atol=1e-6, rtol=0)


def test_seed_map_reproduces_the_documented_defect():
    seed = SeedHolographicMap(64)
    x = torch.randn(4, 32, 64)
    p = torch.arange(32).expand(4, 32)
    ratio = seed.rotate(x, p).norm(dim=-1) / x.norm(dim=-1)
    assert (ratio - 1).abs().max() > 0.01  # not a rotation
    assert (seed.unrotate(seed.rotate(x, p), p) - x).abs().max() > 0.5  # and its "inverse" does not invert
    torch.testing.assert_close(seed.unrotate(x, p), seed.rotate(x, p))  # it is the very same map


def test_state_token_is_translation_invariant():
    """``R(-t) Σ_{i<=t} R(i) x_i`` built from inputs at ``i <= t`` depends on ``i - t`` only."""
    rot = HolographicRotation(12)
    x = torch.randn(2, 9, 12)

    def relative(offset):
        pos = (torch.arange(9) + offset).expand(2, 9)
        return rot.unrotate(rot.rotate(x, pos).cumsum(1), pos)

    base = relative(0)
    for offset in (1, 17, 300):
        torch.testing.assert_close(relative(offset), base, atol=1e-4, rtol=0)
    # and the model's state stream uses exactly this: shifting position_ids leaves layer-0 state tokens unchanged
    model = tiny_model()
    inner = model.model
    e = torch.randn(2, 9, 32)
    tokens = []
    for offset in (0, 40):
        pos = (torch.arange(9) + offset).expand(2, 9)
        c = inner.holographic_rope.rotate(inner.token_to_state(e), pos).cumsum(1)
        tokens.append(inner.layers[0].state_projection(inner.holographic_rope.unrotate(c, pos)))
    torch.testing.assert_close(tokens[0], tokens[1], atol=1e-4, rtol=0)


# -- decode == prefill, both modes ----------------------------------------------------------------


@pytest.mark.parametrize("mode", [{}, SEED_MODE], ids=["default", "seed"])
@pytest.mark.parametrize("padded", [False, True])
def test_decode_equals_prefill_many_steps(mode, padded):
    model = tiny_model(**mode)
    rows = [torch.randint(1, 61, (n,)) for n in ((30, 30) if not padded else (30, 19))]
    ids, mask = left_pad(rows)
    mask_arg = mask if padded else None
    full = model(input_ids=ids, attention_mask=mask_arg, use_cache=False).logits
    for prefill in (1, 3, 12):
        step = decode_stepwise(model, ids, mask_arg, prefill=prefill)
        real = mask.bool()
        assert (step[real] - full[real]).abs().max() <= ATOL


@pytest.mark.parametrize("mode", [{}, SEED_MODE], ids=["default", "seed"])
def test_chunked_prefill_equals_full(mode):
    model = tiny_model(**mode)
    rows = [torch.randint(1, 61, (n,)) for n in (24, 15)]
    ids, mask = left_pad(rows)
    full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    out, cache, parts = None, None, []
    for lo, hi in ((0, 7), (7, 8), (8, 17), (17, 24)):
        out = model(input_ids=ids[:, lo:hi], attention_mask=mask[:, :hi], cache=cache, use_cache=True)
        cache = out.cache
        parts.append(out.logits)
    got = torch.cat(parts, 1)
    assert (got[mask.bool()] - full[mask.bool()]).abs().max() <= ATOL


def test_causality_in_seed_mode_and_self_exclusion():
    model = tiny_model(**SEED_MODE)
    ids = torch.randint(1, 61, (2, 10))
    other = ids.clone()
    other[:, 6:] = torch.randint(1, 61, (2, 4))
    torch.testing.assert_close(model(input_ids=ids).logits[:, :6], model(input_ids=other).logits[:, :6], atol=ATOL, rtol=0)
    # the switch really changes the maths: with self-exclusion, logits differ from the default mode
    default = tiny_model()
    assert (default(input_ids=ids).logits - tiny_model(hidden_attends_self=False)(input_ids=ids).logits).abs().max() > 1e-3


def test_hf_generate_with_left_padding_matches_lean_loop():
    model = tiny_model()
    ids, mask = left_pad([torch.randint(1, 61, (n,)) for n in (7, 4)])
    ours = generate(model, ids, 6, attention_mask=mask)
    hf = model.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(ours, hf)


def test_beam_search_through_the_cache_equals_beam_search_without_it():
    model = tiny_model(**SEED_MODE, initializer_range=0.5)  # large weights: the state path moves the logits
    ids, mask = left_pad([torch.randint(1, 61, (n,)) for n in (7, 4)])
    kw = dict(attention_mask=mask, max_new_tokens=6, min_new_tokens=6, num_beams=3, do_sample=False, pad_token_id=0)
    assert torch.equal(model.generate(ids, **kw), model.generate(ids, use_cache=False, **kw))


# -- seed parity ----------------------------------------------------------------------------------


def seed_state_dict(cfg: NanoHammerConfig, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random state_dict under the seed module's parameter names (written out by hand)."""
    d, s, i, v = cfg.hidden_size, cfg.state_hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    shapes = {"model.embed_tokens.weight": (v, d), "model.token_to_state.weight": (s, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        shapes.update(
            {
                p + "state_cell.pre_norm.weight": (s,),
                p + "state_cell.mlp.0.weight": (4 * s, s),
                p + "state_cell.mlp.2.weight": (s, 4 * s),
                p + "state_cell.post_norm.weight": (s,),
                p + "state_cell.step_size": (cfg.num_state_heads,),
                p + "state_projection.state_to_hidden.weight": (d, s),
                p + "state_projection.norm.weight": (d,),
                p + "self_attn.q_proj.weight": (d, d),
                p + "self_attn.k_proj.weight": (kv, d),
                p + "self_attn.v_proj.weight": (kv, d),
                p + "self_attn.o_proj.weight": (d, d),
                p + "mlp.gate_proj.weight": (i, d),
                p + "mlp.up_proj.weight": (i, d),
                p + "mlp.down_proj.weight": (d, i),
                p + "input_layernorm.weight": (d,),
                p + "post_attention_layernorm.weight": (d,),
            }
        )
    sd = {}
    for k, shape in shapes.items():
        t = torch.randn(shape, generator=gen)
        sd[k] = 1.0 + 0.2 * t if k.endswith("norm.weight") else (0.1 + 0.05 * t if k.endswith("step_size") else 0.3 * t)
    sd["lm_head.weight"] = sd["lm_head.weight"] / 6  # logits of order 1, so 1e-5 is well above fp32 rounding
    return sd


def reference_logits(sd, cfg, ids, seed_rotation: bool, attends_self: bool) -> torch.Tensor:
    """The seed's maths written out independently: 2T tokens ``[state tokens, hidden tokens]``, 2T
    queries, the MLP on all 2T, then the state half thrown away."""
    b, t = ids.shape
    d, s, eps = cfg.hidden_size, cfg.state_hidden_size, cfg.rms_norm_eps
    h, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
    hd = d // h
    pos = torch.arange(t, dtype=torch.float32)
    freqs = pos[:, None] * (1.0 / (10000.0 ** (torch.arange(0, s, 2).float() / s)))

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    if seed_rotation:  # the seed's duplicated-frequency vector indexed with stride 2; its inverse is the same map
        cos, sin = torch.cat([freqs.cos()] * 2, -1), torch.cat([freqs.sin()] * 2, -1)

        def rot(x):
            a, c = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * cos[:, 0::2] - c * sin[:, 0::2], a * sin[:, 1::2] + c * cos[:, 1::2]], -1).flatten(-2)

        def unrot(x):
            ns = -sin
            a, c = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * cos[:, 0::2] + c * ns[:, 0::2], -a * ns[:, 1::2] + c * cos[:, 1::2]], -1).flatten(-2)

    else:

        def turn(x, sign):
            z = torch.view_as_complex(x.reshape(*x.shape[:-1], s // 2, 2).contiguous())
            return torch.view_as_real(z * torch.polar(torch.ones_like(freqs), sign * freqs)).flatten(-2)

        def rot(x):
            return turn(x, 1.0)

        def unrot(x):
            return turn(x, -1.0)

    ang = pos[:, None] * (1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd)))
    rc, rs = torch.cat([ang, ang], -1).cos().repeat(2, 1), torch.cat([ang, ang], -1).sin().repeat(2, 1)

    def rope(x):
        return x * rc + torch.cat([-x[..., hd // 2 :], x[..., : hd // 2]], -1) * rs

    mask = torch.full((2 * t, 2 * t), float("-inf"))
    for i in range(t):
        mask[i, : i + 1] = 0
        mask[t + i, : i + 1] = 0
        mask[t + i, t : t + i + (1 if attends_self else 0)] = 0

    e = sd["model.embed_tokens.weight"][ids]
    state = rot(e @ sd["model.token_to_state.weight"].T).cumsum(1)
    x = e
    for n in range(cfg.num_hidden_layers):
        p = f"model.layers.{n}."
        g = sd[p + "state_cell.step_size"].repeat_interleave(s // cfg.num_state_heads)
        delta = F.silu(rms(state, sd[p + "state_cell.pre_norm.weight"]) @ sd[p + "state_cell.mlp.0.weight"].T)
        state = rms(state + g * (delta @ sd[p + "state_cell.mlp.2.weight"].T), sd[p + "state_cell.post_norm.weight"])
        shifted = torch.cat([torch.zeros_like(state[:, :1]), state[:, :-1]], 1)
        z = rms(unrot(shifted) @ sd[p + "state_projection.state_to_hidden.weight"].T, sd[p + "state_projection.norm.weight"])
        comb = torch.cat([z, x], 1)
        a = rms(comb, sd[p + "input_layernorm.weight"])
        q = rope((a @ sd[p + "self_attn.q_proj.weight"].T).view(b, 2 * t, h, hd).transpose(1, 2))
        k = rope((a @ sd[p + "self_attn.k_proj.weight"].T).view(b, 2 * t, kvh, hd).transpose(1, 2))
        v = (a @ sd[p + "self_attn.v_proj.weight"].T).view(b, 2 * t, kvh, hd).transpose(1, 2)
        k, v = k.repeat_interleave(h // kvh, 1), v.repeat_interleave(h // kvh, 1)
        att = ((q @ k.transpose(-1, -2)) * hd**-0.5 + mask).softmax(-1) @ v
        comb = comb + att.transpose(1, 2).reshape(b, 2 * t, d) @ sd[p + "self_attn.o_proj.weight"].T
        m = rms(comb, sd[p + "post_attention_layernorm.weight"])
        gate = F.silu(m @ sd[p + "mlp.gate_proj.weight"].T) * (m @ sd[p + "mlp.up_proj.weight"].T)
        comb = comb + gate @ sd[p + "mlp.down_proj.weight"].T
        x = comb[:, t:]
    return rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


@pytest.mark.parametrize("state_size, state_heads", [(12, 3), (14, 7)])
@pytest.mark.parametrize("seed_mode", [True, False], ids=["seed-mode", "default-mode"])
def test_seed_state_dict_loads_and_matches_reference(state_size, state_heads, seed_mode):
    cfg = NanoHammerConfig(**{**TINY, "state_hidden_size": state_size, "num_state_heads": state_heads, **(SEED_MODE if seed_mode else {})})
    sd = seed_state_dict(cfg, torch.Generator().manual_seed(3))
    model = NanoHammerForCausalLM(cfg).eval()
    model.load_state_dict(sd, strict=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 11), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got = model(input_ids=ids).logits
    ref = reference_logits(sd, cfg, ids, seed_rotation=seed_mode, attends_self=not seed_mode)
    assert (got - ref).abs().max() <= ATOL


# -- cache, init, config --------------------------------------------------------------------------


def test_cache_holds_twice_a_plain_kv_cache_plus_constant_state():
    model = tiny_model()
    cfg = model.config
    t = 20
    cache = model(input_ids=torch.randint(1, 61, (1, t)), use_cache=True).cache
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # fp32 K and V
    constant = (cfg.num_hidden_layers + 1) * cfg.state_hidden_size * 4
    assert cache_nbytes(cache)["filled"] == 2 * kv_per_token * t + constant
    with pytest.raises(ValueError, match="cannot be cropped"):
        cache.crop(5)


def test_step_size_initialised_after_from_config_and_from_pretrained(tmp_path):
    cfg = NanoHammerConfig(**TINY)
    model = AutoModelForCausalLM.from_config(cfg)
    for layer in model.model.layers:
        assert torch.equal(layer.state_cell.step_size.data, torch.full((3,), 0.1))
        assert torch.equal(layer.state_cell.pre_norm.weight.data, torch.ones(12))
    with torch.no_grad():
        model.model.layers[0].state_cell.step_size.fill_(0.25)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(loaded.model.layers[0].state_cell.step_size.data, torch.full((3,), 0.25))


def test_seed_config_json_with_auto_map_and_float_state_size_loads(tmp_path):
    seed_cfg = {**TINY, "model_type": "nanohammer", "state_hidden_size": 8.0, "num_state_heads": 2, "rope_scaling": None}
    seed_cfg["auto_map"] = {
        "AutoConfig": "NanoHammerForCausalLM.NanoHammerConfig",
        "AutoModelForCausalLM": "NanoHammerForCausalLM.NanoHammerForCausalLM",
    }
    (tmp_path / "config.json").write_text(json.dumps(seed_cfg))
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(cfg, NanoHammerConfig)
    assert cfg.state_hidden_size == 8 and isinstance(cfg.state_hidden_size, int)
    assert cfg.to_dict()["auto_map"] == seed_cfg["auto_map"]  # kept: a re-saved remote-code folder still loads


def test_config_defaults_follow_the_seed():
    cfg = NanoHammerConfig()
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (128256, 2048, 8192, 24)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_state_heads) == (32, 8, 32)
    assert cfg.state_hidden_size == 512 and isinstance(cfg.state_hidden_size, int)
    assert (cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.rope_theta) == (131072, 1e-5, 10000.0)
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.tie_word_embeddings) == (128000, 128009, None, False)
    assert cfg.rotation_style == "rotation" and cfg.hidden_attends_self


def test_audit_counts_every_parameter_once():
    model = tiny_model(tie_word_embeddings=True)
    rows = audit_parameters(model)
    assert rows["Tied embedding table"] == model.model.embed_tokens.weight.numel() and "LM head (untied)" not in rows
    assert sum(v for k, v in rows.items() if k != "Total") == rows["Total"] == sum(p.numel() for p in model.parameters())


def test_seed_special_ids_are_dropped_only_where_the_vocabulary_cannot_hold_them(recwarn):
    seed = NanoHammerConfig()
    assert (seed.bos_token_id, seed.eos_token_id) == (128000, 128009)
    small = NanoHammerConfig(vocab_size=2048)
    assert (small.bos_token_id, small.eos_token_id) == (None, None)
    assert not [w for w in recwarn if "token_id" in str(w.message)]
    explicit = NanoHammerConfig(vocab_size=2048, bos_token_id=1, eos_token_id=2)
    assert (explicit.bos_token_id, explicit.eos_token_id) == (1, 2)
